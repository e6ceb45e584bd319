"""`mokka bench dcgm`: NVIDIA's dcgm-exporter on the mock libdcgm, side by side with nvidia-smi.

For 8 and 64 GPUs of a profile: the exporter's start (process start to its first /metrics) and
the median latency of a /metrics scrape with the default counters, against the median wall time
of ``nvidia-smi --query-gpu`` over the same fields, in the same run. Target: a scrape of 8 GPUs no
slower than nvidia-smi's query (ratio <= 1)."""

from __future__ import annotations

import ctypes
import functools
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fetch import dcgm_exporter, nvidia_smi
from gpumodel import driver_root
from gpumodel.profile import Profile

# The default counters nvidia-smi --query-gpu has (not the remapped rows, energy or profiling ratios).
QUERY = (
    "clocks.sm,clocks.mem,temperature.memory,temperature.gpu,power.draw,utilization.gpu,utilization.memory,"
    "utilization.encoder,utilization.decoder,memory.free,memory.used,memory.reserved,driver_version"
)


def _median_s(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _scrape(conn: http.client.HTTPConnection) -> None:
    conn.request("GET", "/metrics")
    conn.getresponse().read()


def _query(argv: list[str], env: dict[str, str]) -> None:
    subprocess.run(argv, env=env, check=True, capture_output=True)


# dcgm-exporter's default counters by field id (DCGM_FI_*), for the library's own share of a scrape.
DEFAULT_FIELDS = (1, 100, 101, 140, 150, 155, 156, 202, 203, 204, 206, 207, 230, 251, 252, 253, 393, 394, 395, 449,
                  1001, 1004, 1005, 1009, 1010)  # fmt: skip
FIELD_VALUE_SIZE = 4120  # sizeof(dcgmFieldValue_v1)


def library_ms(libdir: Path, gpus: int, rounds: int) -> float:
    """What one scrape asks of the library (every GPU's default fields), through ctypes, in ms."""
    lib = ctypes.CDLL(str(libdir / "libdcgm.so.4"))
    handle = ctypes.c_void_p()
    if lib.dcgmInit() != 0 or lib.dcgmStartEmbedded(2, ctypes.byref(handle)) != 0:
        return float("nan")
    fields = (ctypes.c_ushort * len(DEFAULT_FIELDS))(*DEFAULT_FIELDS)
    out = ctypes.create_string_buffer(FIELD_VALUE_SIZE * len(DEFAULT_FIELDS))

    def scrape() -> None:
        for gpu in range(gpus):
            lib.dcgmEntityGetLatestValues(handle, 1, gpu, fields, len(DEFAULT_FIELDS), out)

    return _median_s(scrape, rounds * 10) * 1000


def run(profile: Profile, rounds: int = 15, svg: Path | None = None) -> None:
    counters = dcgm_exporter.default_counters()
    smi = nvidia_smi.find()
    with tempfile.TemporaryDirectory(prefix="mokka-bench-dcgm-") as tmp:
        try:
            exe = dcgm_exporter.binary(Path(tmp) / "exporter")
        except dcgm_exporter.ExporterMissing as exc:
            print(f"dcgm-exporter: {exc}")
            return
        if counters is None:
            print(f"dcgm-exporter: no default-counters.csv beside it (${dcgm_exporter.ENV_DIR})")
            return
        print(f"{'figure':<40}{'exporter':>11}{'smi query':>11}{'ratio':>8}{'target':>8}")
        plotted: dict[str, dict[str, float]] = {}
        for gpus in (8, 64):
            root = driver_root.stage(profile.with_count(gpus), Path(tmp) / f"root-{gpus}")
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(root.libdir)}
            t0 = time.perf_counter()
            with dcgm_exporter.running(exe, root.libdir, counters, Path(tmp) / f"exporter-{gpus}.log") as e:
                start_ms = (time.perf_counter() - t0) * 1000
                conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=10)  # kept alive, as Prometheus does
                scrape_ms = _median_s(functools.partial(_scrape, conn), rounds) * 1000
                conn.close()
            served = min(gpus, 32)  # DCGM_MAX_NUM_DEVICES: DCGM serves at most 32 GPUs
            lib_ms = subprocess.run(
                [sys.executable, "-c", f"from bench.dcgm import library_ms; print(library_ms("
                 f"__import__('pathlib').Path({str(root.libdir)!r}), {served}, {rounds}))"],
                env={**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                check=True, capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
            query_ms = float("nan")
            if smi is not None:
                argv = [str(smi), f"--query-gpu={QUERY}", "--format=csv,noheader"]
                query_ms = _median_s(functools.partial(_query, argv, env), rounds) * 1000
            ratio = scrape_ms / query_ms if query_ms == query_ms else float("nan")
            target = "<= 1" if gpus == 8 else ""
            verdict = "" if gpus != 8 or ratio != ratio else ("  ok" if ratio <= 1 else "  MISSED")
            print(f"{f'/metrics scrape, {gpus} GPUs (ms, median)':<40}{scrape_ms:>11.2f}{query_ms:>11.2f}"
                  f"{ratio:>8.2f}{target:>8}{verdict}")  # fmt: skip
            print(f"{f'  of it libdcgm, {served} GPUs x 25 fields (ms)':<40}{float(lib_ms):>11.3f}")
            print(f"{f'exporter start, {gpus} GPUs (ms)':<40}{start_ms:>11.1f}")
            plotted[f"{gpus} GPUs"] = {
                "dcgm-exporter /metrics": scrape_ms,
                "  of it libdcgm": float(lib_ms),
                "nvidia-smi --query-gpu": query_ms,
            }
        print("DCGM serves at most 32 GPUs (DCGM_MAX_NUM_DEVICES): the 64-GPU node's exporter shows 32.")
        if smi is None:
            print("nvidia-smi: not found (run the tests once to cache Debian's)")
        if svg is not None:
            from bench import plot

            title = "A scrape of NVIDIA's dcgm-exporter beside nvidia-smi's query of the same fields, median"
            print(f"plot: {plot.bars(svg / 'dcgm-scrape.svg', title, 'ms', plotted)}")
