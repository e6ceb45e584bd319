"""`mokka bench cluster --virtual N`: a fleet of N virtual GPU nodes (:mod:`virtualfleet.pool`) beside one
real node, and — where fake-gpu-operator's binaries are found (``MOKKA_FGO_DIR``, else the checkout's
``../shared/thirdparty/fake-gpu-operator``) — the same N
served by FGO, side by side in the same run, each in a cluster of its own:

- ``up`` → N nodes Ready with their GPUs (the step of ``up`` that makes them; all of ``up`` too);
- RSS of kube-apiserver, etcd, kwok (and FGO's processes) with the N nodes up;
- scheduling throughput: a Deployment of ``--pods`` one-GPU pods over the N nodes, create → every
  pod bound (pods/s) and → every pod Running, once the cluster has been left ``settle`` seconds
  after its nodes are Ready (right after ``up`` the machine still works off the burst of N nodes made
  and readied: KWOK's first heartbeats, the node controller, the fleet controller; a side that came
  up later would otherwise schedule on a quieter machine).

Targets (2 cores): 1000 virtual nodes Ready <= 60 s; no process per node (kwok is one). Figures are
printed with their targets, a missed one marked MISSED; nothing asserts on them.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import gpu_pods
from bench.cluster import _row, _rss_mib
from fetch import thirdparty
from localcluster.addons.fgo import ENV_DIR, FGO_POOL_LABEL, FgoSpec, source_dir
from localcluster.cluster import Cluster, ClusterError, Options
from virtualfleet.pool import VIRTUAL_LABEL, VirtualSpec

TARGET_1000_READY_S = 60.0


def _rss(c: Cluster, names: tuple[str, ...]) -> dict[str, float]:
    return {n: _rss_mib(p.pid) for n in names if (p := c.proc(n)) is not None and p.alive()}


def _one(options: Options, selector: dict[str, str], pods: int, settle: float) -> dict[str, Any]:
    t0 = time.monotonic()
    c = Cluster.up(options, progress=lambda s: None)
    try:
        up = time.monotonic() - t0
        # the step that made them and waited for every one Ready: the fleet controller's, or FGO's
        step = next(v for k, v in c.state.timings.items() if ("Ready with their GPUs" in k, "fake-gpu-operator" in k)
                    == (not options.fgo, bool(options.fgo)))  # fmt: skip
        rss = _rss(c, ("kube-apiserver", "etcd", "kwok", "fgo-status-updater", "fgo-kwok-gpu-device-plugin",
                       "fgo-status-exporter-kwok"))  # fmt: skip
        time.sleep(settle)
        bound, running = gpu_pods.schedule(c.api(), selector, pods)
        return {"up": up, "ready": step, "rss": rss, "bound": bound, "running": running}
    finally:
        if problems := c.down():
            raise ClusterError("; ".join(problems))


def _fgo_found() -> bool:
    """Whether FGO's binaries are here: $MOKKA_FGO_DIR, else the checkout's ../shared copy (then
    named to the cluster through that variable, as a user would)."""
    if source_dir() is not None:
        return True
    shared = thirdparty.directory(ENV_DIR, "fake-gpu-operator")
    if shared is not None:
        os.environ[ENV_DIR] = str(shared)
    return shared is not None


def run(profile: str, count: int, pods: int, svg: Path | None = None, settle: float = 60.0) -> None:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mokka-bench-virtual-") as tmp:
        # The first `up` builds or fetches whatever the cache lacks: it is not timed.
        Cluster.up(Options(base=Path(tmp) / "warm", profile=profile), progress=lambda s: None).down()
        spec = VirtualSpec(profile, None, count)
        opts = Options(base=Path(tmp) / "mokka", profile=profile, virtual=(spec,))
        results["mokka"] = _one(opts, {VIRTUAL_LABEL: "true"}, pods, settle)
        if _fgo_found():
            fgo_spec = FgoSpec("bench", profile, count)
            opts = Options(base=Path(tmp) / "fgo", profile=profile, fgo=(fgo_spec,))
            results["fgo"] = _one(opts, {FGO_POOL_LABEL: "bench"}, pods, settle)
    print(f"pods scheduled {settle:g} s after each side's nodes were Ready (--settle)", flush=True)
    print(f"{'figure':<46}{'median':>10}    {'target':>16}", flush=True)
    for who, r in results.items():
        label = "Mokka virtual" if who == "mokka" else "fake-gpu-operator"
        missed = count >= 1000 and r["ready"] > TARGET_1000_READY_S * count / 1000
        target = f"<= {TARGET_1000_READY_S * count / 1000:.0f} s" if count >= 1000 else ""
        _row(f"{label}: {count} nodes Ready with GPUs", r["ready"], target, missed)
        _row(f"{label}: cluster up in all", r["up"])
        for name, mib in r["rss"].items():
            _row(f"{label}: RSS {name}", mib, unit="MiB")
        _row(f"{label}: {pods} one-GPU pods bound", r["bound"])
        _row(f"{label}:   scheduling throughput", pods / r["bound"], unit="p/s")
        _row(f"{label}: {pods} pods Running", r["running"])
    if "fgo" in results:
        m, f = results["mokka"], results["fgo"]
        _row("ratio Ready (Mokka / FGO)", m["ready"] / f["ready"], unit="")
        _row("ratio pods Running (Mokka / FGO)", m["running"] / f["running"], unit="")
    else:
        print("fake-gpu-operator: not compared (set MOKKA_FGO_DIR to its binaries)", flush=True)
    if svg is not None:
        from bench import plot

        labels = {"mokka": "Mokka virtual", "fgo": "fake-gpu-operator"}
        times = {
            f"{count} nodes Ready": {labels[w]: r["ready"] for w, r in results.items()},
            f"{pods} pods Running": {labels[w]: r["running"] for w, r in results.items()},
        }
        print(f"plot: {plot.bars(svg / 'virtual-nodes.svg', f'{count} virtual nodes of {profile}', 's', times)}")
