"""Setting keys in one containerd TOML document with tomlkit, in the file's own style (indents,
blank lines), recording every change as an operation so it can be undone later, and checking
that the rendered text means exactly what was intended."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Array, InlineTable, Table, Whitespace

from .errors import ConfigError
from .tomldoc import MISSING, Doc, Key, Op, dotted, kind, plain


@dataclass(frozen=True)
class Style:
    """Indentation of a file: spaces per nested table header, spaces before keys under a header."""

    table: int = 2
    key: int = 2

    @classmethod
    def of(cls, text: str) -> Style:
        header_indent, key_steps, tables = 0, Counter[int](), False
        for line in text.splitlines():
            if m := re.match(r"( *)\[", line):
                header_indent = len(m.group(1))
                tables = tables or header_indent > 0
            elif m := re.match(r"( *)[A-Za-z0-9_\"'-][^=]*=", line):
                key_steps[max(len(m.group(1)) - header_indent, 0)] += 1
        if not text.strip():
            return cls()
        return cls(table=2 if tables else 0, key=key_steps.most_common(1)[0][0] if key_steps else 0)


def _body(container: Any) -> list[tuple[Any, Any]] | None:
    """The items of a table or document in render order; ``None`` when tomlkit hides them."""
    if isinstance(container, Table):
        return list(container.value.body)
    if isinstance(container, tomlkit.TOMLDocument):
        return list(container.body)
    return None


class Editor:
    """Sets keys in one tomlkit document, recording what it changed so it can be undone."""

    def __init__(self, path: Path, doc: tomlkit.TOMLDocument, style: Style) -> None:
        self.path, self.doc, self.style = path, doc, style
        self.ops: list[Op] = []
        self._new_tables: list[Table] = []

    def table(self, key: Key) -> Doc:
        """The table at ``key``, creating missing ones (intermediate ones as super tables)."""
        chain: list[Doc] = [self.doc]
        for i, part in enumerate(key):
            if part not in chain[-1]:
                self._create(chain, part, key[: i + 1], last=i == len(key) - 1)
            nxt = chain[-1][part]
            if not isinstance(nxt, MutableMapping) or isinstance(nxt, AoT):
                raise ConfigError(f"{self.path}: {dotted(key[: i + 1])} is a {kind(nxt)}, not a table")
            chain.append(nxt)
        return chain[-1]

    def _create(self, chain: list[Doc], part: str, key: Key, *, last: bool) -> None:
        parent = chain[-1]
        if isinstance(parent, InlineTable):
            parent[part] = tomlkit.inline_table()
        else:
            new = tomlkit.table(is_super_table=not last)
            blank = "" if not last or self._blank_before(chain) else "\n"
            new.trivia.indent = " " * self.style.table if len(key) > 1 else ""
            parent[part] = new
            # tomlkit prefixes the parent's indent and may add its own newline: keep ours only
            new.trivia.indent = blank + new.trivia.indent.lstrip("\n")
            if last:
                self._new_tables.append(new)
        self.ops.append({"table": list(key)})

    def _blank_before(self, chain: Sequence[Doc]) -> bool:
        """Whether what renders just before a table appended to ``chain[-1]`` ends with a blank line."""
        for depth in range(len(chain) - 1, -1, -1):
            body = _body(chain[depth])
            if body is None:
                return False
            if depth < len(chain) - 1 and body and body[-1][1] is chain[depth + 1]:
                body = body[:-1]  # an empty table we just created: look at what precedes it
            if body:
                return self._ends_blank(body)
        return False

    def _ends_blank(self, body: Sequence[tuple[Any, Any]]) -> bool:
        item = body[-1][1]
        if isinstance(item, Whitespace):
            return "\n" in item.s
        if not isinstance(item, Table):
            return False
        inner = item.value.body
        if inner and isinstance(inner[-1][1], Table | Whitespace):
            return self._ends_blank(inner)
        return any(item is t for t in self._new_tables)  # render() ends new tables with a blank line

    def set(self, key: Key, value: Any) -> None:
        parent = self.table(key[:-1])
        leaf = key[-1]
        old = parent.get(leaf, MISSING)
        if old is MISSING:
            item = tomlkit.item(value)
            if not isinstance(parent, InlineTable):
                item.trivia.indent = " " * self.style.key if len(key) > 1 else ""
            parent[leaf] = item
            self.ops.append({"key": list(key), "new": value})
            return
        current = plain(old)
        self._check_type(key, current, value)
        if current == value:
            return
        if isinstance(old, Array):
            old.extend(v for v in value if v not in current)
        else:
            parent[leaf] = value
        self.ops.append({"key": list(key), "old": current, "new": value})

    def _check_type(self, key: Key, old: Any, value: Any) -> None:
        ok = type(old) is type(value)
        if ok and isinstance(old, list):
            ok = all(isinstance(v, str) for v in old)
        if not ok:
            raise ConfigError(f"{self.path}: {dotted(key)} is {old!r} ({kind(old)}), expected a {kind(value)}")

    def render(self) -> bytes:
        for tbl in self._new_tables:
            body = tbl.value.body
            if body and not isinstance(body[-1][1], Table | Whitespace):
                tbl.add(tomlkit.nl())
        text = tomlkit.dumps(self.doc)
        return (text.rstrip("\n") + "\n").encode() if text.strip() else text.encode()


def check_render(path: Path, before: Mapping[str, Any], after: bytes, settings: Sequence[tuple[Key, Any]]) -> None:
    """The written text must parse and mean exactly ``before`` plus ``settings``."""
    expected = json.loads(json.dumps(before, default=str))
    for key, value in settings:
        cur = expected
        for part in key[:-1]:
            cur = cur.setdefault(part, {})
        cur[key[-1]] = value
    try:
        got = json.loads(json.dumps(tomlkit.parse(after.decode()).unwrap(), default=str))
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ConfigError(f"{path}: editing it would produce invalid TOML ({exc}); edit it by hand") from None
    if got != expected:
        raise ConfigError(f"{path}: tomlkit could not edit this layout faithfully; add the settings by hand")
