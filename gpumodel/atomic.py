"""Replace a file or a symbolic link in one rename, so no reader sees it half-written.

The temporary sits beside the target (same directory, so the rename is atomic) under a
name that starts with a dot; it is removed again if anything fails.
"""

from __future__ import annotations

import os
from pathlib import Path


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.mokka-tmp.{os.getpid()}")


def write(path: Path, data: bytes, mode: int = 0o644, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (fsync'd first unless told not)."""
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def symlink(path: Path, target: str) -> None:
    """Point ``path`` at ``target`` through a temporary link and a rename."""
    tmp = _temporary(path)
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(target, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
