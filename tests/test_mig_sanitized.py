"""MIG under the ASan/UBSan build of the libraries: nvidia-smi's whole MIG session, and a state whose
MIG tables and layout are garbage (counts past every bound, indices out of range, names without
an end), must not touch memory they do not own; nor must the mock libcuda enumerating either."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Staged

from gpumodel import state

pytestmark = pytest.mark.consumers

NATIVE = Path(__file__).resolve().parent.parent / "native"


@pytest.fixture(scope="module")
def asan_libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("asan-mig")
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", "asan"], check=True)
    libdir = tmp_path_factory.mktemp("asan-lib")
    shutil.copy(build / "asan" / "libnvidia-ml.so", libdir / "libnvidia-ml.so.1")
    shutil.copy(build / "asan" / "libcuda.so", libdir / "libcuda.so.1")
    return libdir


def sanitized(smi: tuple[str, Path], libdir: Path, staged: Staged, *args: str) -> subprocess.CompletedProcess[str]:
    return run_sanitized([str(smi[1]), *args], libdir, staged)


def run_sanitized(argv: list[str], libdir: Path, staged: Staged, **extra: str) -> subprocess.CompletedProcess[str]:
    libasan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], check=True, capture_output=True, text=True
    ).stdout.strip()
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": str(libdir),
        "MOKKA_STATE": str(staged.root.library),  # the staged library's state, written in place
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        **extra,
    }
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR: AddressSanitizer" not in res.stderr and "runtime error" not in res.stderr, res.stderr[-3000:]
    assert res.returncode >= 0, (argv, res.returncode)
    return res


SESSION = [
    ["-i", "0", "-mig", "1"],
    ["mig", "-lgip"],
    ["mig", "-lgipp"],
    ["mig", "-cgi", "9,14,19,19", "-C"],
    ["mig", "-gi", "2", "-lcip"],
    ["mig", "-lgi"],
    ["mig", "-lci"],
    ["-L"],
    [],
    ["-q"],
    ["-q", "-x"],
    ["mig", "-dci"],
    ["mig", "-dgi"],
    ["-i", "0", "-mig", "0"],
]


def test_a_whole_mig_session(asan_libdir: Path, stage_mig: Callable[..., Staged], smi: tuple[str, Path]) -> None:
    staged = stage_mig("h100", 2)
    for args in SESSION:
        assert sanitized(smi, asan_libdir, staged, *args).returncode in (0, 6), args


def garbage(node: Any, gpus: Any) -> None:
    """MIG on, with tables and a layout no writer of Mokka's would produce."""
    for i in range(2):
        g = gpus[i]
        g.mig_current = 1
        m = g.mig
        m.n_profiles, m.max_devices, m.n_gis = 10**6, 10**6, 10**6
        for p in range(state.const("MOKKA_MIG_MAX_GI_PROFILES")):
            t = m.profiles[p]
            t.n_placements, t.n_ci_profiles, t.instance_count = 10**6, 10**6, 10**6
            t.memory_slices = 0 if p % 2 else 10**6
            state.ffi().memmove(t.name, b"x" * 32, 32)  # no terminating NUL
            for c in range(state.const("MOKKA_MIG_MAX_CI_PROFILES")):
                t.ci[c].n_placements, t.ci[c].slice_count = 10**6, 0
                state.ffi().memmove(t.ci[c].name, b"y" * 32, 32)
        for k in range(state.const("MOKKA_MIG_MAX_GIS")):
            gi = m.gis[k]
            gi.id, gi.profile, gi.n_cis = k if i else 99, 10**6, 10**6
            for c in range(state.const("MOKKA_MIG_MAX_CIS")):
                gi.ci[c].id, gi.ci[c].profile = c, 10**6
                state.ffi().memmove(gi.ci[c].uuid, b"MIG-" + b"z" * 44, 48)


def test_garbage_mig_tables_and_layout(
    asan_libdir: Path, stage_mig: Callable[..., Staged], smi: tuple[str, Path]
) -> None:
    staged = stage_mig("h100", 2)
    state.update(staged.root.library, garbage)
    for args in (
        ["-L"],
        [],
        ["-q"],
        ["-q", "-x"],
        ["mig", "-lgip"],
        ["mig", "-lgipp"],
        ["mig", "-lgi"],
        ["mig", "-lci"],
    ):
        sanitized(smi, asan_libdir, staged, *args)
    for args in (["mig", "-cgi", "19", "-C"], ["mig", "-dci"], ["mig", "-dgi"]):
        sanitized(smi, asan_libdir, staged, *args)


CUDA_ENUMERATION = r"""
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
print(cu.cuInit(0))
n = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(n))
for i in range(n.value):
    name = ctypes.create_string_buffer(256); cu.cuDeviceGetName(name, 256, i)
    uuid = ctypes.create_string_buffer(16); cu.cuDeviceGetUuid_v2(uuid, i)
    mem = ctypes.c_size_t(); cu.cuDeviceTotalMem_v2(ctypes.byref(mem), i)
    sms = ctypes.c_int(); cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, i)
    print(name.value[:80], uuid.raw.hex(), mem.value, sms.value)
"""


def test_libcuda_enumerates_mig_devices_sanitized(asan_libdir: Path, stage_mig: Callable[..., Staged]) -> None:
    """The mock libcuda's MIG enumeration (CUDA_VISIBLE_DEVICES' MIG forms too) over a sound layout
    and over the garbage one."""
    staged = stage_mig(
        "h100", 2, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb", "compute": ["1c.2g.20gb"] * 2}]
    )
    argv = [sys.executable, "-c", CUDA_ENUMERATION]
    sound = run_sanitized(argv, asan_libdir, staged, MOKKA_IGNORE_DEVICE_NODES="1")
    assert sound.stdout.splitlines()[0] == "0" and len(sound.stdout.splitlines()) == 5  # 2 GIs on each GPU
    gpu0 = staged.profile.devices()[0].uuid
    cvd = f"MIG-{gpu0}/2/0,{'x' * 300},1"
    run_sanitized(argv, asan_libdir, staged, MOKKA_IGNORE_DEVICE_NODES="1", CUDA_VISIBLE_DEVICES=cvd)
    state.update(staged.root.library, garbage)
    for cvd in ("", "MIG-" + "z" * 44, "0,1,MIG-GPU-x/99/0"):
        run_sanitized(argv, asan_libdir, staged, MOKKA_IGNORE_DEVICE_NODES="1", CUDA_VISIBLE_DEVICES=cvd)
