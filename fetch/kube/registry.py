"""Debian's ``docker-registry`` (CNCF distribution's registry, one Go binary linked to glibc only),
fetched and unpacked once: the plain OCI registry the local cluster runs for images a chart pulls
with ``imagePullPolicy: Always`` (:mod:`localcluster.registry`)."""

from __future__ import annotations

from pathlib import Path

from fetch import debcache

from . import versions

__all__ = ["binary", "cached"]

MEMBER = Path("usr/bin/docker-registry")


def binary(cache: Path | None = None) -> Path:
    """The registry binary of Debian's package (fetched and unpacked once, the rest dropped)."""
    deb = debcache.fetch(versions.REGISTRY_SUITE, [versions.REGISTRY_PACKAGE], cache)[versions.REGISTRY_PACKAGE]
    return debcache.unpacked(deb, MEMBER, cache, keep=[MEMBER])


def cached(cache: Path | None = None) -> Path | None:
    """The binary when it was unpacked already, else None (nothing fetched)."""
    root = (cache or debcache.default_cache()) / "extract"
    found = sorted(root.glob(f"{versions.REGISTRY_PACKAGE}_*/{MEMBER}"))
    return found[-1] if found else None
