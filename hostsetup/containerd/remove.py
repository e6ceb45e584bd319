"""Planning the remove from the journal of the installs.

A file Mokka wrote and nobody touched since gets its original back byte for byte (its saved
inode), or is deleted if Mokka created it. A file edited since loses only Mokka's keys; if it
no longer parses, ``force`` restores the original and keeps the current file as
``*.mokka-saved``. A file Mokka created and someone edited since is kept as ``*.mokka-saved``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

import tomlkit
from tomlkit.items import Array

from ..journal import Entry, Journal, JournalError, sha256
from .errors import ConfigError
from .plan import Change, Plan, journal_path
from .tomldoc import MISSING, Doc, Op, get, parse, plain, read

SAVED_SUFFIX = ".mokka-saved"


def load_journal(config: Path) -> Journal | None:
    try:
        return Journal.read(journal_path(config))
    except JournalError as exc:
        raise ConfigError(str(exc)) from None


def file_entries(journal: Journal) -> list[Entry]:
    """The journal's completed file changes, newest first (the file importing the drop-in before the drop-in)."""
    return sorted((e for e in journal.entries.values() if e.sha is not None and e.done), key=lambda e: -e.seq)


def plan_remove(config: Path, *, force: bool = False) -> Plan:
    """Plan undoing what the journal next to ``config`` lists; writes nothing."""
    main = Path(os.path.abspath(config))
    result = Plan("remove", main)
    journal = load_journal(main)
    if journal is None:
        result.notes.append(f"no journal {journal_path(main)}: Mokka has not changed this config")
        return result
    if journal.pending or any(not e.done for e in journal.entries.values()):
        result.notes.append("an interrupted run is rolled back first")
    for entry in file_entries(journal):
        result.changes += _remove_file(entry, force, result.notes)
    made = [e for e in journal.entries.values() if e.sha is None]
    result.directories = [Path(p) for e in sorted(made, key=lambda e: -e.seq) for p in reversed(e.paths)]
    result.notes.append("restart containerd to apply")
    return result


def _original(entry: Entry) -> bytes | None:
    if entry.kind != "replace":
        return None
    assert entry.backup is not None
    try:
        return Path(entry.backup).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{entry.paths[0]}: the saved original {entry.backup} is gone") from None


def saved_path(path: Path, current: bytes) -> Path:
    """``<path>.mokka-saved`` (``.N`` when that holds something else): never overwrite a file."""
    saved, n = path.with_name(path.name + SAVED_SUFFIX), 0
    while (found := read(saved)) is not None and found != current:
        n += 1
        saved = path.with_name(f"{path.name}{SAVED_SUFFIX}.{n}")
    return saved


def _remove_file(entry: Entry, force: bool, notes: list[str]) -> list[Change]:
    path = Path(entry.paths[0])
    current = read(path)
    meta = entry.meta or {}
    owned = entry.kind == "create"
    if current is None:
        notes.append(f"{path}: already gone; left absent")
        return [Change(path, None, None, action="forget")]
    original = _original(entry)
    st = path.stat()
    mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
    untouched = sha256(current) == entry.sha
    if untouched and (meta.get("pristine", True) or owned):
        return [Change(path, current, original, mode, uid, gid, action="undo")]
    if owned:
        saved = saved_path(path, current)
        notes.append(f"{path}: edited since Mokka wrote it; kept as {saved}")
        return [
            Change(saved, read(saved), current, mode, uid, gid, action="save"),
            Change(path, current, None, mode, uid, gid, action="undo"),
        ]
    try:
        after = undo_keys(path, current, meta.get("ops", []))
    except ConfigError as exc:
        if not force:
            raise ConfigError(f"{exc}; edited since Mokka's install (use force to restore the original)") from None
        saved = saved_path(path, current)
        notes.append(f"{path}: unparseable; original restored, current kept as {saved}")
        return [
            Change(saved, read(saved), current, mode, uid, gid, action="save"),
            Change(path, current, original, mode, uid, gid, action="undo"),
        ]
    notes.append(f"{path}: edited since Mokka's install; undoing only Mokka's keys")
    return [Change(path, current, after, mode, uid, gid, action="settle")]


def undo_keys(path: Path, data: bytes, ops: Sequence[Op]) -> bytes:
    """Undo Mokka's keys in a file someone edited since; keys changed by them stay as they are."""
    doc = parse(path, data)
    for op in reversed(ops):
        if "import" in op:
            _undo_import(doc, op)
        elif "table" in op:
            key = tuple(op["table"])
            parent, tbl = get(doc, key[:-1]), get(doc, key)
            if isinstance(tbl, Mapping) and not tbl and isinstance(parent, MutableMapping):
                del parent[key[-1]]
        else:
            key = tuple(op["key"])
            parent, cur = get(doc, key[:-1]), get(doc, key)
            if cur is MISSING or plain(cur) != op["new"] or not isinstance(parent, MutableMapping):
                continue
            if "old" not in op:
                del parent[key[-1]]
            elif isinstance(cur, Array) and isinstance(op["old"], list):
                for i in reversed(range(len(cur))):
                    if cur[i] not in op["old"]:
                        del cur[i]
            else:
                parent[key[-1]] = op["old"]
    return tomlkit.dumps(doc).encode()


def _undo_import(doc: Doc, op: Op) -> None:
    imports = doc.get("imports")
    if not isinstance(imports, list):
        return
    for i in reversed(range(len(imports))):
        if imports[i] == op["import"]:
            del imports[i]
    if op.get("created") and not imports:
        del doc["imports"]
