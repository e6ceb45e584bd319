"""Real containerd builds from Debian's archive, cached privately, for the demo and the tests.

containerd 1.7.24 (trixie) and 2.1.x (sid) run on bookworm when extracted (glibc >= 2.34);
runc comes from bookworm, because trixie's and sid's need glibc 2.38 (:mod:`fetch.versions`).
Only the binaries used are kept in the cache.
"""

from __future__ import annotations

from pathlib import Path

from fetch import debcache, versions

__all__ = ["BINARIES", "SUITES", "fetch", "runc"]

SUITES = versions.CONTAINERD_SUITES
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


def _package_version(deb: Path) -> str:
    """Upstream version of a ``.deb`` file name: ``containerd_1.7.24~ds1-6_amd64.deb`` -> ``1.7.24``."""
    version = deb.name.split("_")[1].replace("%3a", ":")
    version = version.split(":", 1)[-1]
    return version.split("~")[0].split("+")[0].split("-")[0]


def fetch(version: str, cache: Path | None = None) -> Path:
    """Directory holding ``containerd``, ``containerd-shim-runc-v2`` and ``ctr`` of ``version`` ("1.7" or "2.1")."""
    if version not in SUITES:
        raise ValueError(f"no Debian containerd {version!r}; known: {', '.join(sorted(SUITES))}")
    suite = SUITES[version]
    deb = debcache.fetch(suite, ["containerd"], cache)["containerd"]
    found = _package_version(deb)
    if not found.startswith(version + "."):
        raise debcache.FetchError(f"suite {suite!r} now ships containerd {found} ({deb.name}), not {version}.x")
    binaries = [Path("usr/bin") / b for b in BINARIES]
    return debcache.unpacked(deb, binaries[0], cache, keep=binaries).parent


def runc(cache: Path | None = None) -> Path:
    """Path of bookworm's ``runc`` binary, downloaded and unpacked once."""
    deb = debcache.fetch(versions.RUNC_SUITE, ["runc"], cache)["runc"]
    member = Path("usr/sbin/runc")
    return debcache.unpacked(deb, member, cache, keep=[member])
