"""The real nvidia-smi, from Debian's non-free archive, cached privately.

Debian ships nvidia-smi 550 in trixie, 535 in bookworm and 555 in experimental; the
binaries need only glibc and dlopen ``libnvidia-ml.so.1``, so they run against Mokka's
library anywhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fetch import debcache, versions

SUITES = versions.NVIDIA_SMI_SUITES
BINARY = Path("usr/lib/nvidia/current/nvidia-smi")


def fetch(version: str, cache: Path | None = None) -> Path:
    """Path of nvidia-smi ``version`` ("550", "535" or "555"), downloading and unpacking it once."""
    if version not in SUITES:
        raise ValueError(f"no Debian nvidia-smi {version!r}; known: {', '.join(sorted(SUITES))}")
    deb = debcache.fetch(SUITES[version], ["nvidia-smi"], cache)["nvidia-smi"]
    return debcache.unpacked(deb, BINARY, cache)


def cached(version: str, cache: Path | None = None) -> Path | None:
    """nvidia-smi ``version`` if it is already unpacked in the cache (no network)."""
    cache = cache or debcache.default_cache()
    return next(iter(sorted((cache / "extract").glob(f"nvidia-smi_{version}*/{BINARY}"))), None)


def find(preferred: str = "550") -> Path | None:
    """An nvidia-smi already on this machine: the cache first, then PATH."""
    cache = debcache.default_cache() / "extract"
    for candidate in sorted(cache.glob(f"nvidia-smi_{preferred}*/{BINARY}")) + sorted(
        cache.glob(f"nvidia-smi_*/{BINARY}")
    ):
        return candidate
    found = shutil.which("nvidia-smi")
    return Path(found) if found else None
