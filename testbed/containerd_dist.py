"""Real containerd builds from Debian's archive, cached privately, for tests and experiments.

containerd 1.7.24 (trixie) and 2.1.x (sid) run on bookworm when extracted (glibc >= 2.34);
runc comes from bookworm, because trixie's and sid's need glibc 2.38.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import debcache

__all__ = ["BINARIES", "SUITES", "fetch", "runc"]

SUITES = {"1.7": "trixie", "2.1": "sid"}
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
RUNC_SUITE = "bookworm"


def _unpacked(deb: Path, cache: Path, member: Path) -> Path:
    """``deb`` extracted once under ``<cache>/extract/<deb stem>``; return that directory."""
    dest = cache / "extract" / deb.stem
    if not (dest / member).exists():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        debcache.extract(deb, tmp)
        if not (tmp / member).exists():
            shutil.rmtree(tmp, ignore_errors=True)
            raise debcache.FetchError(f"{deb.name} has no {member}")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest


def _package_version(deb: Path) -> str:
    """Upstream version of a ``.deb`` file name: ``containerd_1.7.24~ds1-6_amd64.deb`` -> ``1.7.24``."""
    version = deb.name.split("_")[1].replace("%3a", ":")
    version = version.split(":", 1)[-1]
    return version.split("~")[0].split("+")[0].split("-")[0]


def fetch(version: str, cache: Path | None = None) -> Path:
    """Directory holding ``containerd``, ``containerd-shim-runc-v2`` and ``ctr`` of ``version`` ("1.7" or "2.1")."""
    if version not in SUITES:
        raise ValueError(f"no Debian containerd {version!r}; known: {', '.join(sorted(SUITES))}")
    cache = cache or debcache.default_cache()
    suite = SUITES[version]
    deb = debcache.fetch(suite, ["containerd"], cache)["containerd"]
    found = _package_version(deb)
    if not found.startswith(version + "."):
        raise debcache.FetchError(f"suite {suite!r} now ships containerd {found} ({deb.name}), not {version}.x")
    bindir = _unpacked(deb, cache, Path("usr/bin/containerd")) / "usr" / "bin"
    missing = [b for b in BINARIES if not (bindir / b).exists()]
    if missing:
        raise debcache.FetchError(f"{deb.name} lacks {', '.join(missing)}")
    return bindir


def runc(cache: Path | None = None) -> Path:
    """Path of bookworm's ``runc`` binary, downloaded and unpacked once."""
    cache = cache or debcache.default_cache()
    deb = debcache.fetch(RUNC_SUITE, ["runc"], cache)["runc"]
    member = Path("usr/sbin/runc")
    return _unpacked(deb, cache, member) / member
