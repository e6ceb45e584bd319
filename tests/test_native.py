"""The native library itself: exported symbols, layout agreement, concurrency, sanitizers, fuzzing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from gpumodel import native, state

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[1] in "TtWiV"}


def test_exports_whole_symbol_sets() -> None:
    names = exported(native.library_path())
    for listing in sorted((NATIVE / "symbols").glob("*.txt")):
        wanted = set(listing.read_text().split())
        missing = wanted - names
        assert not missing, f"{listing.name}: {len(missing)} missing, e.g. {sorted(missing)[:5]}"


def test_exports_only_nvml() -> None:
    names = exported(native.library_path())
    stray = {n for n in names if not n.startswith("nvml")}
    assert not stray, f"non-NVML symbols leak out of the library: {sorted(stray)}"


def test_libcuda_exports_only_the_driver_api() -> None:
    names = exported(native.library_path(native.CUDA_LIBRARY))
    assert {"cuInit", "cuDeviceGetAttribute", "cuGetProcAddress_v2", "cuDeviceTotalMem_v2"} <= names
    assert not {n for n in names if not n.startswith("cu")}, sorted(names)


def test_the_writer_exports_only_its_own_calls() -> None:
    names = exported(native.library_path(native.STATE_WRITER))
    assert names == {"mokka_state_publish", "mokka_state_stable_copy"}


def test_no_runtime_dependencies_beyond_libc() -> None:
    out = subprocess.run(
        ["readelf", "-d", str(native.library_path())], check=True, capture_output=True, text=True
    ).stdout
    needed = {line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line}
    assert needed <= {"libc.so.6", "libpthread.so.0", "libdl.so.2"}, needed


LAYOUT_PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "mokka_state.h"
#define P(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f));
int main(void) {
    printf("mokka_header_t %zu\nmokka_gpu_t %zu\n", sizeof(mokka_header_t), sizeof(mokka_gpu_t));
    printf("mokka_process_t %zu\n", sizeof(mokka_process_t));
    printf("mokka_node_t %zu\nmokka_trailer_t %zu\n", sizeof(mokka_node_t), sizeof(mokka_trailer_t));
    printf("mokka_faults_t %zu\nmokka_pattern_t %zu\n", sizeof(mokka_faults_t), sizeof(mokka_pattern_t));
    printf("mokka_event_t %zu\nmokka_events_t %zu\n", sizeof(mokka_event_t), sizeof(mokka_events_t));
    P(mokka_header_t, node_size) P(mokka_header_t, seq) P(mokka_header_t, driver_version)
    P(mokka_header_t, cuda_version) P(mokka_header_t, profile) P(mokka_node_t, generation)
    P(mokka_trailer_t, state_size) P(mokka_trailer_t, magic) P(mokka_gpu_t, multiprocessor_count)
    P(mokka_gpu_t, uuid) P(mokka_gpu_t, pci_device_id) P(mokka_gpu_t, cpu_affinity) P(mokka_gpu_t, mem_total)
    P(mokka_gpu_t, power_usage) P(mokka_gpu_t, energy_mj) P(mokka_gpu_t, thresholds) P(mokka_gpu_t, gfx_clocks)
    P(mokka_gpu_t, clocks_event_reasons) P(mokka_gpu_t, ecc_counts) P(mokka_gpu_t, cluster_uuid) P(mokka_gpu_t, procs)
    P(mokka_gpu_t, patterns) P(mokka_gpu_t, faults) P(mokka_gpu_t, events)
    P(mokka_node_t, events) P(mokka_node_t, fault_tag)
    P(mokka_faults_t, flags_set) P(mokka_faults_t, ecc_added) P(mokka_faults_t, nvlink_errors)
    P(mokka_pattern_t, a) P(mokka_pattern_t, start_ms) P(mokka_event_t, time_us) P(mokka_event_t, compute_instance)
    P(mokka_events_t, ring)
    return 0;
}
"""


def test_python_and_c_agree_on_the_layout(tmp_path: Path) -> None:
    src = tmp_path / "probe.c"
    src.write_text(LAYOUT_PROBE)
    exe = tmp_path / "probe"
    subprocess.run(["cc", "-I", str(NATIVE), "-o", str(exe), str(src)], check=True)
    ffi = state.ffi()
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        what, value = line.rsplit(" ", 1)
        if "." in what:
            typ, field = what.split(".")
            assert ffi.offsetof(typ, field) == int(value), what
        else:
            assert ffi.sizeof(what) == int(value), what


