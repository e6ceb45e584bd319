"""`mokka bench nri`: the NRI plugin on a private containerd, side by side with no plugin.

Per containerd version (1.7 and 2.1 by default), on a tmpfs:

* interleaved rounds of CRI CreateContainer: no plugin; the same edits applied by containerd
  from the CDI spec (no plugin: what applying them costs containerd); the plugin (started for
  the round, under its supervisor, measured once warm); optionally an earlier implementation
  (``--previous CHECKOUT``: ``mokka nri-plugin`` of another checkout, with its .venv); upstream
  Mokka's Go plugin (``--peer DIR``: ``bench.nri_peer``), plainly and with its device opt-in
* containerd's own CPU time per container (create and remove) on every side
* the plugin's CPU time per container, its own handling time (median, p99), its RSS and that
  of its supervisor, and the start of a fresh process until registered
* a killed and a stopped plugin process: how long until a replacement has registered
* Synchronize with ``--sync-containers`` containers on the node (created, not started)
* re-registration after containerd restarts
* ``--chaos``: random SIGKILL/SIGSTOP of the plugin during ``--chaos-creates`` creates: failed
  creates, creates without injection, and how many of those the plugin's measured absence explains
* ``--py-spy DIR``: a profile of the plugin (py-spy, sampling) during one more round of creates

Every figure is printed next to its target; a missed target says MISSED. Tests never time it.

One file, though long: it is one benchmark run, whose rounds share one private containerd per
version, one tmpfs and one report.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench import nri_peer
from containers import images, sandbox
from containers.plugin_process import PluginProcess
from fetch import debcache
from gpumodel.edits import SHIM_IN_CONTAINER

TARGETS = {
    "cpu_ms": 0.5,
    "added_ms": 0.5,
    "handling_p99_ms": 1.0,
    "rss_mib": 20.0,
    "start_ms": 50.0,
    "back_ms": 50.0,
    "sync_ms": 50.0,
    "reregister_s": 0.5,
}
INJECTED = SHIM_IN_CONTAINER  # the destination of a mount the plugin adds


@dataclass
class Figures:
    version: str = ""
    server: str = ""
    creates: dict[str, list[float]] = field(default_factory=dict)  # side -> seconds per create
    round_medians: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms: list[float] = field(default_factory=list)  # per plugin round: CPU ms per container
    supervisor_cpu_ms: list[float] = field(default_factory=list)
    handling_median_ms: list[float] = field(default_factory=list)
    handling_p99_ms: list[float] = field(default_factory=list)
    rss_mib: float = 0.0
    supervisor_rss_mib: float = 0.0
    uss_mib: float = 0.0  # the plugin process's own memory, not shared with its supervisor
    previous_cpu_ms: list[float] = field(default_factory=list)
    previous_rss_mib: float = 0.0
    peer_cpu_ms: dict[str, list[float]] = field(default_factory=dict)  # side -> per round
    peer_rss_mib: float = 0.0
    containerd_cpu_ms: dict[str, list[float]] = field(default_factory=dict)  # side -> per round, per container
    background_pods: int = 0  # pods with a container each, on the node throughout
    pod_containers: int = 0  # containers each side's own pod holds throughout, made through that side
    start_ms: list[float] = field(default_factory=list)  # process spawned -> registered and synchronized
    python_ms: list[float] = field(default_factory=list)  # `python -c pass`: the interpreter's own start
    python_bare_ms: list[float] = field(default_factory=list)  # `python -S -c pass`: without site
    warm_ms: list[float] = field(default_factory=list)  # ... -> warmed up
    back_ms: dict[str, list[float]] = field(default_factory=dict)  # SIGKILL/SIGSTOP -> a replacement ready
    sync_containers: int = 0
    sync_ms: list[float] = field(default_factory=list)  # plugin side: whole request -> answered
    sync_receive_ms: list[float] = field(default_factory=list)  # first byte -> whole request
    sync_wait_ms: list[float] = field(default_factory=list)  # registered -> synchronized (mostly containerd)
    sync_start_ms: list[float] = field(default_factory=list)  # fresh process -> ready, with those containers
    sync_bytes: int = 0
    reregister_s: list[float] = field(default_factory=list)
    chaos: dict[str, float] = field(default_factory=dict)
    profile: list[str] = field(default_factory=list)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _median_ms(f: Figures, side: str) -> float:
    """The median CreateContainer of ``side`` (ms)."""
    return _median(f.creates.get(side, [])) * 1000


def _added_ms(f: Figures, side: str) -> float:
    """What ``side`` adds to CreateContainer over no plugin, median against median (ms)."""
    return _median_ms(f, side) - _median_ms(f, "no plugin")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _cpu_seconds(pid: int) -> float:
    """CPU seconds a live process has run so far, all its live threads (0 once gone).

    From each thread's /proc/PID/task/TID/schedstat (nanoseconds): /proc/PID/stat counts clock
    ticks of 10 ms, too coarse for a fraction of a millisecond per container, and
    /proc/PID/schedstat is the main thread's alone (a Go program, containerd or the peer, works
    on others)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _settle(pid: int, quiet: float = 0.1, timeout: float = 10) -> None:
    """Wait until process ``pid`` stops using CPU (the supervisor warming its template up)."""
    deadline = time.monotonic() + timeout
    before = _cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = _cpu_seconds(pid)
        if now - before < quiet / 20:
            return
        before = now


