"""The official CDI JSON schema, from Debian trixie's ``golang-tags.cncf-container-device-interface-dev``.

Fetched with :mod:`fetch.debcache` and unpacked once into the private cache; never vendored.
"""

from __future__ import annotations

from pathlib import Path

from fetch import debcache, versions

SUITE = versions.CDI_SPEC.suite
PACKAGE = versions.CDI_SPEC.package
SOURCE = Path("usr/share/gocode/src/tags.cncf.io/container-device-interface")
SCHEMA_DIR = SOURCE / "schema"

__all__ = ["PACKAGE", "SCHEMA_DIR", "SOURCE", "SUITE", "fetch_schema", "fetch_source"]


def fetch_source(cache: Path | None = None) -> Path:
    """The unpacked Go source of the reference CDI library (schema, testdata, ``pkg/cdi``)."""
    deb = debcache.fetch(SUITE, [PACKAGE], cache)[PACKAGE]
    return debcache.unpacked(deb, SCHEMA_DIR / "schema.json", cache).parents[1]


def fetch_schema(cache: Path | None = None) -> Path:
    """Directory holding the official ``schema.json`` and the ``defs.json`` it references."""
    return fetch_source(cache) / "schema"
