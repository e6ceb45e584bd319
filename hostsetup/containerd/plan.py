"""What an install or a remove will write: one ``Change`` per file, shown as a unified diff
before anything is touched, and where the journal of the changes lives."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .tomldoc import Op, text

JOURNAL_SUFFIX = ".mokka-journal"
Action = Literal["write", "undo", "settle", "save", "forget"]


def journal_path(config: Path) -> Path:
    """``<config>.mokka-journal``, next to the main config (the name as given, links not followed)."""
    main = Path(os.path.abspath(config))
    return main.with_name(main.name + JOURNAL_SUFFIX)


@dataclass(frozen=True)
class Change:
    """One file's bytes before and after (``None``: absent).

    ``action``: ``write`` (install: set ``ops``), ``undo`` (back to the journal's original),
    ``settle`` (keep ``after`` for good: only Mokka's keys undone in a file edited since),
    ``save`` (keep someone's edits under a new name), ``forget`` (a file already gone).
    """

    path: Path
    before: bytes | None
    after: bytes | None
    mode: int = 0o644
    uid: int = -1
    gid: int = -1
    action: Action = "write"
    ops: tuple[Op, ...] = ()


@dataclass
class Plan:
    """What ``apply`` will write; empty ``changes`` means there is nothing to do."""

    action: Literal["install", "remove"]
    config: Path
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config_version: int | None = None
    containerd_major: int | None = None
    placement: Literal["drop-in", "in-place"] | None = None
    runtime: str | None = None
    directories: list[Path] = field(default_factory=list)  # remove: directories the install made

    @property
    def changed(self) -> bool:
        return bool(self.changes or self.directories)

    @property
    def journal(self) -> Path:
        return journal_path(self.config)

    def diff(self) -> str:
        """Unified diff of every file that changes."""
        out: list[str] = []
        for ch in self.changes:
            a = text(ch.before).splitlines(keepends=True)
            b = text(ch.after).splitlines(keepends=True)
            src = str(ch.path) if ch.before is not None else "/dev/null"
            dst = str(ch.path) if ch.after is not None else "/dev/null"
            for line in difflib.unified_diff(a, b, src, dst):
                out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(out)

    def summary(self) -> str:
        """Notes and the files that change, one per line."""
        lines = list(self.notes)
        for ch in self.changes:
            if ch.before == ch.after:
                continue
            verb = "create" if ch.before is None else "delete" if ch.after is None else "update"
            lines.append(f"{verb} {ch.path}")
        lines += [f"remove {d}/ (if empty)" for d in self.directories]
        if not self.changed:
            lines.append(f"{self.config}: nothing to change")
        return "\n".join(lines)
