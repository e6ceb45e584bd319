"""MIG under the ASan/UBSan build of the library: nvidia-smi's whole MIG session, and a state whose
MIG tables and layout are garbage (counts past every bound, indices out of range, names without
an end), must not touch memory they do not own."""

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
    return libdir


def sanitized(smi: tuple[str, Path], libdir: Path, staged: Staged, *args: str) -> subprocess.CompletedProcess[str]:
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
    }
    res = subprocess.run([str(smi[1]), *args], env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR: AddressSanitizer" not in res.stderr and "runtime error" not in res.stderr, res.stderr[-3000:]
    assert res.returncode >= 0, (args, res.returncode)
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
