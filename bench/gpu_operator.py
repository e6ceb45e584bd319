"""`mokka bench gpu-operator [--virtual N ...]`: NVIDIA's GPU Operator (:mod:`localcluster.addons.gpu_operator`)
on one real node and N virtual ones (default N = 0, 100, 1000), each N in a cluster of its own:

- ``helm install`` → every operand DaemonSet Ready (N virtual nodes' pods run by KWOK) and the
  ClusterPolicy ``ready`` with reason ``Reconciled``;
- the operator's CPU seconds until then and its RSS, then its CPU share over a quiet minute (its
  reconcile loop and the node watch as the fleet stands);
- the API server's RSS beside it.

Nothing asserts on the figures; the issue that asked for them set no target.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.cluster import _row, _rss_mib
from localcluster.addons.gpu_operator.install import INSTALL_TO_READY
from localcluster.cluster import Cluster, ClusterError, Options
from virtualfleet.pool import VirtualSpec

COUNTS = (0, 100, 1000)
QUIET_S = 60.0


def operator_pid() -> int | None:
    """The operator's process (its pod's ``gpu-operator --leader-elect ...``)."""
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv and Path(argv[0]).name == "gpu-operator" and "--leader-elect" in argv:
            return int(proc.pid)
    return None


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def one(base: Path, profile: str, count: int) -> dict[str, Any]:
    virtual = (VirtualSpec(profile, None, count),) if count else ()
    c = Cluster.up(Options(base=base, profile=profile, gpu_operator=True, virtual=virtual), progress=lambda s: None)
    try:
        pid = operator_pid()
        if pid is None:
            raise ClusterError("the operator's process is not found")
        out: dict[str, Any] = {
            "ready": c.state.timings[INSTALL_TO_READY],
            "cpu": cpu_seconds(pid),
            "rss": _rss_mib(pid),
            "apiserver": _rss_mib(p.pid) if (p := c.proc("kube-apiserver")) else 0.0,
        }
        before = cpu_seconds(pid)
        time.sleep(QUIET_S)
        out["quiet"] = 100 * (cpu_seconds(pid) - before) / QUIET_S
        out["rss_quiet"] = _rss_mib(pid)
        return out
    finally:
        if problems := c.down():
            raise ClusterError("; ".join(problems))


def run(profile: str, counts: tuple[int, ...] = COUNTS) -> None:
    with tempfile.TemporaryDirectory(prefix="mokka-bench-gpu-operator-") as tmp:
        # The first `up` builds or fetches whatever the cache lacks: it is not timed.
        Cluster.up(Options(base=Path(tmp) / "warm", profile=profile), progress=lambda s: None).down()
        results = {n: one(Path(tmp) / f"n{n}", profile, n) for n in counts}
    print(f"{'figure':<46}{'value':>10}", flush=True)
    for n, r in results.items():
        label = f"{n} virtual node(s):"
        _row(f"{label} install -> policy ready", r["ready"])
        _row(f"{label} operator CPU until then", r["cpu"])
        _row(f"{label} operator RSS then", r["rss"], unit="MiB")
        _row(f"{label} operator CPU over {QUIET_S:.0f} s after", r["quiet"], unit="%")
        _row(f"{label} operator RSS after", r["rss_quiet"], unit="MiB")
        _row(f"{label} kube-apiserver RSS", r["apiserver"], unit="MiB")
