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

The journal is a JSON-lines file: a header, then ``{"begin": entry}``, ``{"done": seq}`` and
``{"undone": seq[, "paths": [...]]}`` records. A torn last line (the process died while
appending) is ignored: its change had not started. The directories the journal had to create
for itself (``home``) are built under a temporary name and renamed into place with the journal
already inside; the last undo renames them away again. Leftover temporaries of either
(``.<name>.mokka-*`` next to the first missing directory) are swept whenever the journal is
opened.

``MOKKA_JOURNAL_KILL_AT=N`` makes the process SIGKILL itself at its Nth step boundary (before
and after each record, between the parts of a change): the kill-injection test's hook.
"""

from __future__ import annotations

import errno
import filecmp
import hashlib
import json
import os
import shutil
import signal
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumodel import atomic

FORMAT = 1
KILL_ENV = "MOKKA_JOURNAL_KILL_AT"
KINDS = ("create", "replace", "update")


class JournalError(Exception):
    """A change could not be made or undone, or the journal is unreadable; the message names the path."""


_steps = 0


def checkpoint() -> None:
    """A step boundary: where the kill-injection test may stop the process (``MOKKA_JOURNAL_KILL_AT``)."""
    global _steps
    at = os.environ.get(KILL_ENV)
    if not at:
        return
    _steps += 1
    if _steps == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        return sha256(path.read_bytes())
    except OSError:
        return None


@dataclass
class Entry:
    """One change. ``create``: ``paths`` did not exist (undo removes them, newest first);
    ``replace``: ``paths[0]`` existed, its original is hard-linked at ``backup`` (undo renames it
    back); ``update``: a rewrite of a path entry ``base`` already owns (undo: nothing of its own).
    ``temps`` never outlive the change; ``sha`` is the content written (files), ``meta`` the
    owner's notes (the containerd config's key edits); ``tree``: directories go whole."""

    seq: int
    kind: str
    paths: list[str]
    temps: list[str] = field(default_factory=list)
    backup: str | None = None
    base: int | None = None
    sha: str | None = None
    meta: dict[str, Any] | None = None
    tree: bool = False
    done: bool = False

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "kind": self.kind, "paths": self.paths}
        for key in ("temps", "backup", "base", "sha", "meta", "tree"):
            value = getattr(self, key)
            if value:
                out[key] = value
        return out

    @classmethod
    def from_record(cls, data: Any) -> Entry:
        if not isinstance(data, dict):
            raise ValueError("an entry must be an object")
        entry = cls(**{k: v for k, v in data.items() if k != "done"})
        ok = (
            isinstance(entry.seq, int)
            and entry.kind in KINDS
            and isinstance(entry.paths, list)
            and entry.paths
            and all(isinstance(p, str) and os.path.isabs(p) for p in [*entry.paths, *entry.temps])
            and isinstance(entry.temps, list)
            and (entry.backup is None or isinstance(entry.backup, str))
            and (entry.base is None or isinstance(entry.base, int))
            and (entry.kind != "replace" or (entry.backup is not None and len(entry.paths) == 1))
            and (entry.kind != "update" or entry.base is not None)
            and (entry.meta is None or isinstance(entry.meta, dict))
        )
        if not ok:
            raise ValueError(f"malformed entry {data!r}")
        return entry


def first_existing(path: Path) -> tuple[Path, list[Path]]:
    """The nearest existing ancestor of ``path`` (or ``path``) and the missing directories below it."""
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    return probe, list(reversed(missing))


def _remove(path: Path, *, tree: bool) -> bool:
    """Remove ``path`` if it is there (a directory only when empty, unless ``tree``); True if removed."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        if tree:
            shutil.rmtree(path)
        else:
            path.rmdir()
    else:
        path.unlink()
    return True


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