def _memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, USS) in MiB: resident, and resident and private to the process."""
    rss = uss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == "Rss":
                rss = int(rest.split()[0])
            elif key in ("Private_Clean", "Private_Dirty"):
                uss += int(rest.split()[0])
    except OSError:
        pass
    return rss / 1024, uss / 1024


@dataclass(frozen=True)
class Settings:
    """What `mokka bench nri` is asked to measure (its options, by the same names)."""

    rounds: int = 5
    per_round: int = 100  # --creates
    restarts: int = 10
    kills: int = 5
    sync_containers: int = 500
    background_pods: int = 0
    pod_containers: int = 0
    chaos: bool = False
    chaos_creates: int = 200
    seed: int | None = None
    previous: str | None = None
    peer: Path | None = None  # the user's directory holding upstream's Go plugin
    py_spy: Path | None = None
    svg: Path | None = None


def run(versions: list[str], settings: Settings) -> list[Figures]:
    _compile_bytecode(Path(__file__).resolve().parent.parent, *([Path(settings.previous)] if settings.previous else []))
    load_before = os.getloadavg()
    peer = nri_peer.binary(settings.peer, debcache.default_cache()) if settings.peer is not None else None
    results = [_one_version(version, settings, peer, random.Random(settings.seed)) for version in versions]
    _report(results, settings, load_before, os.getloadavg())
    if settings.svg is not None:
        for path in _plots(results, settings.svg):
            print(f"plot: {path}")
    return results


def _plots(results: list[Figures], out: Path) -> list[Path]:
    """The figures beside their peers' as SVGs in ``out``: added latency, CPU and RSS per plugin,
    containerd's own CPU per side; one group per containerd version."""
    from bench import plot

    def per_version(values: Callable[[Figures], dict[str, float]]) -> dict[str, dict[str, float]]:
        return {f"containerd {f.version}": values(f) for f in results}

    sides = {"CDI edits, no plugin": "CDI, no plugin", "plugin": "Mokka", "plugin --cdi-devices": "Mokka, CDI refs"}
    sides |= {"Go peer": "Go peer", "Go peer, device opt-in": "Go peer + devices"}
    made = [
        plot.bars(
            out / "nri-added-latency.svg",
            "CreateContainer: added over no plugin, median",
            "ms",
            per_version(lambda f: {label: _added_ms(f, s) for s, label in sides.items() if s in f.creates}),
        ),
        plot.bars(
            out / "nri-plugin-cpu.svg",
            "The plugin's CPU per container",
            "ms",
            per_version(
                lambda f: {
                    "Mokka": _median(f.cpu_ms),
                    **{sides[s]: _median(v) for s, v in f.peer_cpu_ms.items()},
                }
            ),
        ),
        plot.bars(
            out / "nri-containerd-cpu.svg",
            "containerd's own CPU per container (create and remove)",
            "ms",
            per_version(
                lambda f: {
                    sides.get(s, s): _median(v) for s, v in f.containerd_cpu_ms.items() if s != "plugin, opted-out pod"
                }
            ),
        ),
        plot.bars(
            out / "nri-plugin-rss.svg",
            "The plugin process's resident memory",
            "MiB",
            per_version(lambda f: {"Mokka": f.rss_mib, **({"Go peer": f.peer_rss_mib} if f.peer_rss_mib else {})}),
        ),
    ]
    return made


