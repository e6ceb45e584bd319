"""containerd configuration for Mokka: NRI on, CDI on, and an ``nvidia`` runtime handler.

``plan()`` -> ``Plan.diff()`` -> ``apply()``; ``plan_remove()``/``remove()`` undo it. Edits go
through tomlkit (comments, order and layout of the user's file are kept) and every file is
written atomically (temp file, fsync, rename; mode and owner kept).

Where the settings go follows how the containerd that reads the file merges ``imports``
(established by experiment with containerd 1.7.24 and 2.1.9, ``containerd config dump``):

* containerd 2.x merges imported files into the main config key by key (tables merge, later
  files win, lists are replaced, a missing import is ignored). Mokka writes the drop-in
  ``conf.d/99-mokka.toml`` next to the main config and appends it, relative, to the main
  config's ``imports``.
* containerd 1.7 replaces a whole ``plugins."<id>"`` table when an imported file defines it
  (a drop-in holding ``[plugins."io.containerd.grpc.v1.cri"]`` wipes the main file's sandbox
  image, runtimes and registry settings), and refuses to start on a missing import. So for
  1.7 (and for a version 2 config when the containerd version is unknown) the settings are
  written into the file that defines each plugin table: the main config, or the imported
  file that already overrides that table.

Backup record: ``<config>.mokka-backup`` (JSON, mode 0600) next to the main config holds, for
every file Mokka wrote, its original bytes (or that it did not exist), a hash of what Mokka
wrote, and the keys Mokka set with their old values. ``remove`` restores the original bytes
of a file that is still as Mokka left it (deleting files and directories Mokka created);
a file edited by someone since gets only Mokka's keys undone, keeping the other edits.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomlkit
import tomlkit.exceptions
from tomlkit.items import AoT, Array, InlineTable, Item, Table, Whitespace

__all__ = [
    "BACKUP_SUFFIX",
    "DEFAULT_CDI_DIRS",
    "DROPIN",
    "Change",
    "ConfigError",
    "Plan",
    "apply",
    "containerd_major",
    "install",
    "plan",
    "plan_remove",
    "remove",
    "restart",
    "restart_hint",
    "under_systemd",
]

DROPIN = Path("conf.d/99-mokka.toml")
BACKUP_SUFFIX = ".mokka-backup"
SAVED_SUFFIX = ".mokka-saved"
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
RUNTIME_NAME = "nvidia"
RUNC_SHIM = "io.containerd.runc.v2"
NRI_PLUGIN = "io.containerd.nri.v1.nri"
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
RECORD_FORMAT = 1
UNIT = "containerd.service"
SYSTEMD_RUN_DIR = Path("/run/systemd/system")

Key = tuple[str, ...]
Doc = MutableMapping[str, Any]
Op = dict[str, Any]
Runner = Callable[..., subprocess.CompletedProcess[str]]
_MISSING: Any = object()


class ConfigError(Exception):
    """A containerd config that cannot be read, merged, written or restored; nothing was changed."""


# --------------------------------------------------------------------------- plan objects


@dataclass(frozen=True)
class Change:
    """One file's bytes before and after (``None``: absent); ``internal`` hides it from the diff."""

    path: Path
    before: bytes | None
    after: bytes | None
    mode: int = 0o644
    uid: int = -1
    gid: int = -1
    internal: bool = False


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
    make_dirs: list[Path] = field(default_factory=list)
    remove_dirs: list[Path] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def diff(self) -> str:
        """Unified diff of every file that changes (the backup record is only named)."""
        out: list[str] = []
        for ch in self.changes:
            if ch.internal:
                continue
            a = _text(ch.before).splitlines(keepends=True)
            b = _text(ch.after).splitlines(keepends=True)
            src = str(ch.path) if ch.before is not None else "/dev/null"
            dst = str(ch.path) if ch.after is not None else "/dev/null"
            for line in difflib.unified_diff(a, b, src, dst):
                out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(out)

    def summary(self) -> str:
        """Notes and the files that change, one per line."""
        lines = list(self.notes)
        for ch in self.changes:
            verb = "create" if ch.before is None else "delete" if ch.after is None else "update"
            lines.append(f"{verb} {ch.path}")
        if not self.changes:
            lines.append(f"{self.config}: nothing to change")
        return "\n".join(lines)


