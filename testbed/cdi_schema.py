"""The official CDI JSON schema, from Debian trixie's ``golang-tags.cncf-container-device-interface-dev``.

Fetched with :mod:`testbed.debcache` and unpacked once into the private cache; never vendored.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from testbed import debcache

SUITE = "trixie"
PACKAGE = "golang-tags.cncf-container-device-interface-dev"
SOURCE = Path("usr/share/gocode/src/tags.cncf.io/container-device-interface")
SCHEMA_DIR = SOURCE / "schema"

__all__ = ["PACKAGE", "SCHEMA_DIR", "SOURCE", "SUITE", "fetch_schema", "fetch_source"]


def fetch_source(cache: Path | None = None) -> Path:
    """The unpacked Go source of the reference CDI library (schema, testdata, ``pkg/cdi``)."""
    cache = cache or debcache.default_cache()
    deb = debcache.fetch(SUITE, [PACKAGE], cache)[PACKAGE]
    dest = cache / "extract" / deb.stem
    source = dest / SOURCE
    if not (source / "schema" / "schema.json").is_file():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        debcache.extract(deb, tmp)
        if not (tmp / SCHEMA_DIR / "schema.json").is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise debcache.FetchError(f"{deb.name} has no {SCHEMA_DIR / 'schema.json'}")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return source


def fetch_schema(cache: Path | None = None) -> Path:
    """Directory holding the official ``schema.json`` and the ``defs.json`` it references."""
    return fetch_source(cache) / "schema"
