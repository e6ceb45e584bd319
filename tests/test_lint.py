"""The habits the design asks for: ruff-clean, formatted, mypy-strict on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True)


def test_ruff_check() -> None:
    res = run("ruff", "check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    res = run("ruff", "format", "--check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_strict() -> None:
    res = run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr
