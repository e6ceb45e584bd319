"""The one atomic writer: replace a file or a symbolic link in one rename.

The new content goes to a temporary beside the target (same directory, so the rename is
atomic) under an unpredictable name opened with ``O_EXCL | O_NOFOLLOW``: nobody can plant a
file or link there first. The file is fsynced before the rename and the directory after it.
A replaced file keeps its owner and, unless a mode is given, its mode. Temporaries are named
``.<name>.mokka-<random>`` (``temp_path``); ``tmp_suffix=True`` appends ``.tmp`` for
directories whose watchers skip such names (CDI spec directories). A caller that must
find a temporary again after being killed (the host-setup journal) picks the name first
with ``temp_path`` and passes it in.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

TEMP_MARK = ".mokka-"


def temp_path(path: Path, *, tmp_suffix: bool = False) -> Path:
    """An unpredictable temporary name beside ``path``: ``.<name>.mokka-<16 hex>[.tmp]``."""
    return path.with_name(f".{path.name}{TEMP_MARK}{secrets.token_hex(8)}{'.tmp' if tmp_suffix else ''}")


def temp_glob(path: Path) -> str:
    """A glob pattern (relative to ``path``'s directory) matching every ``temp_path(path)``."""
    return f".{path.name}{TEMP_MARK}*"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _current_owner(path: Path) -> os.stat_result | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def write(
    path: Path,
    data: bytes,
    mode: int | None = None,
    *,
    owner: tuple[int, int] | None = None,
    tmp: Path | None = None,
    tmp_suffix: bool = False,
    durable: bool = True,
) -> None:
    """Replace ``path`` by a file holding ``data``.

    ``mode``: the new file's permission bits (default: those of the file it replaces, else 0644).
    ``owner``: (uid, gid) for the new file (default: those of the file it replaces, else the
    process's). ``tmp``: the temporary to use (default: a fresh ``temp_path``). ``durable=False``
    skips the fsyncs.
    """
    old = _current_owner(path)
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old else 0o644
    if owner is None and old is not None:
        owner = (old.st_uid, old.st_gid)
    tmp = tmp or temp_path(path, tmp_suffix=tmp_suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                with contextlib.suppress(PermissionError):
                    os.fchown(fh.fileno(), *owner)
            os.fchmod(fh.fileno(), mode)
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def symlink(path: Path, target: str, *, tmp: Path | None = None, durable: bool = True) -> None:
    """Point ``path`` at ``target`` through a temporary link and a rename."""
    tmp = tmp or temp_path(path)
    os.symlink(target, tmp)  # fails if the name exists: never follows or reuses anything
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
