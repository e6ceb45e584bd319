"""`mokka bench fault`: how soon NVML consumers see a fault, and what a dynamic metric costs.

Figures (never asserted in tests), side by side with the targets:
  * latency from `mokka fault temperature ...` returning (a separate process, as an operator
    runs it) to the end of the first NVML read that sees the new value: this process calls
    nvmlDeviceGetTemperature (through ctypes, the staged library mapped here) as soon as the
    command returns, and counts reads that still saw the old value (stale: target 0); the
    same from the Python API (gpumodel.faults.apply) returning.
  * the same seen by a reader process spinning on nvmlDeviceGetTemperature
    (native/bench/bench_fault.c): a reader that saw the value before the call returned counts
    0; the rest is the reader waiting for a CPU (no target: it measures the scheduler).
  * ns per nvmlDeviceGetPowerUsage / GetMemoryInfo call with a sine power pattern and a
    walking memory pattern active (evaluated from the clock), next to the same profile
    without patterns (median of 5 runs).
  * event wake-up: an Xid applied through the API to nvmlEventSetWait returning in another
    process (asleep on the futex), counted from the call's return (0 when it woke before)
    and from its start.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench.nvml import NATIVE, _kv, bench_binary
from gpumodel import driver_root, faults
from gpumodel import faultspec as fs
from gpumodel.profile import Profile

TARGETS = {"latency_p99_ms": 1.0, "call_ns": 30.0}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def with_patterns(profile: Profile) -> Profile:
    """``profile`` with a sine power pattern and a walking memory pattern on every GPU."""
    data = profile.model_dump()
    total = data["gpu"]["memory"]["total_mib"]
    data["gpu"]["dynamic"] = {
        "seed": 1,
        "power_w": {"pattern": "sine", "mean": 300, "amplitude": 100, "period_s": 60},
        "memory_used_mib": {"pattern": "walk", "low": 0, "high": total // 2, "step_s": 1},
    }
    return Profile.model_validate(data)


class Observer:
    """native/build/bench_fault running against a library; the lines it prints."""

    def __init__(self, exe: Path, library: Path, *mode: str) -> None:
        self.proc = subprocess.Popen(
            [str(exe), str(library), *mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.out: IO[str] = self.proc.stdout
        if self.out.readline().strip() != "ready":
            raise SystemExit(f"bench_fault {' '.join(mode)} did not start")

    def until(self, column: int, value: int) -> int:
        """The timestamp (first column) of the next line whose ``column`` is ``value``."""
        while True:
            line = self.out.readline()
            if not line:
                raise SystemExit("bench_fault stopped")
            fields = line.split()
            if int(fields[column]) == value:
                return int(fields[0])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


class Reader:
    """nvmlDeviceGetTemperature of GPU 0 through the staged library, in this process."""

    def __init__(self, library: Path) -> None:
        self.lib = ctypes.CDLL(str(library))
        if self.lib.nvmlInit_v2() != 0:
            raise SystemExit("nvmlInit_v2 failed")
        self.device = ctypes.c_void_p()
        self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.device))
        self.value = ctypes.c_uint()

    def temperature(self) -> int:
        self.lib.nvmlDeviceGetTemperature(self.device, 0, ctypes.byref(self.value))
        return int(self.value.value)


@dataclass
class Latencies:
    direct: list[float] = field(default_factory=list)  # ms: return -> end of the first read that saw it
    stale: int = 0  # reads after the return that still saw the old value
    spinning: list[float] = field(default_factory=list)  # ms, in the spinning reader process


def _latency_rounds(
    reader: Reader, observer: Observer, rounds: int, change: Callable[[int], None], first_value: int
) -> Latencies:
    out = Latencies()
    for i in range(rounds):
        value = first_value + i % 2  # alternate, so every round changes the value
        change(value)
        returned = time.monotonic_ns()
        while reader.temperature() != value:
            out.stale += 1
        out.direct.append((time.monotonic_ns() - returned) / 1e6)
        out.spinning.append(max(0, observer.until(1, value) - returned) / 1e6)
    return out


def run(profile: Profile, cli_rounds: int, api_rounds: int, calls: int) -> None:
    exe = bench_binary()
    fault_exe = NATIVE / "build" / "bench_fault"
    with tempfile.TemporaryDirectory(prefix="mokka-bench-fault-") as tmp:
        root = driver_root.stage(profile, Path(tmp) / "root")
        target = faults.for_driver_root(root.root)
        gpu0 = faults.select(faults.gpus(target), "0")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        print(f"profile {profile.name}: {profile.gpu_count}x {profile.gpu.name}", flush=True)

        def by_cli(value: int) -> None:
            cmd = [sys.executable, "-m", "mokka.cli", "fault", "temperature", str(value), "--gpu", "0"]
            subprocess.run([*cmd, "--driver-root", str(root.root)], check=True, stdout=subprocess.DEVNULL)

        def by_api(value: int) -> None:
            faults.apply(target, [(gpu0, fs.Temperature(celsius=value))])

        watch = Observer(fault_exe, root.library, "watch", "0")
        reader = Reader(root.library)
        cli = _latency_rounds(reader, watch, cli_rounds, by_cli, 61)
        api = _latency_rounds(reader, watch, api_rounds, by_api, 71)
        watch.close()

        events = Observer(fault_exe, root.library, "events")
        from_return, from_start = [], []
        for i in range(api_rounds):
            code = 13 + i % 2
            start = time.monotonic_ns()
            faults.apply(target, [(gpu0, fs.Xid(code=code))])
            returned = time.monotonic_ns()
            woke = events.until(2, code)
            from_return.append(max(0, woke - returned) / 1e6)
            from_start.append((woke - start) / 1e6)
        events.close()

        dynamic_root = driver_root.stage(with_patterns(profile), Path(tmp) / "dynamic")

        def per_call(lib: Path) -> dict[str, float]:
            runs = []
            for _ in range(5):
                cmd = [str(exe), str(lib), "calls", str(calls)]
                runs.append(_kv(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout.decode()))
            return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

        static = per_call(root.libdir / "libnvidia-ml.so.1")
        varying = per_call(dynamic_root.libdir / "libnvidia-ml.so.1")

    print(f"{'figure':<60}{'p50':>9}{'p99':>9}{'max':>9}{'target':>9}")

    def row(name: str, values: list[float], target: float | None) -> None:
        p99 = _percentile(values, 0.99)
        missed = "  MISSED" if target is not None and p99 > target else ""
        tgt = f"{target:>9.2f}" if target is not None else f"{'':>9}"
        print(f"{name:<60}{statistics.median(values):>9.3f}{p99:>9.3f}{max(values):>9.3f}{tgt}{missed}")

    row(f"`mokka fault` returned -> a read sees it (ms, n={cli_rounds})", cli.direct, TARGETS["latency_p99_ms"])
    row(f"faults.apply() returned -> a read sees it (ms, n={api_rounds})", api.direct, TARGETS["latency_p99_ms"])
    row("  reader process spinning meanwhile: `mokka fault` (ms)", cli.spinning, None)
    row("  reader process spinning meanwhile: faults.apply() (ms)", api.spinning, None)
    row(f"Xid: apply() returned -> EventSetWait returns (ms, n={api_rounds})", from_return, None)
    row("Xid: apply() called -> EventSetWait returns (ms)", from_start, None)
    stale = cli.stale + api.stale
    missed = "  MISSED" if stale else ""
    print(f"stale reads after a return: {stale} in {cli_rounds + api_rounds} rounds (target 0){missed}")
    print(f"{'getter cost (ns/call, median of 5 runs)':<60}{'static':>9}{'dynamic':>9}{'':>9}{'target':>9}")
    for name, key in (
        ("nvmlDeviceGetPowerUsage (sine pattern)", "power_ns"),
        ("nvmlDeviceGetMemoryInfo (walk pattern)", "memory_ns"),
    ):
        missed = "  MISSED" if varying[key] > TARGETS["call_ns"] else ""
        print(f"{name:<60}{static[key]:>9.2f}{varying[key]:>9.2f}{'':>9}{TARGETS['call_ns']:>9.2f}{missed}")
