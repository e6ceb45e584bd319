"""Shared fixtures: staged driver roots and the real consumers; where the test tools are."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fetch import nvidia_smi
from gpumodel import driver_root, profile

SMI_VERSIONS = ["550", "535", "555"]

# parallel first: cluster_fixtures imports it (a plugin imported before pytest registers it is not rewritten)
pytest_plugins = ["parallel", "e2e_fixtures", "mig_fixtures", "cluster_fixtures", "fault_fixtures", "module_times"]

# Programs the test extras install into the interpreter's environment (.venv/bin), which is on
# no PATH when the suite runs as `.venv/bin/python -m pytest` (CI: PATH=/usr/sbin:/usr/bin:/sbin:/bin).
VENV_TOOLS = ("nvitop", "hadolint", "gpustat", "protoc-gen-python_betterproto")


def tool(name: str) -> str | None:
    """Path of program ``name``: the one beside this interpreter (its venv's bin/), else PATH's."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


class Staged:
    """A driver root on disk and a way to run programs against it with nothing else set."""

    def __init__(self, root: driver_root.DriverRoot, prof: profile.Profile) -> None:
        self.root = root
        self.profile = prof

    @property
    def libdir(self) -> Path:
        return self.root.libdir

    def env(self, **extra: str) -> dict[str, str]:
        # PYTHONMALLOC=debug: CPython checks every heap block, so a library writing past a
        # struct a Python binding allocated aborts the consumer instead of passing unnoticed.
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(self.libdir),
            "PYTHONMALLOC": "debug",
        }
        env.update(extra)
        return env

    def run(
        self, argv: list[str], check: bool = True, timeout: float = 60, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(argv, env=self.env(**extra), capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"{argv} exited {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}")
        return res

    def python(self, code: str, check: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-c", code], check=check, **extra)


@pytest.fixture(scope="session")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Staged]:
    made: dict[tuple[str, int | None], Staged] = {}

    def _stage(name: str = "h100", gpus: int | None = None) -> Staged:
        key = (name, gpus)
        if key not in made:
            prof = profile.load(name).with_count(gpus)
            out = tmp_path_factory.mktemp(f"root-{name}-{gpus or 'default'}")
            made[key] = Staged(driver_root.stage(prof, out), prof)
        return made[key]

    return _stage


@pytest.fixture(scope="session", params=SMI_VERSIONS)
def smi(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(version, path) of a real Debian nvidia-smi."""
    version = request.param
    try:
        return version, nvidia_smi.fetch(version)
    except Exception as exc:
        pytest.fail(f"cannot get Debian's nvidia-smi {version}: {exc}")