def test_update_is_visible_to_a_running_reader(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    staged = stage("h100", 1)
    live = tmp_path / "libnvidia-ml.so.1"
    shutil.copyfile(staged.root.state, live)
    code = (
        "import pynvml as N, sys\n"
        "N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)\n"
        "print(N.nvmlDeviceGetTemperature(h, 0), flush=True); sys.stdin.readline()\n"
        "print(N.nvmlDeviceGetTemperature(h, 0), flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=staged.env(MOKKA_STATE=str(live)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    first = proc.stdout.readline().strip()

    def heat(h: object, gpus: object) -> None:
        gpus[0].temp_gpu = 91  # type: ignore[index]

    state.update(live, heat)
    proc.stdin.write("\n")
    proc.stdin.flush()
    second = proc.stdout.readline().strip()
    proc.wait(timeout=10)
    assert (first, second) == (str(staged.profile.gpu.temperature.gpu), "91")


@pytest.fixture(scope="session")
def asan_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("asan")
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", "asan"], check=True)
    return build / "asan" / "libnvidia-ml.so"


@pytest.mark.consumers
def test_sanitizer_build_under_nvidia_smi(
    asan_lib: Path, stage: Callable[..., Staged], smi: tuple[str, Path], tmp_path: Path
) -> None:
    """nvidia-smi in its heaviest modes over the ASan/UBSan build: any memory error aborts."""
    staged = stage("h100")
    libdir = tmp_path / "lib"
    libdir.mkdir()
    shutil.copy(asan_lib, libdir / "libnvidia-ml.so.1")
    libasan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], check=True, capture_output=True, text=True
    ).stdout.strip()
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": str(libdir),
        "MOKKA_STATE": str(staged.root.state),
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    for args in (
        ["-q", "-x"],
        ["-q"],
        [],
        ["-L"],
        ["--query-gpu=name,uuid,pci.bus_id,power.draw", "--format=csv"],
        ["nvlink", "-s"],
        ["topo", "-m"],
    ):
        res = subprocess.run([str(smi[1]), *args], env=env, capture_output=True, text=True, timeout=120)
        assert "ERROR: AddressSanitizer" not in res.stderr and "runtime error" not in res.stderr, res.stderr[-3000:]
        assert res.returncode in (0, 6, 255) or args == ["topo", "-m"], (args, res.returncode, res.stderr[-2000:])


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("clang"):
        pytest.fail("clang is required for the fuzz target (installed by .ci/setup)")
    build = tmp_path_factory.mktemp("fuzzbuild")
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", "fuzz"], check=True)
    return build / "fuzz_state"


def test_fuzz_corpus_replays(fuzz_target: Path, tmp_path: Path) -> None:
    """Every kept input (native/fuzz/corpus/) runs clean, leaving nothing behind."""
    inputs = sorted((NATIVE / "fuzz" / "corpus").iterdir())
    assert inputs
    res = subprocess.run(
        [str(fuzz_target), f"-artifact_prefix={tmp_path}/", *map(str, inputs)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_fuzz_state_loader(fuzz_target: Path, tmp_path: Path, stage: Callable[..., Staged]) -> None:
    """A short fuzz run in a temporary directory: seeds from compiled profiles and the kept
    corpus; crashes would land in the temporary directory (the report names them)."""
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "h100x2").write_bytes(state.read(stage("h100", 2).root.state))
    (seeds / "t4").write_bytes(state.read(stage("t4").root.state))
    work = tmp_path / "work"
    work.mkdir()
    before = set(Path("/tmp").glob("mokka-fuzz-*"))
    res = subprocess.run(
        [
            str(fuzz_target),
            "-max_total_time=15",
            "-max_len=200000",
            f"-artifact_prefix={work}/",
            str(seeds),
            str(NATIVE / "fuzz" / "corpus"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(work.iterdir()) == [], "the fuzzer left artifacts"
    assert set(Path("/tmp").glob("mokka-fuzz-*")) == before


def test_profile_limits_match_the_layout() -> None:
    from gpumodel import profile

    assert state.const("MOKKA_MAX_GPUS") == profile.MAX_GPUS
    assert state.const("MOKKA_MAX_GFX_CLOCKS") == profile.MAX_GRAPHICS_CLOCKS


def test_cli_gpu_limit_matches_the_profile_model() -> None:
    from gpumodel import profile
    from mokka.cli import root as cli

    assert cli.MAX_GPUS == profile.MAX_GPUS
