"""Run the helper programs of the containers Mokka runs (ldd, ctr, podman, busybox); a failure is a
:class:`SandboxError`."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CALL_TIMEOUT", "SandboxError", "run"]

CALL_TIMEOUT = 60.0


class SandboxError(RuntimeError):
    """A private containerd, podman run or image build could not be set up, driven, or cleaned up."""


def run(
    argv: Sequence[str | Path], *, timeout: float = CALL_TIMEOUT, check: bool = True, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` capturing its output; with ``check``, a non-zero exit raises with the program's last words."""
    cmd = [str(a) for a in argv]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{' '.join(cmd)}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise SandboxError(f"{cmd[0]}: {exc}") from None
    if check and res.returncode != 0:
        detail = (res.stderr.strip() or res.stdout.strip())[-2000:]
        raise SandboxError(f"{' '.join(cmd)}: exit {res.returncode}: {detail}")
    return res
