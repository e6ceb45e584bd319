"""Debian's Prometheus (one static-enough binary, linked to glibc only), fetched and unpacked once:
what the tests' Prometheus image holds (the chart's ``integrations.prometheus``)."""

from __future__ import annotations

from pathlib import Path

from fetch import debcache

from . import versions

__all__ = ["binary", "cached"]

MEMBER = Path("usr/bin/prometheus")


def binary(cache: Path | None = None) -> Path:
    """The prometheus binary of Debian's package (fetched and unpacked once, the rest dropped)."""
    deb = debcache.fetch(versions.PROMETHEUS_SUITE, [versions.PROMETHEUS_PACKAGE], cache)[versions.PROMETHEUS_PACKAGE]
    return debcache.unpacked(deb, MEMBER, cache, keep=[MEMBER])


def cached(cache: Path | None = None) -> Path | None:
    """The binary when it was unpacked already, else None (nothing fetched)."""
    root = (cache or debcache.default_cache()) / "extract"
    found = sorted(root.glob(f"{versions.PROMETHEUS_PACKAGE}_*/{MEMBER}"))
    return found[-1] if found else None
