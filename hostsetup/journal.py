"""One crash-safe journal for every change Mokka makes to a host: files, links, directories,
device nodes, whole trees, the containerd config.

Write-ahead: each change is recorded as an *intent* (appended and fdatasync'd) before anything
is touched, and marked *done* afterwards. The intent names everything the change may leave
behind: the path, the temporary it is built under (an unpredictable name picked before it
exists, see :func:`gpumodel.atomic.temp_path`) and, for a path that existed, a hard link
to the original (its inode, so bytes, mode, owner and times come back exactly). So whatever
moment a process dies at, the next one that opens the journal knows what to look for:

* an intent without its completion is rolled back first (temporaries removed, a created
  path removed, an original linked back), or rolled forward when the new content is
  demonstrably in place (``sha``);
* ``undo`` then reverts the completed changes newest first, recording each as undone; every
  step is idempotent, so an interrupted undo is finished by the next one.

How the record is kept on disk (and swept, compacted, torn down) is :mod:`hostsetup.journal_file`'s job.
"""

from __future__ import annotations

import errno
import filecmp
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpumodel import atomic

from .journal_file import (
    KILL_ENV,
    Entry,
    JournalError,
    JournalFile,
    checkpoint,
    first_existing,
    remove_path,
    sha256,
)

__all__ = ["KILL_ENV", "Entry", "Journal", "JournalError", "checkpoint", "sha256"]


def _file_sha(path: Path) -> str | None:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        return sha256(path.read_bytes())
    except OSError:
        return None


def same_tree(a: Path, b: Path) -> bool:
    """Whether two directory trees hold the same names, types, modes, link targets and bytes."""
    for (da, dirs_a, files_a), (db, dirs_b, files_b) in zip(os.walk(a), os.walk(b), strict=False):
        if sorted(dirs_a) != sorted(dirs_b) or sorted(files_a) != sorted(files_b):
            return False
        dirs_a.sort()
        dirs_b.sort()
        for name in files_a + dirs_a:
            pa, pb = Path(da) / name, Path(db) / name
            sa, sb = pa.lstat(), pb.lstat()
            if sa.st_mode != sb.st_mode:
                return False
            if stat.S_ISLNK(sa.st_mode):
                if os.readlink(pa) != os.readlink(pb):
                    return False
            elif stat.S_ISREG(sa.st_mode) and not filecmp.cmp(pa, pb, shallow=False):
                return False
    return True


