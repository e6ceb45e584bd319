"""The one atomic writer (gpumodel/atomic.py): exclusive, unpredictable temporaries; fsync of file
and directory; owner and mode kept; nothing left behind when a write fails."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from gpumodel import atomic


def test_temporary_names_are_unpredictable(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    names = {atomic.temp_path(target).name for _ in range(200)}
    assert len(names) == 200
    assert all(re.fullmatch(r"\.spec\.json\.mokka-[0-9a-f]{16}", n) for n in names)
    assert atomic.temp_path(target, tmp_suffix=True).name.endswith(".tmp")
    assert all(Path(tmp_path / n).match(atomic.temp_glob(target)) for n in names)


def test_a_planted_temporary_is_never_followed_or_reused(tmp_path: Path) -> None:
    """O_EXCL | O_NOFOLLOW: a file or link someone put at the temporary's name stops the write."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    target = tmp_path / "config.toml"
    target.write_bytes(b"old\n")
    planted = atomic.temp_path(target)
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic.write(target, b"new\n", tmp=planted)
    assert victim.read_bytes() == b"precious\n" and target.read_bytes() == b"old\n"
    assert planted.is_symlink()  # not ours: left alone
    with pytest.raises(FileExistsError):
        atomic.symlink(target, "elsewhere", tmp=planted)
    assert target.read_bytes() == b"old\n"


def test_the_old_predictable_name_does_not_matter(tmp_path: Path) -> None:
    target = tmp_path / "node.json"
    (tmp_path / f".node.json.mokka-tmp.{os.getpid()}").symlink_to(tmp_path / "elsewhere")
    atomic.write(target, b"{}\n")
    assert target.read_bytes() == b"{}\n" and not (tmp_path / "elsewhere").exists()


def test_owner_and_mode_are_kept_when_replacing(tmp_path: Path) -> None:
    target = tmp_path / "config.toml"
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(target, 4321, 4322)
    atomic.write(target, b"new\n")
    st = target.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and target.read_bytes() == b"new\n"
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (4321, 4322)
    atomic.write(target, b"newer\n", 0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    fresh = tmp_path / "fresh"
    old = os.umask(0o077)
    try:
        atomic.write(fresh, b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644


def test_file_and_directory_are_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic.write(tmp_path / "a", b"x")
    assert synced == ["file", "dir"]
    synced.clear()
    atomic.symlink(tmp_path / "b", "a")
    assert synced == ["dir"]
    synced.clear()
    atomic.write(tmp_path / "c", b"x", durable=False)
    assert synced == []


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "spec.json"
    target.write_bytes(b"old\n")
    seen: list[str] = []

    def failing_replace(src: Any, dst: Any) -> None:
        seen.append(Path(src).name)
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        atomic.write(target, b"new\n", tmp_suffix=True)
    with pytest.raises(OSError, match="No space"):
        atomic.symlink(tmp_path / "link", "spec.json")
    monkeypatch.undo()
    assert seen[0].endswith(".tmp")  # where a watcher must skip temporaries (CDI spec directories)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]
    assert target.read_bytes() == b"old\n"
