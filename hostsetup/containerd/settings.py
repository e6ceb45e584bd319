"""What Mokka sets in containerd's config: NRI on, CDI on (with the spec directories), and an
``nvidia`` runtime handler; where each key lives for config versions 2 and 3."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .tomldoc import MISSING, Doc, Key, get, plain

DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
RUNTIME_NAME = "nvidia"
RUNC_SHIM = "io.containerd.runc.v2"
NRI_PLUGIN = "io.containerd.nri.v1.nri"
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def config_version(path: Path, doc: Doc, major: int | None, notes: list[str]) -> int:
    version = plain(doc.get("version", MISSING))
    if version is MISSING:
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


@dataclass(frozen=True)
class Layout:
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


def detect_runtime(eff: Mapping[str, Any], layout: Layout, search_path: str | None, notes: list[str]) -> str:
    if found := shutil.which("nvidia-container-runtime", path=search_path):
        notes.append(f"runtime handler {RUNTIME_NAME!r} -> {found}")
        return found
    default = get(eff, (*layout.cri, "containerd", "default_runtime_name"))
    name = default if isinstance(default, str) and default else "runc"
    configured = get(eff, (*layout.runtimes, name, "options", "BinaryName"))
    binary = configured if isinstance(configured, str) and configured else shutil.which("runc", path=search_path)
    binary = binary or "runc"
    notes.append(f"nvidia-container-runtime not found: runtime handler {RUNTIME_NAME!r} runs {binary} (plain runc)")
    return binary


def settings(
    layout: Layout, eff: Mapping[str, Any], binary: str, cdi_dirs: Sequence[str], *, deep: bool
) -> list[tuple[Key, Any]]:
    """Keys and values Mokka needs, in the order they are written."""
    dirs = get(eff, (*layout.cri, "cdi_spec_dirs"))
    dirs = list(dirs) if isinstance(dirs, list) else list(DEFAULT_CDI_DIRS)
    dirs += [d for d in cdi_dirs if d not in dirs]
    nvidia = (*layout.runtimes, RUNTIME_NAME)
    out: list[tuple[Key, Any]] = [
        ((*layout.cri, "enable_cdi"), True),
        ((*layout.cri, "cdi_spec_dirs"), dirs),
        ((*nvidia, "runtime_type"), RUNC_SHIM),
        ((*nvidia, "options", "BinaryName"), binary),
    ]
    default = get(eff, (*layout.cri, "containerd", "default_runtime_name"))
    name = default if isinstance(default, str) and default != RUNTIME_NAME else "runc"
    systemd = get(eff, (*layout.runtimes, name, "options", "SystemdCgroup"))
    if isinstance(systemd, bool):
        out.append(((*nvidia, "options", "SystemdCgroup"), systemd))
    if not deep and get(eff, layout.runtimes) is MISSING:
        # 1.7 decodes a runtimes table over its default map instead of into it: without this the
        # built-in runc entry vanishes and the CRI plugin fails ("no corresponding runtime configured").
        out.insert(2, ((*layout.runtimes, name, "runtime_type"), RUNC_SHIM))
    out.append(((*layout.nri, "disable"), False))
    return out
