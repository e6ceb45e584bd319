"""The journal's file: what host changes were recorded, kept so that no kill can lose track.

A JSON-lines file: a header (format, what it records, ``home``: the directories the journal
had to create for itself), then ``{"begin": entry}``, ``{"done": seq}`` and
``{"undone": seq[, "paths": [...]]}`` records, each appended (and, but for completions,
fdatasync'd) before the caller goes on. A torn last line (the process died while appending)
is ignored, and cut off before the next append: its change had not started. The home
directories are built under a temporary name and renamed into place with the journal already
inside; ``teardown`` renames them away again.
Leftover temporaries of either (``.<name>.mokka-*`` next to the first missing directory, or
next to the journal) are swept whenever the journal is opened. ``compact`` rewrites the file
(atomically) as its live entries only.

``MOKKA_JOURNAL_KILL_AT=N`` makes the process SIGKILL itself at its Nth step boundary (after each
record, between the parts of a change): the kill-injection test's hook.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from gpumodel import atomic

FORMAT = 1
KILL_ENV = "MOKKA_JOURNAL_KILL_AT"
KINDS = ("create", "replace", "update")
LOCK_WAIT_S = 60.0


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


def remove_path(path: Path, *, tree: bool) -> bool:
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


def lock_directory(path: Path, wait: float | None = None) -> int:
    """An exclusive flock on directory ``path`` (its inode: it survives a rename); the fd holds it.
    Waits up to ``wait`` seconds (default ``LOCK_WAIT_S``) for another holder."""
    wait = LOCK_WAIT_S if wait is None else wait
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise JournalError(
                    f"{path}: another mokka is changing this host (waited {wait:.0f} s for its lock)"
                ) from None
            time.sleep(0.05)


class JournalFile:
    """The record of one owner's changes (host setup under a root, one containerd config), on disk."""

    def __init__(self, file: Path, what: str, home: list[str]) -> None:
        self.file = file
        self.what = what
        self.home = home  # directories the journal created for itself, outermost first
        self.entries: dict[int, Entry] = {}  # live create/replace entries by seq
        self.pending: dict[int, Entry] = {}  # update entries not yet done
        self.next_seq = 1
        self.kept: set[str] = set()  # paths this run produced
        self.swept: list[str] = []  # leftovers of a killed run removed on opening
        self.obsolete = 0  # records a compaction would drop
        self._fd: int | None = None
        self._length = 0  # bytes of complete records read
        self._locks: list[int] = []  # directory locks held until close
        self.exists = True  # False: there is no journal (nothing recorded)

    # ---- opening ------------------------------------------------------------------

    @classmethod
    def read(cls, file: Path) -> Self | None:
        """The journal at ``file`` as recorded (nothing recovered, nothing written); None if absent."""
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise JournalError(f"{file}: cannot read the journal: {exc.strerror or exc}") from None
        return cls._parse(file, data)

    @classmethod
    def open_file(cls, file: Path, what: str | None) -> Self:
        """Lock, sweep a killed run's leftovers, and open the journal for appending; with ``what``,
        create it when there is none (else return one that does not ``exists``).

        The lock (flock on the nearest existing directory, and on the journal's own directory)
        is held until :meth:`close`: a second Mokka waits for the first.
        """
        anchor, _ = first_existing(file.parent)
        if not anchor.is_dir():
            raise JournalError(f"{file}: {anchor} is not a directory")
        locks = [lock_directory(anchor)]
        try:
            swept = cls.sweep(file)
            journal = cls.read(file)
            if journal is None and what is not None:
                journal = cls.bootstrap(file, what, locks)
            elif journal is None:
                journal = cls(file, "", [])
                journal.exists = False
            else:
                journal._fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                if os.fstat(journal._fd).st_size > journal._length:
                    os.ftruncate(journal._fd, journal._length)  # drop a torn last record before appending
                if file.parent != anchor:  # made meanwhile by a Mokka we waited for
                    locks.append(lock_directory(file.parent))
        except BaseException:
            for fd in locks:
                os.close(fd)
            raise
        journal._locks = locks
        journal.swept = swept
        return journal

    @staticmethod
    def sweep(file: Path) -> list[str]:
        """Remove temporaries of the journal and of its home left by a killed process."""
        parent, missing = first_existing(file.parent)
        child = missing[0] if missing else file
        if not parent.is_dir():
            return []
        found = sorted(parent.glob(atomic.temp_glob(child)))
        for path in found:
            remove_path(path, tree=True)
        return [f"removed leftover {p}" for p in found]

    @classmethod
    def _parse(cls, file: Path, data: bytes) -> Self:
        lines = data.split(b"\n")
        complete = lines[:-1]  # the last piece is empty, or a record torn by a kill: never acted upon
        length = len(data) - len(lines[-1])

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
            or not all(isinstance(h, str) and os.path.isabs(h) for h in header["home"])
        ):
            raise corrupt(1, f"not a Mokka journal header (format {FORMAT})")
        journal = cls(file, str(header.get("what", "")), list(header["home"]))
        journal._length = length
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
    def bootstrap(cls, file: Path, what: str, locks: list[int]) -> Self:
        """Create the journal; missing directories above it are built under a temporary name, journal
        inside, its directory locked (added to ``locks``) before the rename makes it visible."""
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
            locks.append(lock_directory(inner))
            checkpoint()
            os.rename(top, missing[0])
            atomic.fsync_dir(parent)
        checkpoint()
        journal._fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return journal

    def _header(self) -> dict[str, Any]:
        return {"mokka-journal": FORMAT, "what": self.what, "home": self.home}

    def close(self) -> None:
        """Stop appending and release the locks."""
        self._close_file()
        while self._locks:
            os.close(self._locks.pop())

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ---- bookkeeping --------------------------------------------------------------

    def _append(self, record: dict[str, Any], *, sync: bool = True) -> None:
        """Append one record; ``sync``: durable before returning (intents must be; a completion
        lost to a power cut only makes the next run roll a finished change back and redo it)."""
        assert self._fd is not None, "journal not open for changes"
        os.write(self._fd, _line(record).encode())
        if sync:
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
        self._append({"done": entry.seq}, sync=False)  # the next intent's sync carries it
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

    def compact(self) -> None:
        """Rewrite the journal as its live entries only (atomically)."""
        if not self.obsolete or self._fd is None:
            return
        lines = [_line(self._header())]
        for entry in [*self.entries.values(), *self.pending.values()]:
            lines.append(_line({"begin": entry.record()}))
            if entry.done:
                lines.append(_line({"done": entry.seq}))
        self._close_file()
        atomic.write(self.file, "".join(lines).encode(), 0o600)
        checkpoint()
        self._fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.obsolete = 0

    # ---- teardown------------------------------------------------------------------

    def teardown(self) -> list[str]:
        """Remove the journal (nothing may be left in it) and the directories it made for itself."""
        assert not self.entries and not self.pending, "teardown of a journal that still lists changes"
        self._close_file()
        if not self.exists:
            return []
        self.exists = False
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
