"""One program of a Debian package (a binary linked to glibc only), fetched and unpacked once into
the cache with the rest of the package dropped: Prometheus and the OCI registry the local cluster's
tests run (:mod:`fetch.kube.versions`)."""

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
        """The program when it was unpacked already, else None (nothing fetched)."""
        root = (cache or debcache.default_cache()) / "extract"
        found = sorted(root.glob(f"{self.package}_*/{self.member}"))
        return found[-1] if found else None

    def __str__(self) -> str:
        return f"Debian {self.suite}'s {self.package}"