# --------------------------------------------------------------------------- small helpers


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _dotted(key: Iterable[str]) -> str:
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p) for p in key)


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(path))


def _plain(value: Any) -> Any:
    return value.unwrap() if isinstance(value, Item) else value


def _get(data: Any, key: Key) -> Any:
    """Value at ``key`` in nested mappings, or ``_MISSING``."""
    for part in key:
        if not isinstance(data, Mapping) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _kind(value: Any) -> str:
    value = _plain(value)
    names = {bool: "boolean", str: "string", int: "integer", float: "float", list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _parse(path: Path, data: bytes | None) -> tomlkit.TOMLDocument:
    """Parse ``data`` (``None``: an empty document); a syntax error names file, line and column."""
    if data is None:
        return tomlkit.document()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        msg = re.sub(r" at line \d+ col \d+$", "", str(exc))
        raise ConfigError(f"{path}:{exc.line}:{exc.col}: malformed TOML: {msg}") from None
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    if doc.as_string() != text:
        _repair_indents(doc.body, text)
    return doc


def _repair_indents(body: Sequence[tuple[Any, Any]], text: str) -> None:
    """Give each table header the indentation it has in ``text``.

    tomlkit (0.15) doubles the indentation of a second indented table under the same implicit
    parent (``[a.b.x]`` then ``[a.b.y]``) when parsing; the source text says what it was.
    """
    for _, item in body:
        tables = item.body if isinstance(item, AoT) else [item] if isinstance(item, Table) else []
        for tbl in tables:
            name = tbl.display_name
            if name and not tbl.is_super_table():
                found = re.findall(rf"^([ \t]*)\[{{1,2}}{re.escape(name)}\]", text, flags=re.MULTILINE)
                if len(found) == 1:
                    newlines = len(tbl.trivia.indent) - len(tbl.trivia.indent.lstrip("\n"))
                    tbl.trivia.indent = "\n" * newlines + found[0]
            _repair_indents(tbl.value.body, text)


# --------------------------------------------------------------------------- containerd facts


def containerd_major(version_or_binary: str | Path) -> int:
    """Major version from ``"1.7"``/``"v2.1.9"``, or from a binary's ``containerd --version`` output."""
    text = str(version_or_binary)
    if m := re.fullmatch(r"v?(\d+)(\.\d+)*\S*", text):
        return int(m.group(1))
    try:
        res = subprocess.run([text, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {text} --version: {exc}") from None
    # "containerd github.com/containerd/containerd/v2 2.1.9 ..." / "containerd containerd.io 1.7.24 sha"
    words = res.stdout.split()
    if res.returncode == 0 and len(words) >= 3 and (m := re.match(r"v?(\d+)\.\d+", words[2])):
        return int(m.group(1))
    raise ConfigError(f"{text} --version: unexpected output {res.stdout.strip() or res.stderr.strip()!r}")


def _detect_major(version: str | None, binary: Path | None, search_path: str | None, notes: list[str]) -> int | None:
    if version is not None:
        return containerd_major(version)
    if binary is None:
        found = shutil.which("containerd", path=search_path)
        if found is None:
            return None
        binary = Path(found)
    major = containerd_major(binary)
    notes.append(f"containerd {major}.x: version from {binary} --version")
    return major


def _config_version(path: Path, doc: Doc, major: int | None, notes: list[str]) -> int:
    version = _plain(doc.get("version", _MISSING))
    if version is _MISSING:
        if any(k != "version" for k in doc):
            raise ConfigError(
                f"{path}: no 'version' key, so containerd reads it as config version 1, which Mokka does not edit; "
                "convert it with `containerd config migrate` and add 'version = 2' (or 3 for containerd 2.x)"
            )
        chosen = 3 if major is not None and major >= 2 else 2
        if major is None:
            notes.append(f"{path}: new config; containerd version unknown, writing config version 2 (1.7 and 2.x)")
        return chosen
    if version not in CRI_PLUGIN or isinstance(version, bool):
        raise ConfigError(f"{path}: version = {version!r}; Mokka edits config versions 2 and 3")
    if version == 3 and major is not None and major < 2:
        raise ConfigError(f"{path}: config version 3 needs containerd 2.x, but containerd is {major}.x")
    return int(version)


# --------------------------------------------------------------------------- the import chain


class _Files:
    """Reads and parses config files, with planned contents overriding the disk."""

    def __init__(self, overrides: Mapping[Path, bytes | None] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self._docs: dict[Path, tomlkit.TOMLDocument] = {}

    def read(self, path: Path) -> bytes | None:
        return self.overrides[path] if path in self.overrides else _read(path)

    def doc(self, path: Path) -> tomlkit.TOMLDocument:
        if path not in self._docs:
            self._docs[path] = _parse(path, self.read(path))
        return self._docs[path]

    def matches(self, pattern: str) -> list[Path]:
        """Files matching a glob pattern, as containerd sorts them, planned files included."""
        found = {Path(p) for p in glob.glob(pattern)}
        found |= {p for p, data in self.overrides.items() if data is not None and fnmatch.fnmatch(str(p), pattern)}
        found -= {p for p, data in self.overrides.items() if data is None}
        return sorted(found, key=str)


def _imports(path: Path, doc: Doc) -> list[str]:
    value = _plain(doc.get("imports", []))
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: 'imports' must be an array of strings, not {value!r}")
    return value


def _resolve(entry: str, parent: Path) -> str:
    return os.path.normpath(entry if os.path.isabs(entry) else os.path.join(parent.parent, entry))


def _chain(files: _Files, main: Path, notes: list[str] | None = None, skip: Path | None = None) -> list[Path]:
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
        for entry in _imports(path, files.doc(path)):
            target = _resolve(entry, path)
            queue.extend(files.matches(target) if glob.has_magic(target) else [Path(target)])
    return order


def _deep_merge(into: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = json.loads(json.dumps(v, default=str)) if isinstance(v, Mapping | list) else v


def _effective(files: _Files, chain: Sequence[Path], deep: bool) -> dict[str, Any]:
    """The merged config: 2.x merges deeply; 1.7 lets a later file replace a whole plugin table."""
    out: dict[str, Any] = {}
    for path in chain:
        data = files.doc(path).unwrap()
        if deep:
            _deep_merge(out, data)
            continue
        plugins = data.pop("plugins", None)
        _deep_merge(out, data)
        if isinstance(plugins, Mapping):
            out.setdefault("plugins", {}).update(plugins)
    return out


# --------------------------------------------------------------------------- what to set


@dataclass(frozen=True)
class _Layout:
    version: int

    @property
    def cri(self) -> Key:
        return ("plugins", CRI_PLUGIN[self.version])

    @property
    def nri(self) -> Key:
        return ("plugins", NRI_PLUGIN)

    @property
    def runtimes(self) -> Key:
        return (*self.cri, "containerd", "runtimes")


def _detect_runtime(eff: Mapping[str, Any], layout: _Layout, search_path: str | None, notes: list[str]) -> str:
    if found := shutil.which("nvidia-container-runtime", path=search_path):
        notes.append(f"runtime handler {RUNTIME_NAME!r} -> {found}")
        return found
    default = _get(eff, (*layout.cri, "containerd", "default_runtime_name"))
    name = default if isinstance(default, str) and default else "runc"
    configured = _get(eff, (*layout.runtimes, name, "options", "BinaryName"))
    binary = configured if isinstance(configured, str) and configured else shutil.which("runc", path=search_path)
    binary = binary or "runc"
    notes.append(f"nvidia-container-runtime not found: runtime handler {RUNTIME_NAME!r} runs {binary} (plain runc)")
    return binary


def _settings(
    layout: _Layout, eff: Mapping[str, Any], binary: str, cdi_dirs: Sequence[str], *, deep: bool
) -> list[tuple[Key, Any]]:
    """Keys and values Mokka needs, in the order they are written."""
    dirs = _get(eff, (*layout.cri, "cdi_spec_dirs"))
    dirs = list(dirs) if isinstance(dirs, list) else list(DEFAULT_CDI_DIRS)
    dirs += [d for d in cdi_dirs if d not in dirs]
    nvidia = (*layout.runtimes, RUNTIME_NAME)
    out: list[tuple[Key, Any]] = [
        ((*layout.cri, "enable_cdi"), True),
        ((*layout.cri, "cdi_spec_dirs"), dirs),
        ((*nvidia, "runtime_type"), RUNC_SHIM),
        ((*nvidia, "options", "BinaryName"), binary),
    ]
    default = _get(eff, (*layout.cri, "containerd", "default_runtime_name"))
    name = default if isinstance(default, str) and default != RUNTIME_NAME else "runc"
    systemd = _get(eff, (*layout.runtimes, name, "options", "SystemdCgroup"))
    if isinstance(systemd, bool):
        out.append(((*nvidia, "options", "SystemdCgroup"), systemd))
    if not deep and _get(eff, layout.runtimes) is _MISSING:
        # 1.7 decodes a runtimes table over its default map instead of into it: without this the
        # built-in runc entry vanishes and the CRI plugin fails ("no corresponding runtime configured").
        out.insert(2, ((*layout.runtimes, name, "runtime_type"), RUNC_SHIM))
    out.append(((*layout.nri, "disable"), False))
    return out


# --------------------------------------------------------------------------- tomlkit editing


@dataclass(frozen=True)
class _Style:
    """Indentation of a file: spaces per nested table header, spaces before keys under a header."""

    table: int = 2
    key: int = 2

    @classmethod
    def of(cls, text: str) -> _Style:
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


class _Editor:
    """Sets keys in one tomlkit document, recording what it changed so it can be undone."""

    def __init__(self, path: Path, doc: tomlkit.TOMLDocument, style: _Style) -> None:
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
                raise ConfigError(f"{self.path}: {_dotted(key[: i + 1])} is a {_kind(nxt)}, not a table")
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
        old = parent.get(leaf, _MISSING)
        if old is _MISSING:
            item = tomlkit.item(value)
            if not isinstance(parent, InlineTable):
                item.trivia.indent = " " * self.style.key if len(key) > 1 else ""
            parent[leaf] = item
            self.ops.append({"key": list(key), "new": value})
            return
        plain = _plain(old)
        self._check_type(key, plain, value)
        if plain == value:
            return
        if isinstance(old, Array):
            old.extend(v for v in value if v not in plain)
        else:
            parent[leaf] = value
        self.ops.append({"key": list(key), "old": plain, "new": value})

    def _check_type(self, key: Key, old: Any, value: Any) -> None:
        ok = type(old) is type(value)
        if ok and isinstance(old, list):
            ok = all(isinstance(v, str) for v in old)
        if not ok:
            raise ConfigError(f"{self.path}: {_dotted(key)} is {old!r} ({_kind(old)}), expected a {_kind(value)}")

    def render(self) -> bytes:
        for tbl in self._new_tables:
            body = tbl.value.body
            if body and not isinstance(body[-1][1], Table | Whitespace):
                tbl.add(tomlkit.nl())
        text = tomlkit.dumps(self.doc)
        return (text.rstrip("\n") + "\n").encode() if text.strip() else text.encode()


def _check_render(path: Path, before: Mapping[str, Any], after: bytes, settings: Sequence[tuple[Key, Any]]) -> None:
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


# --------------------------------------------------------------------------- install planning


@dataclass
class _Edit:
    path: Path
    before: bytes | None
    after: bytes
    ops: list[Op]
    owned: bool = False


def _dropin_edits(files: _Files, main: Path, version: int, settings: Sequence[tuple[Key, Any]]) -> list[_Edit]:
    """The drop-in with every setting, and the main config's ``imports`` line (deep-merge rules)."""
    dropin = main.parent / DROPIN
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by mokka (containerd-config install): NRI on, CDI on, the nvidia runtime."))
    doc.add(tomlkit.comment(f"`mokka containerd-config remove` deletes it and its entry in {main.name}'s imports."))
    doc.add("version", version)
    editor = _Editor(dropin, doc, _Style(table=0, key=2))
    for key, value in settings:
        editor.set(key, value)
    edits = [_Edit(dropin, files.read(dropin), editor.render(), [], owned=True)]
    main_before = files.read(main)
    main_doc = files.doc(main)
    covered = any(
        fnmatch.fnmatch(str(dropin), t) if glob.has_magic(t) else Path(t) == dropin
        for t in (_resolve(e, main) for e in _imports(main, main_doc))
    )
    if not covered or "version" not in main_doc:
        editor = _Editor(main, main_doc, _Style.of(_text(main_before)))
        if "version" not in main_doc:
            main_doc.add("version", version)
        if not covered:
            entry = str(DROPIN)
            if "imports" in main_doc:
                main_doc["imports"].append(entry)
                editor.ops.append({"import": entry})
            else:
                main_doc.add("imports", [entry])
                editor.ops.append({"import": entry, "created": True})
        edits.append(_Edit(main, main_before, editor.render(), editor.ops))
    return edits


def _in_place_edits(
    files: _Files, main: Path, layout: _Layout, settings: Sequence[tuple[Key, Any]], base: Sequence[Path]
) -> list[_Edit]:
    """Settings written into the file that defines each plugin table last (1.7 replace rules)."""
    targets: dict[Path, list[tuple[Key, Any]]] = {}
    for key, value in settings:
        plugin = key[:2]
        owner = next((p for p in reversed(base) if _get(files.doc(p), plugin) is not _MISSING), main)
        targets.setdefault(owner, []).append((key, value))
    edits = []
    for path, wanted in targets.items():
        before = files.read(path)
        doc = files.doc(path)
        plain_before = doc.unwrap()
        editor = _Editor(path, doc, _Style.of(_text(before)))
        if "version" not in doc:
            doc.add("version", layout.version)
            plain_before["version"] = layout.version
        for key, value in wanted:
            editor.set(key, value)
        if not editor.ops and before is not None and "version" in plain_before:
            continue
        after = editor.render()
        if after != before:
            _check_render(path, plain_before, after, wanted)
            edits.append(_Edit(path, before, after, editor.ops))
    return edits


def _verify(main: Path, edits: Sequence[_Edit], settings: Sequence[tuple[Key, Any]], semantics: Iterable[bool]) -> None:
    """Simulate containerd's merge with the planned files; every setting must win."""
    files = _Files({e.path: e.after for e in edits})
    for deep in semantics:
        chain = _chain(files, main)
        eff = _effective(files, chain, deep)
        for key, value in settings:
            if _get(eff, key) == value:
                continue
            rules = "containerd 2.x" if deep else "containerd 1.7"
            culprit = next((p for p in reversed(chain) if _get(files.doc(p), key) is not _MISSING), None)
            where = f"{culprit} sets it to {_get(files.doc(culprit), key)!r}" if culprit else "a later file wins"
            raise ConfigError(f"{_dotted(key)} would not be {value!r} under {rules} merge rules: {where}")


def _conflict_notes(files: _Files, base: Sequence[Path], settings: Sequence[tuple[Key, Any]]) -> list[str]:
    notes = []
    for path in base:
        doc = files.doc(path)
        for key, value in settings:
            old = _get(doc, key)
            if old is not _MISSING and _plain(old) != value and not isinstance(value, list):
                notes.append(f"{path} sets {_dotted(key)} = {_plain(old)!r}; the drop-in overrides it")
    return notes


def plan(
    config: Path,
    *,
    containerd_version: str | None = None,
    containerd: Path | None = None,
    runtime: str | None = None,
    cdi_dirs: Sequence[str] = DEFAULT_CDI_DIRS,
    search_path: str | None = None,
) -> Plan:
    """Plan the install for main config ``config``; reads only, writes nothing.

    ``containerd_version`` ("1.7", "2.1") or ``containerd`` (a binary to ask) choose the merge rules;
    without either, ``containerd`` on ``search_path`` (default ``$PATH``) is asked. ``runtime`` is the
    nvidia handler's ``BinaryName``; default: ``nvidia-container-runtime`` if found, else runc.
    """
    main = _abs(config)
    notes: list[str] = []
    files = _Files()
    main_doc = files.doc(main)
    major = _detect_major(containerd_version, containerd, search_path, notes)
    version = _config_version(main, main_doc, major, notes)
    layout = _Layout(version)
    deep = version == 3 or (major is not None and major >= 2)
    base = _chain(files, main, notes, skip=main.parent / DROPIN)
    eff = _effective(files, base, deep)
    binary = runtime or _detect_runtime(eff, layout, search_path, notes)
    settings = _settings(layout, eff, binary, cdi_dirs, deep=deep)
    if deep:
        notes.append(f"containerd 2.x merges imports key by key: settings go to the drop-in {main.parent / DROPIN}")
        notes += _conflict_notes(files, base, settings)
        edits = _dropin_edits(files, main, version, settings)
    else:
        edits = _in_place_edits(files, main, layout, settings, base)
        why = "1.7" if major is not None else "version unknown, assuming 1.7"
        notes.append(f"containerd {why}: an imported plugin table replaces the whole table, so settings go in place")
    edits = [e for e in edits if e.after != e.before]
    _verify(main, edits, settings, [deep] if major is not None or deep else [False, True])
    result = Plan("install", main, notes=notes, config_version=version, containerd_major=major, runtime=binary)
    result.placement = "drop-in" if deep else "in-place"
    if edits:
        _finish_install(result, files, edits)
    return result


def _finish_install(result: Plan, files: _Files, edits: list[_Edit]) -> None:
    main = result.config
    record_path = _record_path(main)
    record_before = _read(record_path)
    record = _load_record(record_path, record_before) if record_before is not None else _new_record(main)
    ref = main if files.read(main) is not None else None
    for edit in edits:
        result.make_dirs += [d for d in _missing_dirs(edit.path.parent) if d not in result.make_dirs]
    record["created_dirs"] = sorted(set(record["created_dirs"]) | {str(d) for d in result.make_dirs})
    changes = []
    for edit in sorted(edits, key=lambda e: not e.owned):  # the drop-in before the file importing it
        mode, uid, gid = _owner(edit.path if edit.before is not None else ref)
        changes.append(Change(edit.path, edit.before, edit.after, mode, uid, gid))
        _record_edit(record, edit)
    record_after = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
    result.changes = [Change(record_path, record_before, record_after, 0o600, internal=True), *changes]
    result.notes.append(f"backup record: {record_path}; restart containerd to apply")


def _missing_dirs(path: Path) -> list[Path]:
    out = []
    while not path.exists():
        out.append(path)
        path = path.parent
    return list(reversed(out))


def _owner(path: Path | None) -> tuple[int, int, int]:
    if path is None:
        return 0o644, -1, -1
    st = Path(os.path.realpath(path)).stat()
    return st.st_mode & 0o7777, st.st_uid, st.st_gid


# --------------------------------------------------------------------------- the backup record


def _record_path(main: Path) -> Path:
    return main.with_name(main.name + BACKUP_SUFFIX)


def _new_record(main: Path) -> dict[str, Any]:
    return {"format": RECORD_FORMAT, "tool": "mokka containerd-config", "config": str(main), "created_dirs": []}


def _load_record(path: Path, data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
        if record.get("format") != RECORD_FORMAT or not isinstance(record.get("files"), dict):
            raise ValueError(f"unknown format {record.get('format')!r}")
        return dict(record)
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"{path}: unreadable backup record ({exc}); move it away only if you know why") from None


def _op_id(op: Op) -> str:
    return json.dumps({k: v for k, v in op.items() if k not in ("old", "new")}, sort_keys=True)


def _record_edit(record: dict[str, Any], edit: _Edit) -> None:
    """Add ``edit`` to the record; a file already recorded keeps its original bytes and old values."""
    entries: dict[str, Any] = record.setdefault("files", {})
    entry = entries.get(str(edit.path))
    if entry is None:
        original = None if edit.before is None else base64.b64encode(edit.before).decode()
        entries[str(edit.path)] = {
            "original": original,
            "installed_sha256": _sha(edit.after),
            "pristine": True,
            "owned": edit.owned,
            "edits": edit.ops,
        }
        return
    entry["pristine"] = entry["pristine"] and _sha(edit.before) == entry["installed_sha256"]
    entry["installed_sha256"] = _sha(edit.after)
    known = {_op_id(op): op for op in entry["edits"]}
    for op in edit.ops:
        if (first := known.get(_op_id(op))) is None:
            entry["edits"].append(op)
        elif "new" in op:
            first["new"] = op["new"]


# --------------------------------------------------------------------------- remove planning


def _undo(path: Path, data: bytes, ops: Sequence[Op]) -> bytes:
    """Undo Mokka's keys in a file someone edited since; keys changed by them stay as they are."""
    doc = _parse(path, data)
    for op in reversed(ops):
        if "import" in op:
            _undo_import(path, doc, op)
        elif "table" in op:
            key = tuple(op["table"])
            parent, tbl = _get(doc, key[:-1]), _get(doc, key)
            if isinstance(tbl, Mapping) and not tbl and isinstance(parent, MutableMapping):
                del parent[key[-1]]
        else:
            key = tuple(op["key"])
            parent, cur = _get(doc, key[:-1]), _get(doc, key)
            if cur is _MISSING or _plain(cur) != op["new"] or not isinstance(parent, MutableMapping):
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


def _undo_import(path: Path, doc: Doc, op: Op) -> None:
    imports = doc.get("imports")
    if not isinstance(imports, list):
        return
    for i in reversed(range(len(imports))):
        if imports[i] == op["import"]:
            del imports[i]
    if op.get("created") and not imports:
        del doc["imports"]


def plan_remove(config: Path, *, force: bool = False) -> Plan:
    """Plan undoing what the backup record next to ``config`` lists; writes nothing.

    A file Mokka wrote and nobody touched since gets its original bytes back (or is deleted if
    Mokka created it). A file edited since loses only Mokka's keys; if that file no longer
    parses, ``force`` restores the original bytes and keeps the current file as ``*.mokka-saved``.
    """
    main = _abs(config)
    record_path = _record_path(main)
    record_before = _read(record_path)
    result = Plan("remove", main)
    if record_before is None:
        result.notes.append(f"no backup record {record_path}: Mokka has not changed this config")
        return result
    record = _load_record(record_path, record_before)
    entries: dict[str, Any] = record["files"]
    for name in sorted(entries, key=lambda n: bool(entries[n].get("owned"))):  # importing files first
        result.changes += _remove_file(Path(name), entries[name], force, result.notes)
    result.changes.append(Change(record_path, record_before, None, internal=True))
    result.remove_dirs = [Path(d) for d in sorted(record.get("created_dirs", []), reverse=True)]
    result.notes.append("restart containerd to apply")
    return result


def _saved_path(path: Path) -> Path:
    """``<path>.mokka-saved``, or ``.mokka-saved.N`` when that exists: never overwrite a file."""
    saved, n = path.with_name(path.name + SAVED_SUFFIX), 0
    while saved.exists():
        n += 1
        saved = path.with_name(f"{path.name}{SAVED_SUFFIX}.{n}")
    return saved


def _remove_file(path: Path, entry: Mapping[str, Any], force: bool, notes: list[str]) -> list[Change]:
    current = _read(path)
    original = None if entry["original"] is None else base64.b64decode(entry["original"])
    untouched = _sha(current) == entry["installed_sha256"]
    if current is None:
        notes.append(f"{path}: already gone; left absent")
        return []
    mode, uid, gid = _owner(path)
    if untouched and (entry["pristine"] or entry.get("owned")):
        return [Change(path, current, original, mode, uid, gid)]
    if entry.get("owned"):
        saved = _saved_path(path)
        notes.append(f"{path}: edited since Mokka wrote it; kept as {saved}")
        return [Change(saved, _read(saved), current, mode, uid, gid), Change(path, current, original, mode, uid, gid)]
    try:
        after = _undo(path, current, entry["edits"])
    except ConfigError as exc:
        if not force:
            raise ConfigError(f"{exc}; edited since Mokka's install (use force to restore the original)") from None
        saved = _saved_path(path)
        notes.append(f"{path}: unparseable; original restored, current kept as {saved}")
        return [Change(saved, _read(saved), current, mode, uid, gid), Change(path, current, original, mode, uid, gid)]
    notes.append(f"{path}: edited since Mokka's install; undoing only Mokka's keys")
    return [Change(path, current, after, mode, uid, gid)] if after != current else []


# --------------------------------------------------------------------------- writing


def _write(path: Path, data: bytes | None, mode: int, uid: int, gid: int) -> None:
    """Atomically replace (or delete, for ``None``) the file ``path`` points at."""
    real = Path(os.path.realpath(path))
    if data is None:
        real.unlink(missing_ok=True)
        _fsync_dir(real.parent)
        return
    tmp = real.with_name(f".{real.name}.mokka-tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if uid >= 0 or gid >= 0:
                with contextlib.suppress(PermissionError):
                    os.fchown(fh.fileno(), uid, gid)
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(real.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def apply(plan: Plan) -> None:
    """Write ``plan``; if any write fails, put back what was already written and raise ConfigError."""
    for ch in plan.changes:
        if _read(ch.path) != ch.before:
            raise ConfigError(f"{ch.path}: changed since the plan was made; plan again")
    made: list[Path] = []
    done: list[Change] = []
    try:
        for d in plan.make_dirs:
            if not d.exists():
                d.mkdir(mode=0o755)
                made.append(d)
        for ch in plan.changes:
            _write(ch.path, ch.after, ch.mode, ch.uid, ch.gid)
            done.append(ch)
    except OSError as exc:
        for ch in reversed(done):
            with contextlib.suppress(OSError):
                _write(ch.path, ch.before, ch.mode, ch.uid, ch.gid)
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        failed = exc.filename or "a directory"
        raise ConfigError(f"{failed}: cannot write: {exc.strerror or exc}; nothing was changed") from None
    for d in plan.remove_dirs:
        with contextlib.suppress(OSError):
            d.rmdir()  # only if empty: something else may have put files there


def install(config: Path, **kwargs: Any) -> Plan:
    """``plan(config, **kwargs)`` and apply it; return the plan."""
    result = plan(config, **kwargs)
    apply(result)
    return result


def remove(config: Path, *, force: bool = False) -> Plan:
    """``plan_remove(config)`` and apply it; return the plan."""
    result = plan_remove(config, force=force)
    apply(result)
    return result


# --------------------------------------------------------------------------- restarting containerd


def under_systemd(unit: str = UNIT, run: Runner = subprocess.run) -> bool:
    """True when systemd is PID 1 here and ``unit`` is active."""
    if not SYSTEMD_RUN_DIR.is_dir():
        return False
    try:
        res = run(["systemctl", "is-active", "--quiet", unit], capture_output=True, text=True, check=False)
    except OSError:
        return False
    return res.returncode == 0


def restart_hint(config: Path, unit: str = UNIT) -> str:
    """What to do to make containerd read ``config`` again."""
    return (
        f"containerd does not run as systemd unit {unit} here: restart it yourself so it reads {config} "
        f"(stop it, then start `containerd --config {config}` again)"
    )


def restart(config: Path, unit: str = UNIT, run: Runner = subprocess.run) -> str:
    """Restart ``unit`` through systemctl when containerd runs under systemd; else return the hint."""
    if not under_systemd(unit, run):
        return restart_hint(config, unit)
    res = run(["systemctl", "restart", unit], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ConfigError(f"systemctl restart {unit} failed: {res.stderr.strip() or f'exit {res.returncode}'}")
    return f"restarted {unit}"
