"""`mokka bench cluster`: how fast the local cluster comes up and how much a GPU allocation costs a pod.

- ``cluster up`` with every binary cached (warm) → node Ready, and → device plugin + GFD done;
  ``down`` time. Target: node Ready <= 30 s.
- pod created → Running, a pod asking for 2 GPUs against one asking for none, interleaved on
  one cluster (each pod runs ``sleep``; deleted before the next). Target: median ratio <= 1.2.

With nodes (``mokka bench cluster --node ...``), the fleet instead: warm ``up`` → every node Ready
for fleets of 1, 2, 3 and 4 nodes (the specs given, cycled), and the memory each node adds (the RSS
of its own processes: namespace holder, containerd, kubelet, NRI plugin, device plugin), beside the
control plane's. Targets: 3 nodes Ready <= 45 s, a node <= 400 MiB.

Figures are printed with their targets; a missed target is marked MISSED. Nothing asserts on them.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localcluster.cluster import Cluster, ClusterError, Options
from localcluster.images import WORKLOAD_IMAGE
from localcluster.nodespec import NodeSpec

TARGET_READY_S = 30.0
TARGET_POD_RATIO = 1.2
TARGET_FLEET3_READY_S = 45.0
TARGET_NODE_MIB = 400.0
FLEET_SIZES = (1, 2, 3, 4)
POLL = 0.02


def _row(name: str, value: float, target: str = "", missed: bool = False, unit: str = "s") -> None:
    mark = "  MISSED" if missed else ""
    print(f"{name:<46}{value:>10.2f} {unit:<3}{target:>16}{mark}", flush=True)


def pod_manifest(name: str, gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


def time_to_running(c: Cluster, name: str, gpus: int, timeout: float = 120) -> float:
    """Seconds from the create call's start until the API server reports the pod Running."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

    core = client.CoreV1Api(c.api())
    t0 = time.monotonic()
    core.create_namespaced_pod("default", pod_manifest(name, gpus))
    while True:
        phase = core.read_namespaced_pod_status(name, "default").status.phase
        if phase == "Running":
            took = time.monotonic() - t0
            break
        if phase in ("Failed", "Succeeded") or time.monotonic() - t0 > timeout:
            raise ClusterError(f"pod {name}: {phase} after {time.monotonic() - t0:.0f}s")
        time.sleep(POLL)
    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    while True:
        try:
            core.read_namespaced_pod(name, "default")
        except client.ApiException as exc:
            if exc.status == 404:
                break
            raise
        time.sleep(0.1)
    return took


def run(profile: str, ups: int, pods: int) -> None:
    ready: list[float] = []
    full: list[float] = []
    downs: list[float] = []
    with tempfile.TemporaryDirectory(prefix="mokka-bench-cluster-") as tmp:
        # The first `up` builds or fetches whatever the cache lacks: it is not timed.
        c = Cluster.up(Options(base=Path(tmp) / "c0", profile=profile), progress=lambda s: None)
        try:
            with_gpus: list[float] = []
            without: list[float] = []
            for i in range(pods):
                without.append(time_to_running(c, f"bench-nogpu-{i}", 0))
                with_gpus.append(time_to_running(c, f"bench-gpu-{i}", 2))
        finally:
            c.down()
        for i in range(ups):
            t0 = time.monotonic()
            c = Cluster.up(Options(base=Path(tmp) / f"c{i + 1}", profile=profile), progress=lambda s: None)
            full.append(time.monotonic() - t0)
            ready.append(c.state.timings["node Ready"])
            t0 = time.monotonic()
            problems = c.down()
            downs.append(time.monotonic() - t0)
            if problems:
                raise ClusterError("; ".join(problems))
    print(f"{'figure':<46}{'median':>10}    {'target':>16}", flush=True)
    ready_med = statistics.median(ready)
    _row(f"cluster up (warm) -> node Ready, {ups} runs", ready_med, "<= 30 s", ready_med > TARGET_READY_S)
    _row("  slowest run", max(ready))
    _row("cluster up (warm) -> GPUs allocatable + GFD", statistics.median(full))
    _row("cluster down", statistics.median(downs))
    gpu_med, none_med = statistics.median(with_gpus), statistics.median(without)
    ratio = gpu_med / none_med
    _row(f"pod with 2 GPUs: create -> Running, {pods} pods", gpu_med)
    _row(f"pod without GPUs: create -> Running, {pods} pods", none_med)
    _row("  ratio (2 GPUs / none)", ratio, "<= 1.2", ratio > TARGET_POD_RATIO, unit="")
    spread = f"{min(with_gpus):.2f}-{max(with_gpus):.2f} s vs {min(without):.2f}-{max(without):.2f} s"
    print(f"{'  spread (min-max)':<46}{spread:>10}", flush=True)


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def memory(c: Cluster) -> tuple[float, list[float]]:
    """MiB of RSS: the control plane's processes, and each node's own."""
    procs = c.procs
    control = sum(_rss_mib(p.pid) for p in procs if "@" not in p.name and p.alive())
    nodes = [sum(_rss_mib(p.pid) for p in procs if p.name.endswith(f"@{n.name}") and p.alive()) for n in c.nodes]
    return control, nodes


def run_fleet(specs: Sequence[NodeSpec], ups: int) -> None:
    ready: dict[int, list[float]] = {}
    full: dict[int, list[float]] = {}
    per_node: list[float] = []
    control: list[float] = []
    with tempfile.TemporaryDirectory(prefix="mokka-bench-fleet-") as tmp:
        # The first `up` builds or fetches whatever the cache lacks: it is not timed.
        Cluster.up(Options(base=Path(tmp) / "warm", nodes=tuple(specs[:1])), progress=lambda s: None).down()
        for size in FLEET_SIZES:
            fleet = tuple(itertools.islice(itertools.cycle(specs), size))
            for i in range(ups):
                t0 = time.monotonic()
                c = Cluster.up(Options(base=Path(tmp) / f"f{size}-{i}", nodes=fleet), progress=lambda s: None)
                full.setdefault(size, []).append(time.monotonic() - t0)
                ready.setdefault(size, []).append(c.state.timings["node Ready"])
                if size == FLEET_SIZES[-1]:
                    time.sleep(2)  # the plugins' start-up allocations settle
                    cp, nodes = memory(c)
                    control.append(cp)
                    per_node += nodes
                if problems := c.down():
                    raise ClusterError("; ".join(problems))
    print(f"{'figure':<46}{'median':>10}    {'target':>16}", flush=True)
    for size in FLEET_SIZES:
        med = statistics.median(ready[size])
        target, missed = ("<= 45 s", med > TARGET_FLEET3_READY_S) if size == 3 else ("", False)
        _row(f"{size} node(s): cluster up (warm) -> all Ready, {ups} runs", med, target, missed)
        _row(f"{size} node(s): -> GPUs allocatable + GFD", statistics.median(full[size]))
    node_mib = statistics.median(per_node)
    _row(f"RSS per node ({FLEET_SIZES[-1]}-node fleets)", node_mib, "<= 400 MiB", node_mib > TARGET_NODE_MIB, "MiB")
    _row("  largest node", max(per_node), unit="MiB")
    _row("RSS of the control plane", statistics.median(control), unit="MiB")
    print(f"{'  nodes':<46}{', '.join(str(s) for s in specs):>10}", flush=True)
