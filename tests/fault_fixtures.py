"""A private mock node per test for fault injection (faults change the state: never share it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from gpumodel import driver_root, faults, profile


class FaultNode(Staged):
    """A driver root of its own, with its fault target and the `mokka fault` command."""

    @property
    def target(self) -> faults.Target:
        return faults.for_driver_root(self.root.root)

    @property
    def state_bytes(self) -> bytes:
        return self.root.library.read_bytes()

    @property
    def kernel_log(self) -> str:
        log = self.target.kernel_log
        return log.read_text() if log is not None and log.exists() else ""

    def fault(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mokka.cli", "fault", *args, "--driver-root", str(self.root.root)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise AssertionError(f"mokka fault {' '.join(args)} exited {res.returncode}: {res.stderr}")
        return res

    def smi(self, smi: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([str(smi), *args], check=check)


@pytest.fixture
def fault_node(tmp_path: Path) -> Callable[..., FaultNode]:
    def make(name: str = "h100", gpus: int | None = 4) -> FaultNode:
        prof = profile.load(name).with_count(gpus)
        out = tmp_path / f"node-{name}-{gpus}"
        return FaultNode(driver_root.stage(prof, out), prof)

    return make
