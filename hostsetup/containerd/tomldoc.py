"""Reading containerd's TOML files with tomlkit (comments, order and layout kept) and looking
keys up in the parsed documents."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Item, Table

from .errors import ConfigError

Key = tuple[str, ...]
Doc = MutableMapping[str, Any]
Op = dict[str, Any]
MISSING: Any = object()


def text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def dotted(key: Iterable[str]) -> str:
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p) for p in key)


def plain(value: Any) -> Any:
    return value.unwrap() if isinstance(value, Item) else value


def get(data: Any, key: Key) -> Any:
    """Value at ``key`` in nested mappings, or ``MISSING``."""
    for part in key:
        if not isinstance(data, Mapping) or part not in data:
            return MISSING
        data = data[part]
    return data


def kind(value: Any) -> str:
    value = plain(value)
    names = {bool: "boolean", str: "string", int: "integer", float: "float", list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def read(path: Path) -> bytes | None:
    """The file's bytes (through a symbolic link), or ``None`` when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse(path: Path, data: bytes | None) -> tomlkit.TOMLDocument:
    """Parse ``data`` (``None``: an empty document); a syntax error names file, line and column."""
    if data is None:
        return tomlkit.document()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = tomlkit.parse(source)
    except tomlkit.exceptions.ParseError as exc:
        msg = re.sub(r" at line \d+ col \d+$", "", str(exc))
        raise ConfigError(f"{path}:{exc.line}:{exc.col}: malformed TOML: {msg}") from None
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    if doc.as_string() != source:
        _repair_indents(doc.body, source)
    return doc


def _repair_indents(body: Sequence[tuple[Any, Any]], source: str) -> None:
    """Give each table header the indentation it has in ``source``.

    tomlkit (0.15) doubles the indentation of a second indented table under the same implicit
    parent (``[a.b.x]`` then ``[a.b.y]``) when parsing; the source text says what it was.
    """
    for _, item in body:
        tables = item.body if isinstance(item, AoT) else [item] if isinstance(item, Table) else []
        for tbl in tables:
            name = tbl.display_name
            if name and not tbl.is_super_table():
                found = re.findall(rf"^([ \t]*)\[{{1,2}}{re.escape(name)}\]", source, flags=re.MULTILINE)
                if len(found) == 1:
                    newlines = len(tbl.trivia.indent) - len(tbl.trivia.indent.lstrip("\n"))
                    tbl.trivia.indent = "\n" * newlines + found[0]
            _repair_indents(tbl.value.body, source)