class Journal:
    """The record of one owner's changes (host setup under a root, one containerd config)."""

    def __init__(self, file: Path, what: str, home: list[str]) -> None:
        self.file = file
        self.what = what
        self.home = home  # directories the journal created for itself, outermost first
        self.entries: dict[int, Entry] = {}  # live create/replace entries by seq
        self.pending: dict[int, Entry] = {}  # update entries not yet done
        self.next_seq = 1
        self.kept: set[str] = set()  # paths this run produced (``prune`` reverts the others)
        self.swept: list[str] = []  # leftovers of a killed run removed on opening
        self.recovered: list[str] = []  # interrupted changes rolled back (or completed) on opening
        self.obsolete = 0  # records a compaction would drop
        self._fd: int | None = None

    # ---- opening ------------------------------------------------------------------

    @classmethod
    def read(cls, file: Path) -> Journal | None:
        """The journal at ``file`` as recorded (nothing recovered, nothing written); None if absent."""
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise JournalError(f"{file}: cannot read the journal: {exc.strerror or exc}") from None
        return cls._parse(file, data)

    @classmethod
    def open(cls, file: Path, what: str) -> Journal:
        """Open for changes, creating the journal (and its home) if needed; an interrupted change is rolled back."""
        swept = cls.sweep(file)
        journal = cls.open_existing(file) or cls._bootstrap(file, what)
        journal.swept = swept
        return journal

    @classmethod
    def open_existing(cls, file: Path) -> Journal | None:
        """Open an existing journal for changes, rolling back an interrupted change; None when there is none.

        Call :meth:`sweep` first: a killed process may have left temporaries of the journal itself.
        """
        journal = cls.read(file)
        if journal is None:
            return None
        journal._fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        journal.recovered = journal.recover()
        return journal

    @staticmethod
    def sweep(file: Path) -> list[str]:
        """Remove temporaries of the journal and of its home left by a killed process."""
        parent, missing = first_existing(file)
        child = missing[0] if missing else file
        if not parent.is_dir():
            return []
        found = sorted(parent.glob(atomic.temp_glob(child)))
        for path in found:
            _remove(path, tree=True)
        return [f"removed leftover {p}" for p in found]

    @classmethod
    def _parse(cls, file: Path, data: bytes) -> Journal:
        lines = data.split(b"\n")
        complete = lines[:-1]  # the last piece is empty, or a record torn by a kill: never acted upon

        def corrupt(n: int, why: str) -> JournalError:
            return JournalError(
                f"{file}: corrupt journal (line {n}: {why}); check what it lists, then move it away by hand"
            )

        if not complete:
            raise corrupt(1, "no header")
        try:
            header = json.loads(complete[0])
        except ValueError as exc:
            raise corrupt(1, f"not JSON: {exc}") from None
        if (
            not isinstance(header, dict)
            or header.get("mokka-journal") != FORMAT
            or not isinstance(header.get("home"), list)
            or not all(isinstance(h, str) for h in header["home"])
        ):
            raise corrupt(1, f"not a Mokka journal header (format {FORMAT})")
        journal = cls(file, str(header.get("what", "")), list(header["home"]))
        for n, raw in enumerate(complete[1:], start=2):
            try:
                journal._replay(json.loads(raw))
            except (ValueError, TypeError, KeyError) as exc:
                raise corrupt(n, str(exc)) from None
        return journal

    def _replay(self, record: Any) -> None:
        if not isinstance(record, dict) or len({"begin", "done", "undone"} & record.keys()) != 1:
            raise ValueError(f"unknown record {record!r}")
        if "begin" in record:
            entry = Entry.from_record(record["begin"])
            if entry.seq < self.next_seq:
                raise ValueError(f"entry {entry.seq} out of order")
            self.next_seq = entry.seq + 1
            if entry.kind == "update":
                if entry.base not in self.entries:
                    raise ValueError(f"entry {entry.seq} updates unknown entry {entry.base}")
                self.pending[entry.seq] = entry
            else:
                self.entries[entry.seq] = entry
            return
        seq = record.get("done", record.get("undone"))
        if not isinstance(seq, int) or (seq not in self.entries and seq not in self.pending):
            raise ValueError(f"record for unknown entry {seq!r}")
        if "done" in record:
            self._mark_done(seq)
        else:
            paths = record.get("paths")
            if paths is not None and not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
                raise ValueError(f"malformed paths {paths!r}")
            self._forget(seq, paths)

    @classmethod
    def _bootstrap(cls, file: Path, what: str) -> Journal:
        """Create the journal; missing directories above it are built under a temporary name, journal inside."""
        parent, missing = first_existing(file.parent)
        if not parent.is_dir():
            raise JournalError(f"{file}: {parent} is not a directory")
        journal = cls(file, what, [str(d) for d in missing])
        header = _line(journal._header()).encode()
        if not missing:
            atomic.write(file, header, 0o600)
        else:
            top = atomic.temp_path(missing[0])
            os.mkdir(top, 0o755)
            os.chmod(top, 0o755)
            inner = top
            for d in missing[1:]:
                inner = inner / d.name
                os.mkdir(inner, 0o755)
                os.chmod(inner, 0o755)
            atomic.write(inner / file.name, header, 0o600)
            checkpoint()
            os.rename(top, missing[0])
            atomic.fsync_dir(parent)
        checkpoint()
        journal._fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return journal

    def _header(self) -> dict[str, Any]:
        return {"mokka-journal": FORMAT, "what": self.what, "home": self.home}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ---- bookkeeping --------------------------------------------------------------

    def _append(self, record: dict[str, Any]) -> None:
        assert self._fd is not None, "journal not open for changes"
        os.write(self._fd, _line(record).encode())
        os.fdatasync(self._fd)
        checkpoint()

    def _begin(self, entry: Entry) -> Entry:
        self._append({"begin": entry.record()})
        if entry.kind == "update":
            self.pending[entry.seq] = entry
        else:
            self.entries[entry.seq] = entry
        self.next_seq = entry.seq + 1
        return entry

    def _new(self, kind: str, paths: Sequence[Path], **kw: Any) -> Entry:
        return Entry(self.next_seq, kind, [str(p) for p in paths], **kw)

    def _done(self, entry: Entry) -> None:
        self._append({"done": entry.seq})
        self._mark_done(entry.seq)

    def _mark_done(self, seq: int) -> None:
        if seq in self.pending:
            update = self.pending.pop(seq)
            assert update.base is not None
            base = self.entries[update.base]
            base.sha = update.sha if update.sha is not None else base.sha
            base.meta = update.meta if update.meta is not None else base.meta
            self.obsolete += 2
        else:
            self.entries[seq].done = True

    def _undone(self, seq: int, paths: list[str] | None = None) -> None:
        record: dict[str, Any] = {"undone": seq}
        if paths is not None:
            record["paths"] = paths
        self._append(record)
        self._forget(seq, paths)

    def _forget(self, seq: int, paths: list[str] | None) -> None:
        self.obsolete += 3
        if seq in self.pending:
            del self.pending[seq]
            return
        entry = self.entries[seq]
        if paths is not None:
            entry.paths = [p for p in entry.paths if p not in paths]
        if paths is None or not entry.paths:
            del self.entries[seq]
            for useq in [s for s, u in self.pending.items() if u.base == seq]:
                del self.pending[useq]

    def owner(self, path: Path) -> Entry | None:
        """The live entry that created or replaced ``path``."""
        p = str(path)
        for entry in reversed(self.entries.values()):
            if p in entry.paths:
                return entry
        return None

    def owns(self, path: Path) -> bool:
        return self.owner(path) is not None

    def keep(self, path: Path) -> None:
        """Mark ``path`` (and its parents) as produced by this run."""
        p = Path(path)
        while str(p) not in self.kept and p != p.parent:
            self.kept.add(str(p))
            p = p.parent

    # ---- recovery and compaction --------------------------------------------------

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
                _remove(Path(tmp), tree=True)
            if entry.kind == "update" and entry.sha is not None and _file_sha(path) == entry.sha:
                self._done(entry)  # the rename happened: the change is complete
                out.append(f"completed interrupted change of {path}")
                continue
            self._revert(entry, entry.paths)
            self._undone(entry.seq)
            out.append(f"rolled back interrupted change of {path}")
        return out

    def compact(self) -> None:
        """Rewrite the journal as its live entries only (atomically)."""
        if not self.obsolete or self._fd is None:
            return
        lines = [_line(self._header())]
        for entry in [*self.entries.values(), *self.pending.values()]:
            lines.append(_line({"begin": entry.record()}))
            if entry.done:
                lines.append(_line({"done": entry.seq}))
        self.close()
        atomic.write(self.file, "".join(lines).encode(), 0o600)
        checkpoint()
        self._fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.obsolete = 0

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
            _remove(Path(tmp), tree=True)
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
                    if _remove(path, tree=entry.tree):
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

    def teardown(self) -> list[str]:
        """Remove the journal (nothing may be left in it) and the directories it made for itself."""
        assert not self.entries and not self.pending, "teardown of a journal that still lists changes"
        self.close()
        home = [Path(h) for h in self.home]
        for i, top in enumerate(home):
            if self._holds_only_journal(home[i:]):
                gone = atomic.temp_path(top)
                os.rename(top, gone)
                atomic.fsync_dir(top.parent)
                checkpoint()
                shutil.rmtree(gone)
                return [f"removed {top}/"]
        self.file.unlink(missing_ok=True)
        atomic.fsync_dir(self.file.parent)
        return []

    def _holds_only_journal(self, chain: Sequence[Path]) -> bool:
        for i, d in enumerate(chain):
            expect = chain[i + 1].name if i + 1 < len(chain) else self.file.name
            try:
                if [p.name for p in d.iterdir()] != [expect]:
                    return False
            except OSError:
                return False
        return True


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
