"""`mokka bench`: measure the mock NVML library and print the figures side by side.

Figures (medians over repeated runs, never asserted in tests):
  * ns per call of nvmlDeviceGetPowerUsage / nvmlDeviceGetMemoryInfo (C loop, 1M calls), and
    the same with the state's counter left odd, as a writer killed mid-update leaves it
  * dlopen and nvmlInit_v2 time in a fresh process
  * wall time and peak RSS of `nvidia-smi -q -x` with the mock, against nvidia-smi with
    no NVML library at all (it exits at once: the floor of its own start-up cost)
  * the library's size on disk
  * MIG: ns per nvmlDeviceGetMigDeviceHandleByIndex and per nvmlDeviceGetMemoryInfo on a MIG
    device, and the cost of creating and destroying a GPU instance with its compute instance
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fetch import nvidia_smi
from gpumodel import driver_root, state
from gpumodel.native import library_path
from gpumodel.profile import Profile

NATIVE = Path(__file__).resolve().parent.parent / "native"
TARGETS = {"call_ns": 30.0, "init_us": 100.0, "rss_overhead_mb": 0.5, "library_mb": 1.0}


def bench_binary() -> Path:
    """The C micro-benchmark, (re)built by make when its source changed."""
    if not (NATIVE / "Makefile").exists():
        raise SystemExit("mokka bench needs a source checkout (native/bench is not installed)")
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"PYTHON={sys.executable}", "bench"], check=True)
    return NATIVE / "build" / "bench_nvml"


def _kv(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}


def timed_child(exe: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child, started from the small C bench process:
    ru_maxrss survives exec, so a child forked from Python would start at Python's size."""
    res = subprocess.run(
        [str(exe), "-", "run", *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True
    )
    out = _kv(res.stderr)
    return out["wall_ms"] / 1000, out["maxrss_kb"] / 1024


def stuck_copy(library: Path, out: Path) -> Path:
    """A copy of a staged library whose state counter is left odd (a writer killed while
    rewriting copy 0): what readers must answer from without waiting."""
    shutil.copyfile(library, out)
    fd = os.open(out, os.O_RDWR)
    try:
        offset, _ = state.locate(fd, str(out))
        at = offset + state.ffi().offsetof("mokka_header_t", "seq")
        seq = int.from_bytes(os.pread(fd, 4, at), "little")
        os.pwrite(fd, (seq | 1).to_bytes(4, "little"), at)
    finally:
        os.close(fd)
    return out


def run(profile: Profile, smi: str | None, calls: int, rounds: int = 15, svg: Path | None = None) -> None:
    exe = bench_binary()
    with tempfile.TemporaryDirectory(prefix="mokka-bench-") as tmp:
        root = driver_root.stage(profile, Path(tmp) / "root")
        lib = str(root.libdir / "libnvidia-ml.so.1")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        print(f"profile {profile.name}: {profile.gpu_count}x {profile.gpu.name}", flush=True)

        out = _kv(
            subprocess.run(
                [str(exe), lib, "calls", str(calls)], env=env, check=True, capture_output=True, text=True
            ).stdout
        )
        stuck = stuck_copy(root.library, Path(tmp) / "stuck.so")
        out_stuck = _kv(
            subprocess.run(
                [str(exe), lib, "calls", str(calls)],
                env={**env, "MOKKA_STATE": str(stuck)},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        inits = [
            _kv(subprocess.run([str(exe), lib, "init"], env=env, check=True, capture_output=True, text=True).stdout)
            for _ in range(31)
        ]
        init_us = statistics.median(i["init_us"] for i in inits)
        load_us = statistics.median(i["load_us"] for i in inits)
        size_mb = library_path().stat().st_size / 1e6
        mig_out = mig_figures(exe, profile, Path(tmp), calls, env)

        print(f"{'figure':<44}{'mock':>12}{'target':>12}{'ratio':>9}")
        rows = [
            ("nvmlDeviceGetPowerUsage (ns/call)", out["power_ns"], TARGETS["call_ns"]),
            ("nvmlDeviceGetMemoryInfo (ns/call)", out["memory_ns"], TARGETS["call_ns"]),
            ("  the same, counter stuck odd (ns/call)", out_stuck["memory_ns"], TARGETS["call_ns"]),
            ("nvmlInit_v2 in a fresh process (us)", init_us, TARGETS["init_us"]),
            ("dlopen of the library (us)", load_us, None),
            ("library size (MB)", size_mb, TARGETS["library_mb"]),
        ]
        if mig_out:
            rows += [
                ("nvmlDeviceGetMigDeviceHandleByIndex (ns/call)", mig_out["mig_handle_ns"], TARGETS["call_ns"]),
                ("nvmlDeviceGetMemoryInfo, MIG device (ns/call)", mig_out["mig_memory_ns"], TARGETS["call_ns"]),
                ("create + destroy a GI and its CI (us)", mig_out["create_destroy_us"], None),
            ]
        for name, value, target in rows:
            if target is None:
                print(f"{name:<44}{value:>12.2f}")
            else:
                print(f"{name:<44}{value:>12.2f}{target:>12.2f}{value / target:>9.2f}{verdict(value, target)}")
        if svg is not None:
            plot_calls(svg, rows, init_us, load_us)

        smi_path = Path(smi) if smi else nvidia_smi.find()
        if smi_path is None:
            print("nvidia-smi: not found (pass --nvidia-smi or run the tests once to cache Debian's)")
            return
        empty = Path(tmp) / "nolib"
        empty.mkdir()
        walls = {
            f"nvidia-smi {' '.join(mode)}": smi_rows(exe, smi_path, mode, env, root.libdir, empty, rounds)
            for mode in (["-q", "-x"], ["-L"])
        }
        if svg is not None:
            from bench import plot

            title = "nvidia-smi with the mock library beside nvidia-smi with none (its own start-up), median"
            print(f"plot: {plot.bars(svg / 'nvidia-smi.svg', title, 'ms', walls)}")


# The figures with a peer to stand beside: the target (no other mock NVML library runs here).
CALL_PLOTTED = {
    "nvmlDeviceGetPowerUsage (ns/call)": "GetPowerUsage",
    "nvmlDeviceGetMemoryInfo (ns/call)": "GetMemoryInfo",
    "  the same, counter stuck odd (ns/call)": "GetMemoryInfo,\nwriter killed",
    "nvmlDeviceGetMigDeviceHandleByIndex (ns/call)": "GetMigDevice-\nHandleByIndex",
    "nvmlDeviceGetMemoryInfo, MIG device (ns/call)": "GetMemoryInfo,\nMIG device",
}


def plot_calls(svg: Path, rows: list[tuple[str, float, float | None]], init_us: float, load_us: float) -> None:
    """Two plots: ns per getter call and the start-up of a fresh process, each beside its target."""
    from bench import plot

    target = TARGETS["call_ns"]
    calls = {CALL_PLOTTED[name]: {"mock": value, "target": target} for name, value, _ in rows if name in CALL_PLOTTED}
    title = "The mock libnvidia-ml: ns per call (C loop, median), beside the target"
    print(f"plot: {plot.bars(svg / 'nvml-calls.svg', title, 'ns per call', calls)}")
    start = {
        "nvmlInit_v2": {"mock": init_us, "target": TARGETS["init_us"]},
        "dlopen": {"mock": load_us},
    }
    title = "The mock libnvidia-ml in a fresh process: dlopen and nvmlInit_v2 (median of 31), beside the target"
    print(f"plot: {plot.bars(svg / 'nvml-init.svg', title, 'µs', start)}")


def verdict(value: float, target: float) -> str:
    """``  ok`` when ``value`` is within ``target`` (lower is better), else ``  MISSED``."""
    return "  ok" if value <= target else "  MISSED"


def mig_figures(exe: Path, profile: Profile, tmp: Path, calls: int, env: dict[str, str]) -> dict[str, float] | None:
    """The MIG figures (medians of 7 runs), on a copy of the profile with MIG on GPU 0 and a 3g
    instance (None: the board has no MIG table)."""
    from gpumodel import mig_state

    data = profile.model_dump(mode="json")
    data["gpus"] = {**data.get("gpus", {}), "0": {"mig": {"mode": True, "instances": [{"profile": 9}]}}}
    try:
        with_mig = Profile.model_validate(data)
    except ValueError:
        return None
    if mig_state.board_of(with_mig.devices()[0].spec) is None:
        return None
    root = driver_root.stage(with_mig, tmp / "mig-root")
    lib = str(root.libdir / "libnvidia-ml.so.1")
    runs = [
        _kv(
            subprocess.run(
                [str(exe), lib, "mig", str(calls)], env=env, check=True, capture_output=True, text=True
            ).stdout
        )
        for _ in range(7)
    ]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def smi_rows(
    exe: Path, smi: Path, mode: list[str], env: dict[str, str], libdir: Path, empty: Path, rounds: int
) -> dict[str, float]:
    """nvidia-smi ``mode`` with the mock against nvidia-smi with no NVML library at all; returns
    the two median wall times (ms)."""
    with_mock = [timed_child(exe, [str(smi), *mode], {**env, "LD_LIBRARY_PATH": str(libdir)}) for _ in range(rounds)]
    bare = [timed_child(exe, [str(smi), *mode], {**env, "LD_LIBRARY_PATH": str(empty)}) for _ in range(rounds)]
    wall_mock = statistics.median(w for w, _ in with_mock) * 1000
    wall_bare = statistics.median(w for w, _ in bare) * 1000
    rss_mock = statistics.median(r for _, r in with_mock)
    rss_bare = statistics.median(r for _, r in bare)
    rss_target = TARGETS["rss_overhead_mb"]
    print(f"nvidia-smi {' '.join(mode)}, median of {rounds}:")
    print(f"{'':<24}{'with mock':>12}{'no library':>12}{'ratio':>9}{'overhead':>10}{'target':>10}")
    print(
        f"{'wall time (ms)':<24}{wall_mock:>12.2f}{wall_bare:>12.2f}{wall_mock / wall_bare:>9.2f}"
        f"{wall_mock - wall_bare:>10.2f}"
    )
    print(
        f"{'peak RSS (MiB)':<24}{rss_mock:>12.2f}{rss_bare:>12.2f}{rss_mock / rss_bare:>9.2f}"
        f"{rss_mock - rss_bare:>10.2f}{rss_target:>10.2f}{verdict(rss_mock - rss_bare, rss_target)}"
    )
    return {"with the mock": wall_mock, "no library": wall_bare}


def host_setup(profile_name: str, rounds: int) -> None:
    """Median wall time of plan + apply for 8 and 64 GPUs, against the targets (1 s, 3 s)."""
    from gpumodel.profile import load
    from hostsetup import node

    print(f"{'host setup':<28}{'median s':>10}{'max s':>8}{'target s':>10}{'ratio':>8}")
    for count, target in ((8, 1.0), (64, 3.0)):
        prof = load(profile_name).with_count(count)
        times = []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="mokka-bench-") as tmp:
                root = Path(tmp) / "root"
                start = time.perf_counter()
                node.apply(node.plan(prof, node.Options(root=root)))
                times.append(time.perf_counter() - start)
                node.cleanup(root)
        med = statistics.median(times)
        print(
            f"{f'{profile_name} x{count}':<28}{med:>10.3f}{max(times):>8.3f}{target:>10.1f}{med / target:>8.2f}"
            f"{verdict(med, target)}"
        )
