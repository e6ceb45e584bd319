"""`pip install .` builds the native libraries into the wheel; the installed command works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed import nvidia_smi

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_pip_install_builds_and_ships_the_native_libraries(tmp_path: Path) -> None:
    src = tmp_path / "src"
    subprocess.run(["git", "clone", "-q", str(REPO), str(src)], check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    bundled = list(venv.glob("lib/python3*/site-packages/gpumodel/_native"))
    assert bundled and {p.name for p in bundled[0].iterdir()} >= {
        "libnvidia-ml.so",
        "libcuda.so",
        "libmokka-state.so",
        "libmokka-sysfs.so",
        "mokka_state.h",
    }
    root = tmp_path / "root"
    res = subprocess.run(
        [str(venv / "bin/mokka"), "driver-root", "--profile", "t4", "--out", str(root)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    smi = nvidia_smi.fetch("550")
    out = subprocess.run(
        [str(smi), "-L"], env={"LD_LIBRARY_PATH": str(root / "usr/lib64")}, capture_output=True, text=True
    ).stdout
    assert out.startswith("GPU 0: Tesla T4 (UUID: GPU-")
