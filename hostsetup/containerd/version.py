"""Which containerd the config is for: a version the installer knows, given or asked from a binary.

Only version strings are accepted as versions (never run as programs); the installer knows
containerd 1.7 (NRI opt-in, whole-table imports) and 2.x (key-by-key imports).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .errors import ConfigError

OLDEST = (1, 7)
NEWEST_MAJOR = 2
VERSION = re.compile(r"v?(\d+)\.(\d+)(?:[.~+-]\S*)?")


def parse(version: str, where: str = "containerd version") -> tuple[int, int]:
    """(major, minor) of ``1.7``, ``v2.1.9``, ``1.7.24~ds1``...; ConfigError for anything else or unknown."""
    m = VERSION.fullmatch(version.strip())
    if m is None:
        raise ConfigError(f"{where} {version!r}: not a version like 1.7 or 2.1")
    found = (int(m.group(1)), int(m.group(2)))
    if found < OLDEST:
        raise ConfigError(
            f"{where} {version}: containerd before 1.7 has no NRI; Mokka configures 1.7 and 2.x (upgrade containerd)"
        )
    if found[0] > NEWEST_MAJOR:
        raise ConfigError(f"{where} {version}: unknown to this Mokka, which configures containerd 1.7 and 2.x")
    return found


def containerd_major(version: str) -> int:
    return parse(version)[0]


def binary_major(binary: Path) -> int:
    """The major version ``binary --version`` reports."""
    try:
        res = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {binary} --version: {exc}") from None
    # "containerd github.com/containerd/containerd/v2 2.1.9 ..." / "containerd containerd.io 1.7.24 sha"
    words = res.stdout.split()
    if res.returncode != 0 or len(words) < 3 or not VERSION.fullmatch(words[2]):
        raise ConfigError(f"{binary} --version: unexpected output {res.stdout.strip() or res.stderr.strip()!r}")
    return parse(words[2], f"{binary} --version:")[0]


def detect_major(version: str | None, binary: Path | None, search_path: str | None, notes: list[str]) -> int | None:
    """From ``version``, else ``binary``, else ``containerd`` on ``search_path``; None when there is none."""
    if version is not None:
        return containerd_major(version)
    if binary is None:
        found = shutil.which("containerd", path=search_path)
        if found is None:
            return None
        binary = Path(found)
    major = binary_major(binary)
    notes.append(f"containerd {major}.x: version from {binary} --version")
    return major
