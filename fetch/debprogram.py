"""One program (or file) of a Debian package, fetched and unpacked once into the cache: Prometheus and
the OCI registry the local cluster's tests run (:mod:`fetch.kube.versions`, the rest of the package
dropped), and what :mod:`fetch.prepare` checks is unpacked already."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fetch import debcache

__all__ = ["DebianProgram"]


@dataclass(frozen=True)
class DebianProgram:
    """``member`` (a path inside the package) of ``package`` from ``suite``."""

    suite: str
    package: str
    member: Path

    def binary(self, cache: Path | None = None) -> Path:
        """The program (fetched and unpacked once)."""
        deb = debcache.fetch(self.suite, [self.package], cache)[self.package]
        return debcache.unpacked(deb, self.member, cache, keep=[self.member])

    def cached(self, cache: Path | None = None) -> Path | None:
        """The program when the newest ``.deb`` fetched was unpacked already, else None (nothing fetched)."""
        deb = debcache.cached(self.suite, self.package, cache)
        path = (cache or debcache.default_cache()) / "extract" / deb.stem / self.member if deb else None
        return path if path is not None and path.exists() else None

    def __str__(self) -> str:
        return f"Debian {self.suite}'s {self.package}"
