"""Debian's static busybox (every applet linked): the root of the small images Mokka builds."""

from __future__ import annotations

from pathlib import Path

from fetch import debcache, versions

__all__ = ["fetch"]


def fetch(cache: Path | None = None) -> Path:
    """Debian bookworm's static busybox, downloaded and unpacked once into the cache."""
    cache = cache or debcache.default_cache()
    deb = debcache.fetch(versions.BUSYBOX_SUITE, ["busybox-static"], cache)["busybox-static"]
    return debcache.unpacked(deb, Path("bin/busybox"), cache)