def _compile_bytecode(*checkouts: Path) -> None:
    """Compile the plugin's modules as installing the package does: with PYTHONDONTWRITEBYTECODE
    set (as in some shells here) a checkout's modules would be compiled again by every plugin
    process that starts, which an installed plugin never pays."""
    import compileall

    for checkout in checkouts:
        for package in ("nri_mokka", "gpumodel", "mokka"):
            if (checkout / package).is_dir():
                compileall.compile_dir(str(checkout / package), quiet=1)


def _one_version(version: str, settings: Settings, peer: Path | None, rng: random.Random) -> Figures:
    """The figures on containerd ``version``; ``peer``: upstream's Go plugin, unpacked."""
    rounds, per_round, restarts, kills = settings.rounds, settings.per_round, settings.restarts, settings.kills
    chaos, chaos_creates, previous, py_spy = settings.chaos, settings.chaos_creates, settings.previous, settings.py_spy
    sync_containers, background_pods = settings.sync_containers, settings.background_pods
    pod_containers = settings.pod_containers
    import cdi
    from gpumodel.profile import load
    from hostsetup import node

    fig = Figures(version=version)
    shm = Path("/dev/shm")
    tmp = Path(tempfile.mkdtemp(prefix="mkb-", dir=shm if shm.is_dir() else None))  # tmpfs steadies the disk
    try:
        root = tmp / "root"
        node.apply(node.plan(load("h100"), node.Options(root=root)))
        from gpumodel.nodelayout import NodeLayout

        layout = NodeLayout.load(root)
        cdi_dir = tmp / "cdi"
        cdi.write(cdi.render(layout), cdi_dir)
        box = sandbox.Sandbox(tmp / "sb", version, nri=True, cdi_dirs=[cdi_dir])
        plugin_log = (tmp / "plugin.log").open("ab")
        with box:
            fig.server = box.server_version
            rootfs = images.make_rootfs(tmp / "rootfs")
            box.import_image(images.oci_archive(rootfs, tmp / "img.tar", images.WORKLOAD_IMAGE))
            pod = box.run_pod("bench")

            annotations: dict[str, dict[str, str]] = {pod: {}}  # of each pod a side creates in
            opted_out = box.run_pod("bench-opted-out", annotations={"mokka.io/inject": "false"})
            annotations[opted_out] = {"mokka.io/inject": "false"}
            # --background-pods: a node running workloads. containerd 2.1's create slows with the pods
            # on the node (4.1 ms on an empty node, 7.7 ms beside 100 pods, here); a plugin's share does not.
            background = [box.run_pod(f"bg{i}") for i in range(background_pods)]
            for bg in background:
                box.create_container(bg, images.WORKLOAD_IMAGE, ["sleep", "1"])
            fig.background_pods = background_pods
            peer_devices = box.run_pod("bench-peer-devices", annotations={nri_peer.DEVICES_ANNOTATION: "true"})
            annotations[peer_devices] = {nri_peer.DEVICES_ANNOTATION: "true"}
            overlay = tmp / "nvml-mock"
            if peer is not None:
                nri_peer.stage_overlay(layout, overlay)

            def create(in_pod: str = pod, **kw: object) -> float:
                t = time.perf_counter()
                cid = box.create_container(in_pod, images.WORKLOAD_IMAGE, ["sleep", "1"], **kw)  # type: ignore[arg-type]
                took = time.perf_counter() - t
                box.remove_container(cid)
                return took

            def start_plugin(*args: str) -> PluginProcess:
                proc = PluginProcess(box.nri_socket, root, plugin_log, args=args)
                body = proc.wait_ready_after(0)
                fig.start_ms.append((float(body["ready_at"]) - proc.spawned_at) * 1000)  # type: ignore[arg-type]
                while not proc.status()[1].get("warm"):
                    time.sleep(0.005)
                fig.warm_ms.append((time.monotonic() - proc.spawned_at) * 1000)
                _settle(proc.pid)  # the supervisor warms its own copy up once the plugin registered
                return proc

            def start_previous() -> PluginProcess:
                assert previous is not None
                checkout = Path(previous)
                venv = checkout / ".venv" / "bin" / "python"
                python = str(venv) if venv.exists() else sys.executable  # its packages first: cwd
                command = [python, "-m", "mokka.cli", "nri-plugin"]
                proc = PluginProcess(box.nri_socket, root, plugin_log, command=command, cwd=checkout)
                proc.wait_registered()
                time.sleep(0.5)  # its warm-up
                return proc

            # (name, the pod it creates in, CRI CDI devices, plugin arguments: None for no plugin)
            gpus = ["nvidia.com/gpu=all"]
            sides: list[tuple[str, str, list[str], tuple[str, ...] | None]] = [
                ("no plugin", pod, [], None),
                ("CDI edits, no plugin", pod, gpus, None),
                ("plugin", pod, [], ()),
                ("plugin, opted-out pod", opted_out, [], ()),
            ]
            if version != "1.7":  # NRI >= 0.7 takes CDI device references
                sides.append(("plugin --cdi-devices", pod, [], ("--cdi-devices",)))
            if previous:
                sides.append(("previous plugin", pod, [], ("previous",)))
            if peer is not None:
                sides.append(("Go peer", pod, [], ("peer",)))
                sides.append(("Go peer, device opt-in", peer_devices, [], ("peer",)))

            def start_peer() -> nri_peer.Peer:
                assert peer is not None
                running = nri_peer.Peer(peer, box.nri_socket, overlay, plugin_log)

                def env_of_a_new_container() -> list[str]:
                    cid = box.create_container(pod, images.WORKLOAD_IMAGE, ["sleep", "1"])
                    env = box.container_info(cid)["runtimeSpec"].get("process", {}).get("env", [])
                    box.remove_container(cid)
                    return list(env)

                running.wait_injecting(env_of_a_new_container)
                return running

            def start_side(args: tuple[str, ...] | None) -> PluginProcess | nri_peer.Peer | None:
                if args == ("peer",):
                    return start_peer()
                if args == ("previous",):
                    return start_previous()
                return start_plugin(*args) if args is not None else None

            create()  # the first create of a pod pays extra: not measured
            create(opted_out)
            create(peer_devices)
            fig.pod_containers = pod_containers
            if pod_containers:
                # A busy GPU pod: each side creates into a pod of its own that already holds this
                # many containers made through the same side. containerd 2.1 decodes the spec of
                # every container in the pod at each create, so their size is part of its cost.
                for i, (name, of, cdi_devices, args) in enumerate(sides):
                    busy = box.run_pod(f"busy-{i}", annotations=annotations[of])
                    print(f"{version}: {pod_containers} containers into a pod of {name}'s", flush=True)
                    running = start_side(args)
                    for _ in range(pod_containers):
                        box.create_container(busy, images.WORKLOAD_IMAGE, ["sleep", "1"], cdi_devices=cdi_devices)
                    if running is not None:
                        running.stop()
                    sides[i] = (name, busy, cdi_devices, args)
            for r in range(rounds):
                order = sides[r % len(sides) :] + sides[: r % len(sides)]
                print(f"{version} round {r + 1}/{rounds}: {per_round} creates per side", flush=True)
                for name, of, cdi_devices, args in order:
                    running = start_side(args)
                    go = running if isinstance(running, nri_peer.Peer) else None
                    proc = running if isinstance(running, PluginProcess) else None
                    if go is not None:
                        cpu0 = _cpu_seconds(go.pid)
                    elif proc is not None and args == ("previous",):
                        cpu0 = _cpu_seconds(proc.pid)
                    elif proc is not None:
                        child = proc.plugin_pid()
                        cpu0, sup0 = _cpu_seconds(child), _cpu_seconds(proc.pid)
                    server0 = _cpu_seconds(box.pid)
                    times = [create(of, cdi_devices=cdi_devices) for _ in range(per_round)]
                    server_ms = (_cpu_seconds(box.pid) - server0) / per_round * 1000
                    fig.containerd_cpu_ms.setdefault(name, []).append(server_ms)
                    fig.creates.setdefault(name, []).extend(times)
                    fig.round_medians.setdefault(name, []).append(_median(times))
                    if proc is not None and name == "plugin":
                        fig.cpu_ms.append((_cpu_seconds(child) - cpu0) / per_round * 1000)
                        fig.supervisor_cpu_ms.append((_cpu_seconds(proc.pid) - sup0) / per_round * 1000)
                        rss, uss = _memory_mib(child)
                        fig.rss_mib = max(fig.rss_mib, rss)
                        fig.uss_mib = max(fig.uss_mib, uss)
                        fig.supervisor_rss_mib = max(fig.supervisor_rss_mib, _memory_mib(proc.pid)[0])
                        handling = proc.status()[1].get("handling_ms")
                        if isinstance(handling, dict):
                            fig.handling_median_ms.append(float(handling["median"]))
                            fig.handling_p99_ms.append(float(handling["p99"]))
                    elif proc is not None and name == "previous plugin":
                        fig.previous_cpu_ms.append((_cpu_seconds(proc.pid) - cpu0) / per_round * 1000)
                        fig.previous_rss_mib = max(fig.previous_rss_mib, _memory_mib(proc.pid)[0])
                    if go is not None:
                        fig.peer_cpu_ms.setdefault(name, []).append((_cpu_seconds(go.pid) - cpu0) / per_round * 1000)
                        fig.peer_rss_mib = max(fig.peer_rss_mib, _memory_mib(go.pid)[0])
                        go.stop()
                    if proc is not None:
                        proc.stop()

            for _ in range(10):  # the floor of any Python plugin's start, measured alongside
                for flags, into in (([], fig.python_ms), (["-S"], fig.python_bare_ms)):
                    t = time.monotonic()
                    subprocess.run([sys.executable, *flags, "-c", "pass"], check=True)
                    into.append((time.monotonic() - t) * 1000)
            proc = start_plugin()
            try:
                if py_spy is not None:
                    fig.profile = _profile(
                        proc, py_spy / f"plugin-{version}.txt", lambda: [create() for _ in range(300)]
                    )
                for sig in [signal.SIGKILL, signal.SIGSTOP] * kills:
                    moment = time.monotonic()
                    proc.signal_plugin(sig)
                    body = proc.wait_ready_after(moment)
                    ready_at = float(body["ready_at"])  # type: ignore[arg-type]
                    fig.back_ms.setdefault(signal.Signals(sig).name, []).append((ready_at - moment) * 1000)
                    time.sleep(0.2)
                if chaos:
                    fig.chaos = _chaos(box, pod, proc, chaos_creates, rng)
                for i in range(restarts):
                    box.restart()
                    body = proc.wait_ready_after(box.started_at)
                    fig.reregister_s.append(float(body["ready_at"]) - box.started_at)  # type: ignore[arg-type]
                    print(f"{version} restart {i + 1}/{restarts}: {fig.reregister_s[-1]:.3f} s", flush=True)
            finally:
                proc.stop()
            if sync_containers:
                _synchronize(box, fig, root, plugin_log, sync_containers)
            box.remove_pod(pod)
            box.remove_pod(opted_out)
            box.remove_pod(peer_devices)
            for bg in background:
                box.remove_pod(bg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return fig


def _synchronize(box: sandbox.Sandbox, fig: Figures, root: Path, log: IO[bytes], count: int) -> None:
    """Synchronize with ``count`` containers on the node: plugin-side handling, and a fresh start."""
    pod = box.run_pod("sync")
    print(f"{fig.version}: creating {count} containers for Synchronize", flush=True)
    for _ in range(count):
        box.create_container(pod, images.WORKLOAD_IMAGE, ["sleep", "1"])
    fig.sync_containers = count
    for _ in range(3):
        proc = PluginProcess(box.nri_socket, root, log)
        try:
            body = proc.wait_ready_after(0)
            fig.sync_start_ms.append((float(body["ready_at"]) - proc.spawned_at) * 1000)  # type: ignore[arg-type]
            fig.sync_bytes = int(body["sync_bytes"])  # type: ignore[call-overload]
            for i in range(4):  # and replacements, forked from the warm supervisor
                if i:
                    moment = time.monotonic()
                    proc.signal_plugin(signal.SIGKILL)
                    body = proc.wait_ready_after(moment)
                fig.sync_ms.append(float(body["sync_ms"]))  # type: ignore[arg-type]
                fig.sync_receive_ms.append(float(body["sync_receive_ms"]))  # type: ignore[arg-type]
                registered, ready = float(body["registered_at"]), float(body["ready_at"])  # type: ignore[arg-type]
                fig.sync_wait_ms.append((ready - registered) * 1000)
        finally:
            proc.stop()
    box.remove_pod(pod)


def _chaos(box: sandbox.Sandbox, pod: str, proc: PluginProcess, count: int, rng: random.Random) -> dict[str, float]:
    """``count`` creates while the plugin is killed or stopped at random; which were injected."""
    down: list[tuple[float, float]] = []
    done = threading.Event()
    signals: collections.Counter[str] = collections.Counter()

    def chaos_monkey() -> None:
        # Every 50-250 ms: a few signals a second, so that even a run of 200 creates that takes
        # under a second on a fast containerd meets several (one a second let 1.7's run meet none).
        while not done.wait(rng.uniform(0.05, 0.25)):
            sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
            moment = time.monotonic()
            try:
                pid = proc.signal_plugin(sig)
            except ProcessLookupError:
                continue
            signals[signal.Signals(sig).name] += 1
            if sig == signal.SIGSTOP:  # continued later, if the supervisor has not replaced it
                threading.Timer(rng.uniform(0.05, 0.5), lambda p=pid: _cont(p)).start()
            body = proc.wait_ready_after(moment, timeout=30)
            down.append((moment, float(body["ready_at"])))  # type: ignore[arg-type]

    monkey = threading.Thread(target=chaos_monkey, daemon=True)
    print(f"chaos: {count} creates while the plugin is killed or stopped at random", flush=True)
    started = time.monotonic()
    monkey.start()
    made: list[tuple[float, float, str | None]] = []
    failed = 0
    for _ in range(count):
        t0 = time.monotonic()
        try:
            cid = box.create_container(pod, images.WORKLOAD_IMAGE, ["sleep", "1"])
        except sandbox.SandboxError:
            failed += 1
            cid = None
        made.append((t0, time.monotonic(), cid))
    elapsed = time.monotonic() - started
    done.set()
    monkey.join(60)
    uninjected = unexplained = explained = 0
    for t0, t1, cid in made:
        overlaps = any(a <= t1 and t0 <= b for a, b in down)
        explained += overlaps
        if cid is None:
            continue
        mounts = box.container_info(cid)["runtimeSpec"].get("mounts", [])
        box.remove_container(cid)
        if not any(m.get("destination", "").endswith(INJECTED) for m in mounts):
            uninjected += 1
            unexplained += not overlaps
    down_s = sum(b - a for a, b in down)
    return {
        "creates": count,
        "failed": failed,
        "uninjected": uninjected,
        "unexplained": unexplained,
        "overlapping": explained,
        "down_s": down_s,
        "rate": count / elapsed,
        "kills": signals["SIGKILL"],
        "stops": signals["SIGSTOP"],
        "seconds": elapsed,
    }


def _cont(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _profile(proc: PluginProcess, out: Path, work: Callable[[], object]) -> list[str]:
    """Record the plugin process with py-spy while ``work`` runs; the hottest frames, as lines."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    recorder = subprocess.Popen(
        [spy, "record", "--rate", "1000", "--format", "raw", "--output", str(out), "--pid", str(proc.plugin_pid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)
    work()
    recorder.send_signal(signal.SIGINT)
    _, err = recorder.communicate(timeout=60)
    if not out.exists():
        return [f"py-spy recorded nothing: {err.decode(errors='replace').strip()[-300:]}"]
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in out.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0].rstrip(")") for f in stack.split(";")]
        if stack.split(";")[-1].startswith("Loop.run") and "loop.py" in stack.split(";")[-1]:
            idle += count  # waiting in poll()
            continue
        total += count
        for f in set(frames):
            inclusive[f] += count
        own[frames[-1]] += count
    lines = [f"{total} busy samples ({idle} idle in poll) of the plugin process, {out}"]
    lines += [f"  {n / total:6.1%} incl  {f}" for f, n in inclusive.most_common(40) if "<module>" not in f][:14]
    lines += [f"  {n / total:6.1%} self  {f}" for f, n in own.most_common(10)]
    return lines


def _ok(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def _report(
    results: list[Figures],
    settings: Settings,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> None:
    rounds, per_round = settings.rounds, settings.per_round
    previous, peer = settings.previous is not None, settings.peer is not None
    ms = 1000.0
    cols = [f"{f.version} ({f.server})" for f in results]
    width = max(18, *(len(c) + 2 for c in cols))
    busy = f", each side in a pod of {settings.pod_containers} containers of its own" if settings.pod_containers else ""
    print(
        f"\n{rounds} interleaved rounds of {per_round} CRI CreateContainer per side, beside "
        f"{max(f.background_pods for f in results)} other pods{busy}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (1 min)"
    )
    print(f"{'figure':<52}" + "".join(f"{c:>{width}}" for c in cols) + f"{'target':>10}  verdict")

    def row(name: str, values: list[float], fmt: str = "{:.2f}", target: float | None = None) -> None:
        cells = "".join(f"{fmt.format(v):>{width}}" for v in values)
        verdict = ""
        if target is not None:
            verdict = "ok" if all(v <= target for v in values) else "MISSED"
        print(f"{name:<52}{cells}{(f'{target:g}' if target is not None else ''):>10}  {verdict}")

    sides = ["no plugin", "CDI edits, no plugin", "plugin", "plugin, opted-out pod", "plugin --cdi-devices"]
    sides += ["previous plugin"] if previous else []
    peers = ["Go peer", "Go peer, device opt-in"] if peer else []
    for side in [*sides, *peers]:
        row(f"CreateContainer median, {side} (ms)", [_median_ms(f, side) for f in results])
    row(
        "  added by the plugin, median (ms)",
        [_added_ms(f, "plugin") for f in results],
        target=TARGETS["added_ms"],
    )
    row(
        "  plugin - CDI edits: NRI's way of applying the same",
        [_median_ms(f, "plugin") - _median_ms(f, "CDI edits, no plugin") for f in results],
    )
    row(
        "  opted-out pod - no plugin: the round trip alone",
        [_added_ms(f, "plugin, opted-out pod") for f in results],
    )
    if previous:
        row(
            "  added by the previous plugin, median (ms)",
            [_added_ms(f, "previous plugin") for f in results],
        )
    for side in peers:
        row(f"  added by the {side}, median (ms)", [_added_ms(f, side) for f in results])
    print("  per round, plugin - no plugin (ms):")
    for f in results:
        diffs = [
            a - b for a, b in zip(f.round_medians.get("plugin", []), f.round_medians.get("no plugin", []), strict=False)
        ]
        print(f"    {f.version}: " + " ".join(f"{d * ms:+.2f}" for d in diffs))
    for side in ("no plugin", "plugin"):
        row(f"CreateContainer p99, {side} (ms)", [_percentile(f.creates.get(side, []), 0.99) * ms for f in results])
    row(
        "plugin CPU per container (ms), median of rounds",
        [_median(f.cpu_ms) for f in results],
        "{:.3f}",
        TARGETS["cpu_ms"],
    )
    row("  supervisor CPU per container (ms)", [_median(f.supervisor_cpu_ms) for f in results], "{:.3f}")
    if previous:
        row("  previous plugin CPU per container (ms)", [_median(f.previous_cpu_ms) for f in results], "{:.3f}")
    for side in peers:
        row(f"  {side} CPU per container (ms)", [_median(f.peer_cpu_ms.get(side, [])) for f in results], "{:.3f}")
    print("containerd's own CPU per container, create and remove (ms), median of rounds:")
    for side in [*sides, *peers]:
        row(f"  {side}", [_median(f.containerd_cpu_ms.get(side, [])) for f in results], "{:.2f}")
    print("  per round, plugin / CDI edits: the same devices' edits, NRI's way against the spec's")
    for f in results:
        pairs = zip(
            f.containerd_cpu_ms.get("plugin", []), f.containerd_cpu_ms.get("CDI edits, no plugin", []), strict=False
        )
        print(f"    {f.version}: " + " ".join(f"{a / b:.3f}" for a, b in pairs if b))
    row("plugin handling median (ms)", [_median(f.handling_median_ms) for f in results], "{:.3f}")
    row(
        "plugin handling p99 (ms), worst round",
        [max(f.handling_p99_ms, default=float("nan")) for f in results],
        "{:.3f}",
        TARGETS["handling_p99_ms"],
    )
    row("plugin process RSS (MiB)", [f.rss_mib for f in results], "{:.1f}", TARGETS["rss_mib"])
    row("  of it private, not shared with the supervisor (MiB)", [f.uss_mib for f in results], "{:.1f}")
    row("  supervisor RSS (MiB)", [f.supervisor_rss_mib for f in results], "{:.1f}")
    if previous:
        row("  previous plugin RSS (MiB)", [f.previous_rss_mib for f in results], "{:.1f}")
    if peer:
        row("  Go peer RSS (MiB)", [f.peer_rss_mib for f in results], "{:.1f}")
    row("start -> registered (ms), median", [_median(f.start_ms) for f in results], "{:.1f}", TARGETS["start_ms"])
    row("start -> registered (ms), max", [max(f.start_ms, default=float("nan")) for f in results], "{:.1f}")
    row("  python -c pass (ms), median: interpreter and site", [_median(f.python_ms) for f in results], "{:.1f}")
    row("  python -S -c pass (ms), median: without site", [_median(f.python_bare_ms) for f in results], "{:.1f}")
    row("start -> warmed up (ms), median", [_median(f.warm_ms) for f in results], "{:.1f}")
    for sig in ("SIGKILL", "SIGSTOP"):
        row(
            f"{sig} -> replacement registered (ms), max",
            [max(f.back_ms.get(sig, []), default=float("nan")) for f in results],
            "{:.1f}",
            TARGETS["back_ms"],
        )
    if any(f.sync_containers for f in results):
        n = max(f.sync_containers for f in results)
        row(
            f"Synchronize with {n} containers, answering (ms), max",
            [max(f.sync_ms, default=float("nan")) for f in results],
            "{:.2f}",
            TARGETS["sync_ms"],
        )
        row("  its size (KiB)", [f.sync_bytes / 1024 for f in results], "{:.0f}")
        row(
            "  first byte -> whole request (ms), median",
            [_median(f.sync_receive_ms) for f in results],
            "{:.1f}",
        )
        row(
            "  registered -> synchronized (ms), median (containerd)",
            [_median(f.sync_wait_ms) for f in results],
            "{:.1f}",
        )
        row(
            f"  start -> registered with {n} containers (ms), median",
            [_median(f.sync_start_ms) for f in results],
            "{:.1f}",
        )
    if any(f.reregister_s for f in results):
        row(
            "re-register after containerd restart (s), max",
            [max(f.reregister_s, default=float("nan")) for f in results],
            "{:.3f}",
            TARGETS["reregister_s"],
        )
        for f in results:
            ok = sum(t <= TARGETS["reregister_s"] for t in f.reregister_s)
            print(
                f"    {f.version}: {ok}/{len(f.reregister_s)} within target: "
                + " ".join(f"{t:.3f}" for t in f.reregister_s)
            )
    if any(f.chaos for f in results):
        print("chaos (random SIGKILL/SIGSTOP of the plugin during creates):")
        for f in results:
            c = f.chaos
            expected = c["down_s"] * c["rate"]
            ok = c["failed"] == 0 and c["unexplained"] == 0 and c["uninjected"] <= c["overlapping"]
            print(
                f"    {f.version}: {int(c['creates'])} creates in {c['seconds']:.1f} s ({c['rate']:.1f}/s), "
                f"{int(c['kills'])} SIGKILLs, {int(c['stops'])} SIGSTOPs"
            )
            print(f"      failed creates: {int(c['failed'])} (target 0)")
            print(
                f"      plugin absent {c['down_s'] * 1000:.0f} ms in all (signal -> replacement registered), "
                f"which at {c['rate']:.1f} creates/s is {expected:.1f} creates; {int(c['overlapping'])} creates "
                "overlapped an absence"
            )
            print(
                f"      not injected: {int(c['uninjected'])}, of which outside every absence: "
                f"{int(c['unexplained'])}  {'ok' if ok else 'MISSED'}"
            )
    for f in results:
        if f.profile:
            print(f"profile, containerd {f.version}:")
            print("\n".join(f.profile))
