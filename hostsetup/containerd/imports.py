"""containerd's ``imports``: which files it loads, in which order, and what they mean merged.

containerd 2.x merges imported files into the main config key by key (tables merge, later
files win, lists are replaced, a missing import is ignored). containerd 1.7 replaces a whole
``plugins."<id>"`` table when an imported file defines it, and refuses to start on a missing
import. (Established by experiment with containerd 1.7.24 and 2.1.9, ``containerd config dump``.)
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomlkit

from .errors import ConfigError
from .tomldoc import MISSING, Doc, Key, dotted, get, parse, plain, read


class Files:
    """Reads and parses config files, with planned contents overriding the disk."""

    def __init__(self, overrides: Mapping[Path, bytes | None] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self._docs: dict[Path, tomlkit.TOMLDocument] = {}

    def read(self, path: Path) -> bytes | None:
        return self.overrides[path] if path in self.overrides else read(path)

    def doc(self, path: Path) -> tomlkit.TOMLDocument:
        if path not in self._docs:
            self._docs[path] = parse(path, self.read(path))
        return self._docs[path]

    def matches(self, pattern: str) -> list[Path]:
        """Files matching a glob pattern, as containerd sorts them, planned files included."""
        found = {Path(p) for p in glob.glob(pattern)}
        found |= {p for p, data in self.overrides.items() if data is not None and fnmatch.fnmatch(str(p), pattern)}
        found -= {p for p, data in self.overrides.items() if data is None}
        return sorted(found, key=str)


def imports_of(path: Path, doc: Doc) -> list[str]:
    value = plain(doc.get("imports", []))
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: 'imports' must be an array of strings, not {value!r}")
    return value


def resolve(entry: str, parent: Path) -> str:
    return os.path.normpath(entry if os.path.isabs(entry) else os.path.join(parent.parent, entry))


def covers(main: Path, doc: Doc, target: Path) -> bool:
    """Whether ``main``'s imports name ``target`` (directly or by a glob)."""
    return any(
        fnmatch.fnmatch(str(target), t) if glob.has_magic(t) else Path(t) == target
        for t in (resolve(e, main) for e in imports_of(main, doc))
    )


def chain(files: Files, main: Path, notes: list[str] | None = None, skip: Path | None = None) -> list[Path]:
    """Files in the order containerd loads them: the main config, then imports, breadth first."""
    order: list[Path] = []
    queue, seen = [main], set[Path]()
    while queue:
        path = queue.pop(0)
        if path in seen or path == skip:
            continue
        seen.add(path)
        if path != main and files.read(path) is None:
            if notes is not None:
                notes.append(f"{path}: imported but missing (containerd 1.7 refuses to start; 2.x ignores it)")
            continue
        order.append(path)
        for entry in imports_of(path, files.doc(path)):
            target = resolve(entry, path)
            queue.extend(files.matches(target) if glob.has_magic(target) else [Path(target)])
    return order


def _deep_merge(into: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = json.loads(json.dumps(v, default=str)) if isinstance(v, Mapping | list) else v


def effective(files: Files, order: Sequence[Path], deep: bool) -> dict[str, Any]:
    """The merged config: 2.x merges deeply; 1.7 lets a later file replace a whole plugin table."""
    out: dict[str, Any] = {}
    for path in order:
        data = files.doc(path).unwrap()
        if deep:
            _deep_merge(out, data)
            continue
        plugins = data.pop("plugins", None)
        _deep_merge(out, data)
        if isinstance(plugins, Mapping):
            out.setdefault("plugins", {}).update(plugins)
    return out


def verify(
    main: Path, planned: Mapping[Path, bytes], settings: Sequence[tuple[Key, Any]], rules: Iterable[bool]
) -> None:
    """Simulate containerd's merge with the planned files; every setting must win (``rules``: deep or not)."""
    files = Files(planned)
    for deep in rules:
        order = chain(files, main)
        eff = effective(files, order, deep)
        for key, value in settings:
            if get(eff, key) == value:
                continue
            name = "containerd 2.x" if deep else "containerd 1.7"
            culprit = next((p for p in reversed(order) if get(files.doc(p), key) is not MISSING), None)
            where = f"{culprit} sets it to {get(files.doc(culprit), key)!r}" if culprit else "a later file wins"
            raise ConfigError(f"{dotted(key)} would not be {value!r} under {name} merge rules: {where}")