class Journal(JournalFile):
    """Host changes made through the journal, recovered after a kill, and undone."""

    def __init__(self, file: Path, what: str, home: list[str]) -> None:
        super().__init__(file, what, home)
        self.recovered: list[str] = []  # interrupted changes rolled back (or completed) on opening

    # ---- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, file: Path, what: str | None = None) -> Journal:
        """Lock, sweep leftovers and open the journal, rolling back an interrupted change; with
        ``what``, create it when there is none. ``close`` releases the lock."""
        journal = cls.open_file(file, what)
        try:
            if journal.exists:
                journal.recovered = journal.recover()
        except BaseException:
            journal.close()
            raise
        return journal

    # ---- recovery -----------------------------------------------------------------

    def recover(self) -> list[str]:
        """Roll back (or, where the new content is already in place, complete) interrupted changes."""
        out = []
        for entry in sorted([*self.entries.values(), *self.pending.values()], key=lambda e: -e.seq):
            if entry.done:
                continue
            path = Path(entry.paths[0])
            if entry.kind == "update" and entry.tree and len(entry.temps) == 2:
                old = Path(entry.temps[1])
                if not os.path.lexists(path) and os.path.lexists(old):
                    os.rename(old, path)  # killed between moving the old tree out and the new one in
            for tmp in entry.temps:
                remove_path(Path(tmp), tree=True)
            if entry.kind == "update" and entry.sha is not None and _file_sha(path) == entry.sha:
                self._done(entry)  # the rename happened: the change is complete
                out.append(f"completed interrupted change of {path}")
                continue
            self._revert(entry, entry.paths)
            self._undone(entry.seq)
            out.append(f"rolled back interrupted change of {path}")
        return out

    # ---- changes ------------------------------------------------------------------

    def mkdir(self, path: Path, mode: int = 0o755) -> None:
        """Create ``path`` and any missing parents (recorded as one change)."""
        self.keep(path)
        parent, missing = first_existing(path)
        if not parent.is_dir():
            raise JournalError(f"{path}: {parent} is in the way (not a directory)")
        if not missing:
            return
        entry = self._begin(self._new("create", missing))
        for d in missing:
            d.mkdir(mode)
            os.chmod(d, mode)
            checkpoint()
        self._done(entry)

    def write(
        self,
        path: Path,
        data: bytes,
        mode: int = 0o644,
        *,
        owner: tuple[int, int] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> bool:
        """Make ``path`` a file holding ``data`` (atomically); return whether anything changed.

        ``owner``: (uid, gid) of a new file (default: the process's); a replaced file keeps its owner.
        """
        self.mkdir(path.parent)
        self.keep(path)
        st = _lstat(path)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise JournalError(f"{path}: a directory is in the way")
        if (
            st is not None
            and stat.S_ISREG(st.st_mode)
            and stat.S_IMODE(st.st_mode) == mode
            and st.st_size == len(data)
            and path.read_bytes() == data
        ):
            return False
        entry = self._prepare(path, st, sha=sha256(data), meta=meta)
        atomic.write(path, data, mode, owner=None if st is not None else owner, tmp=Path(entry.temps[0]))
        self._done(entry)
        return True

    def symlink(self, path: Path, target: str) -> bool:
        """Make ``path`` a symbolic link to ``target`` (atomically); return whether anything changed."""
        self.mkdir(path.parent)
        self.keep(path)
        st = _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(path) == target:
            return False
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise JournalError(f"{path}: a directory is in the way of the link to {target}")
        entry = self._prepare(path, st)
        atomic.symlink(path, target, tmp=Path(entry.temps[0]))
        self._done(entry)
        return True

    def _prepare(
        self, path: Path, st: os.stat_result | None, sha: str | None = None, meta: dict[str, Any] | None = None
    ) -> Entry:
        """Record the intent to put something new at ``path``; for a path not ours, link its original away first."""
        tmp = atomic.temp_path(path)
        owner = self.owner(path)
        if owner is not None:
            return self._begin(self._new("update", [path], temps=[str(tmp)], base=owner.seq, sha=sha, meta=meta))
        if st is None:
            return self._begin(self._new("create", [path], temps=[str(tmp)], sha=sha, meta=meta))
        backup = atomic.temp_path(path)
        entry = self._begin(self._new("replace", [path], temps=[str(tmp)], backup=str(backup), sha=sha, meta=meta))
        os.link(path, backup, follow_symlinks=False)  # the original inode: bytes, mode, owner, times
        atomic.fsync_dir(path.parent)  # the original's second name is durable before the first is reused
        checkpoint()
        return entry

    def mknods(self, nodes: Iterable[tuple[Path, int, int, int]]) -> int:
        """Make character devices ``(path, major, minor, mode)``; new ones are one change. Return how many changed."""
        nodes = list(nodes)
        fresh, changed = [], []
        for path, major, minor, mode in nodes:
            self.mkdir(path.parent)
            self.keep(path)
            st = _lstat(path)
            if st is None:
                fresh.append((path, major, minor, mode))
            elif not (
                stat.S_ISCHR(st.st_mode)
                and os.major(st.st_rdev) == major
                and os.minor(st.st_rdev) == minor
                and stat.S_IMODE(st.st_mode) == mode
            ):
                if not self.owns(path):
                    raise JournalError(f"{path}: exists and is not Mokka's device node; refusing to replace it")
                changed.append((path, major, minor, mode))
        if fresh:
            entry = self._begin(self._new("create", [p for p, *_ in fresh]))
            for path, major, minor, mode in fresh:
                _mknod(path, major, minor, mode)
                checkpoint()
            self._done(entry)
        for path, major, minor, mode in changed:
            entry = self._prepare(path, _lstat(path))
            tmp = Path(entry.temps[0])
            _mknod(tmp, major, minor, mode)
            os.replace(tmp, path)
            self._done(entry)
        return len(fresh) + len(changed)

    def install_tree(self, path: Path, build: Callable[[Path], None]) -> bool:
        """Make ``path`` the directory tree ``build(tmp)`` writes into an empty directory, moved in whole.

        A tree identical to the one in place is dropped (the installed one, maybe bind-mounted
        into containers, stays). Returns whether anything changed.
        """
        self.mkdir(path.parent)
        self.keep(path)
        owner = self.owner(path)
        exists = os.path.lexists(path)
        if exists and owner is None:
            raise JournalError(f"{path}: exists and was not made by Mokka; refusing to replace it")
        tmp = atomic.temp_path(path)
        if owner is None:
            entry = self._begin(self._new("create", [path], temps=[str(tmp)], tree=True))
        else:
            old = atomic.temp_path(path)
            entry = self._begin(self._new("update", [path], temps=[str(tmp), str(old)], base=owner.seq, tree=True))
        os.mkdir(tmp, 0o755)
        os.chmod(tmp, 0o755)
        build(tmp)
        checkpoint()
        if exists and same_tree(tmp, path):
            shutil.rmtree(tmp)
            self._done(entry)
            return False
        if exists:
            os.rename(path, old)
            checkpoint()
        os.rename(tmp, path)
        checkpoint()
        if exists:
            shutil.rmtree(old)
        self._done(entry)
        return True

    def settle(self, entry: Entry, data: bytes | None) -> None:
        """Leave ``data`` (None: whatever is there) at the entry's path for good and forget the
        entry and its saved original."""
        path = Path(entry.paths[0])
        if data is not None and _file_sha(path) != sha256(data):
            update = self._prepare(path, _lstat(path), sha=sha256(data))
            atomic.write(path, data, tmp=Path(update.temps[0]))
            self._done(update)
        if entry.backup:
            Path(entry.backup).unlink(missing_ok=True)
            checkpoint()
        self._undone(entry.seq)

    # ---- undo ---------------------------------------------------------------------

    def _revert(self, entry: Entry, paths: Sequence[str]) -> list[str]:
        """Put ``paths`` of ``entry`` back as they were before it; idempotent."""
        done: list[str] = []
        for tmp in entry.temps:
            remove_path(Path(tmp), tree=True)
        if entry.kind == "replace":
            assert entry.backup is not None
            path, backup = Path(entry.paths[0]), Path(entry.backup)
            if os.path.lexists(backup):
                current = _lstat(path)
                if current is not None and os.path.samestat(current, backup.lstat()):
                    backup.unlink()  # never replaced (rename between two links of one inode does nothing)
                else:
                    os.replace(backup, path)
                    done.append(f"restored {path}")
            elif entry.done:
                done.append(f"could not restore {path}: its saved original {backup} is gone")
        elif entry.kind == "create":
            for p in reversed(paths):
                path = Path(p)
                try:
                    if remove_path(path, tree=entry.tree):
                        done.append(f"removed {path}")
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    done.append(f"kept {path}: not empty")
                checkpoint()
        return done

    def undo_entry(self, entry: Entry) -> list[str]:
        done = self._revert(entry, entry.paths)
        self._undone(entry.seq)
        return done

    def undo(self, since: int = 0) -> list[str]:
        """Revert the changes recorded from seq ``since`` on, newest first; return what was done."""
        done = self.recover()
        for entry in sorted(self.entries.values(), key=lambda e: -e.seq):
            if entry.seq >= since:
                done += self.undo_entry(entry)
        return done

    def prune(self) -> list[str]:
        """Revert everything earlier runs made that this run did not produce (``keep``)."""
        done: list[str] = []
        for entry in sorted(self.entries.values(), key=lambda e: -e.seq):
            stale = [p for p in entry.paths if p not in self.kept]
            if stale:
                done += self._revert(entry, stale)
                self._undone(entry.seq, None if len(stale) == len(entry.paths) else stale)
        return done


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def _mknod(path: Path, major: int, minor: int, mode: int) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    except PermissionError:
        raise JournalError(f"{path}: cannot create a device node (needs root or CAP_MKNOD)") from None
    os.chmod(path, mode)
