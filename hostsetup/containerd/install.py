"""Planning the install: NRI on, CDI on and the ``nvidia`` handler, placed where the containerd
that reads the config lets them win.

* containerd 2.x merges imports key by key: Mokka writes the drop-in ``conf.d/99-mokka.toml``
  next to the main config and appends it, relative, to the main config's ``imports``.
* containerd 1.7 replaces a whole ``plugins."<id>"`` table from an imported file (a drop-in
  holding ``[plugins."io.containerd.grpc.v1.cri"]`` would wipe the main file's sandbox image,
  runtimes and registry settings) and refuses to start on a missing import. So for 1.7 (and for
  a version 2 config when the containerd version is unknown) each key goes into the file that
  defines its plugin table: the main config, or the imported file that overrides that table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from .editor import Editor, Style, check_render
from .imports import Files, chain, covers, effective, verify
from .plan import Change, Plan
from .settings import DEFAULT_CDI_DIRS, Layout, config_version, detect_runtime, settings
from .tomldoc import MISSING, Key, Op, dotted, get, plain, text
from .version import detect_major

DROPIN = Path("conf.d/99-mokka.toml")


@dataclass
class _Edit:
    path: Path
    before: bytes | None
    after: bytes
    ops: list[Op]
    owned: bool = False


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

    ``containerd_version`` ("1.7", "2.1"; only versions the installer knows) or ``containerd`` (a
    binary to ask) choose the merge rules; without either, ``containerd`` on ``search_path``
    (default ``$PATH``) is asked. ``runtime`` is the nvidia handler's ``BinaryName``; default:
    ``nvidia-container-runtime`` if found, else runc.
    """
    main = Path(os.path.abspath(config))
    notes: list[str] = []
    files = Files()
    main_doc = files.doc(main)
    major = detect_major(containerd_version, containerd, search_path, notes)
    version = config_version(main, main_doc, major, notes)
    layout = Layout(version)
    deep = version == 3 or (major is not None and major >= 2)
    base = chain(files, main, notes, skip=main.parent / DROPIN)
    eff = effective(files, base, deep)
    binary = runtime or detect_runtime(eff, layout, search_path, notes)
    wanted = settings(layout, eff, binary, cdi_dirs, deep=deep)
    if deep:
        notes.append(f"containerd 2.x merges imports key by key: settings go to the drop-in {main.parent / DROPIN}")
        notes += _conflict_notes(files, base, wanted)
        edits = _dropin_edits(files, main, version, wanted)
    else:
        edits = _in_place_edits(files, main, layout, wanted, base)
        why = "1.7" if major is not None else "version unknown, assuming 1.7"
        notes.append(f"containerd {why}: an imported plugin table replaces the whole table, so settings go in place")
    edits = [e for e in edits if e.after != e.before]
    rules = [deep] if major is not None or deep else [False, True]
    verify(main, {e.path: e.after for e in edits}, wanted, rules)
    result = Plan("install", main, notes=notes, config_version=version, containerd_major=major, runtime=binary)
    result.placement = "drop-in" if deep else "in-place"
    if edits:
        ref = main if files.read(main) is not None else None
        for edit in sorted(edits, key=lambda e: not e.owned):  # the drop-in before the file importing it
            mode, uid, gid = _owner(edit.path if edit.before is not None else ref)
            result.changes.append(Change(edit.path, edit.before, edit.after, mode, uid, gid, ops=tuple(edit.ops)))
        result.notes.append(f"journal: {result.journal}; restart containerd to apply")
    return result


def _owner(path: Path | None) -> tuple[int, int, int]:
    if path is None:
        return 0o644, -1, -1
    st = Path(os.path.realpath(path)).stat()
    return st.st_mode & 0o7777, st.st_uid, st.st_gid


def _conflict_notes(files: Files, base: Sequence[Path], wanted: Sequence[tuple[Key, Any]]) -> list[str]:
    notes = []
    for path in base:
        doc = files.doc(path)
        for key, value in wanted:
            old = get(doc, key)
            if old is not MISSING and plain(old) != value and not isinstance(value, list):
                notes.append(f"{path} sets {dotted(key)} = {plain(old)!r}; the drop-in overrides it")
    return notes


def _dropin_edits(files: Files, main: Path, version: int, wanted: Sequence[tuple[Key, Any]]) -> list[_Edit]:
    """The drop-in with every setting, and the main config's ``imports`` line (deep-merge rules)."""
    dropin = main.parent / DROPIN
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by mokka (containerd-config install): NRI on, CDI on, the nvidia runtime."))
    doc.add(tomlkit.comment(f"`mokka containerd-config remove` deletes it and its entry in {main.name}'s imports."))
    doc.add("version", version)
    editor = Editor(dropin, doc, Style(table=0, key=2))
    for key, value in wanted:
        editor.set(key, value)
    edits = [_Edit(dropin, files.read(dropin), editor.render(), [], owned=True)]
    main_before = files.read(main)
    main_doc = files.doc(main)
    covered = covers(main, main_doc, dropin)
    if not covered or "version" not in main_doc:
        editor = Editor(main, main_doc, Style.of(text(main_before)))
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
    files: Files,
    main: Path,
    layout: Layout,
    wanted: Sequence[tuple[Key, Any]],
    base: Sequence[Path],
) -> list[_Edit]:
    """Settings written into the file that defines each plugin table last (1.7 replace rules)."""
    targets: dict[Path, list[tuple[Key, Any]]] = {}
    for key, value in wanted:
        plugin = key[:2]
        owner = next((p for p in reversed(base) if get(files.doc(p), plugin) is not MISSING), main)
        targets.setdefault(owner, []).append((key, value))
    edits = []
    for path, keys in targets.items():
        before = files.read(path)
        doc = files.doc(path)
        plain_before = doc.unwrap()
        editor = Editor(path, doc, Style.of(text(before)))
        if "version" not in doc:
            doc.add("version", layout.version)
            plain_before["version"] = layout.version
        for key, value in keys:
            editor.set(key, value)
        if not editor.ops and before is not None and "version" in plain_before:
            continue
        after = editor.render()
        if after != before:
            check_render(path, plain_before, after, keys)
            edits.append(_Edit(path, before, after, editor.ops))
    return edits
