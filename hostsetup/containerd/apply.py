"""Carrying out an install or remove plan through the host-change journal
(``<config>.mokka-journal``): every file written is recorded before it is touched, with a hard
link to its original, so a remove (or a failed or killed install) restores the original bytes,
mode and owner, and an install killed at any point is finished by running it again or undone
by ``remove``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpumodel import atomic

from ..journal import Entry, Journal, JournalError, sha256
from .errors import ConfigError
from .install import plan
from .plan import JOURNAL_SUFFIX, Plan, journal_path
from .remove import file_entries, plan_remove
from .tomldoc import Op, read

OLD_RECORD_SUFFIX = ".mokka-backup"  # Mokka before the journal


def recover(config: Path) -> list[str]:
    """Finish or roll back an install or remove that was killed midway (plan after this)."""
    file = journal_path(config)
    old = file.with_name(file.name.replace(JOURNAL_SUFFIX, OLD_RECORD_SUFFIX))
    if old.exists():
        raise ConfigError(f"{old}: installed by an older Mokka; remove it with that version first")
    try:
        journal = Journal.open(file)
        try:
            done = journal.swept + journal.recovered
            if not journal.entries:
                done += journal.teardown()
        finally:
            journal.close()
    except JournalError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{exc.filename or file}: {exc.strerror or exc}") from None
    return done


def apply(p: Plan) -> None:
    """Write ``p``; an install that fails midway is undone (ConfigError: nothing was changed)."""
    recover(p.config)
    for ch in p.changes:
        if read(ch.path) != ch.before:
            raise ConfigError(f"{ch.path}: changed since the plan was made; plan again")
    try:
        if p.action == "install":
            _install(p)
        else:
            _remove(p)
    except JournalError as exc:
        raise ConfigError(str(exc)) from None


def _install(p: Plan) -> None:
    journal = Journal.open(p.journal, f"mokka containerd-config install for {p.config}")
    since = journal.next_seq
    try:
        for ch in p.changes:
            real = Path(os.path.realpath(ch.path))
            owner = (ch.uid, ch.gid) if ch.uid >= 0 else None
            meta = merged_meta(journal.owner(real), ch.before, ch.ops)
            journal.write(real, ch.after or b"", ch.mode, owner=owner, meta=meta)
        journal.compact()
    except OSError as exc:
        journal.undo(since)
        if not journal.entries:
            journal.teardown()
        failed = exc.filename or "a directory"
        raise ConfigError(f"{failed}: cannot write: {exc.strerror or exc}; nothing was changed") from None
    finally:
        journal.close()


def _remove(p: Plan) -> None:
    journal = Journal.open(p.journal)
    try:
        entries = {e.paths[0]: e for e in file_entries(journal)}
        for ch in p.changes:
            entry = entries.get(str(ch.path))
            if ch.action == "save":
                atomic.write(ch.path, ch.after or b"", ch.mode, owner=(ch.uid, ch.gid))
            elif entry is None:
                continue  # rolled back when the journal was opened
            elif ch.action == "undo":
                journal.undo_entry(entry)
            elif ch.action == "settle":
                journal.settle(entry, ch.after)
            elif ch.action == "forget":
                journal.settle(entry, None)
        journal.undo()  # the directories it created, now empty
        journal.teardown()
    except OSError as exc:
        raise ConfigError(
            f"{exc.filename or p.config}: {exc.strerror or exc}; the journal {p.journal} still lists what is left: "
            "run remove again"
        ) from None
    finally:
        journal.close()


def merged_meta(entry: Entry | None, before: bytes | None, ops: Sequence[Op]) -> dict[str, Any]:
    """An install's notes on a file: every key Mokka set (each with its first old value), and
    whether others left the file alone between Mokka's writes (``pristine``)."""
    if entry is None:
        return {"ops": list(ops), "pristine": True}
    old = entry.meta or {}
    pristine = bool(old.get("pristine", True)) and before is not None and sha256(before) == entry.sha
    known = {_op_id(op): dict(op) for op in old.get("ops", [])}
    merged = list(known.values())
    for op in ops:
        first = known.get(_op_id(op))
        if first is None:
            merged.append(dict(op))
        elif "new" in op:
            first["new"] = op["new"]
    return {"ops": merged, "pristine": pristine}


def _op_id(op: Op) -> str:
    return json.dumps({k: v for k, v in op.items() if k not in ("old", "new")}, sort_keys=True)


def install(config: Path, **kwargs: Any) -> Plan:
    """``plan(config, **kwargs)`` and apply it (after recovering a killed run); return the plan."""
    recover(config)
    result = plan(config, **kwargs)
    apply(result)
    return result


def remove(config: Path, *, force: bool = False) -> Plan:
    """``plan_remove(config)`` and apply it (after recovering a killed run); return the plan."""
    recover(config)
    result = plan_remove(config, force=force)
    apply(result)
    return result
