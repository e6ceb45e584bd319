"""One Go module's files from the Go module proxy over HTTPS, without a Go toolchain.

The proxy protocol serves ``<proxy>/<escaped module>/@v/<version>.zip``; the zip is checked
against the module's pinned go.sum hash (``h1:``, Go's dirhash: SHA-256 of the sorted list of the
files' SHA-256 sums) before anything of it is kept, so a proxy can serve only the bytes Go itself
would accept. The proxy is the first HTTP(S) entry of ``$GOPROXY`` (Go's default otherwise); a CA
bundle given by ``$SSL_CERT_FILE`` is honoured, as Go and pip honour theirs.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

__all__ = ["DEFAULT_PROXY", "ProxyError", "dirhash", "escape", "fetch_zip", "proxy_url", "unpack"]

DEFAULT_PROXY = "https://proxy.golang.org"
TIMEOUT = 120  # seconds per request


class ProxyError(RuntimeError):
    """The module could not be fetched, or its files are not the pinned ones; the message says which."""


def escape(path: str) -> str:
    """A module path as the proxy and Go's module cache spell it (upper case as ``!`` + lower case)."""
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in path)


def proxy_url(environ: dict[str, str] | None = None) -> str:
    """The first HTTP(S) proxy of ``$GOPROXY`` (entries split on ``,`` or ``|``; ``direct``/``off`` skipped)."""
    value = (os.environ if environ is None else environ).get("GOPROXY", "")
    for entry in value.replace("|", ",").split(","):
        entry = entry.strip()
        if entry.startswith(("https://", "http://")):
            return entry.rstrip("/")
    return DEFAULT_PROXY


def dirhash(zipped: zipfile.ZipFile) -> str:
    """Go's ``h1:`` hash of a module zip (what go.sum records)."""
    lines = []
    for name in sorted(zipped.namelist()):
        if name.endswith("/"):
            continue
        lines.append(f"{hashlib.sha256(zipped.read(name)).hexdigest()}  {name}\n")
    return "h1:" + base64.b64encode(hashlib.sha256("".join(lines).encode()).digest()).decode()


def fetch_zip(module: str, version: str, expected: str) -> zipfile.ZipFile:
    """The module's zip from the proxy, its hash checked against ``expected``."""
    url = f"{proxy_url()}/{escape(module)}/@v/{escape(version)}.zip"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ProxyError(f"cannot fetch {module}@{version} from {url}: {getattr(exc, 'reason', exc)}") from None
    try:
        zipped = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise ProxyError(f"{url} is not a zip file ({len(data)} bytes)") from None
    got = dirhash(zipped)
    if got != expected:
        raise ProxyError(f"{module}@{version} from {url}: hash {got}, expected {expected} (go.sum's)")
    return zipped


def unpack(zipped: zipfile.ZipFile, module: str, version: str, dest: Path) -> None:
    """The module's files (the zip's ``module@version/`` prefix dropped) into ``dest``."""
    prefix = f"{module}@{version}/"
    for info in zipped.infolist():
        if info.is_dir():
            continue
        if not info.filename.startswith(prefix):
            raise ProxyError(f"{module}@{version}: the zip holds {info.filename!r} outside {prefix}")
        relative = Path(info.filename[len(prefix) :])
        if relative.is_absolute() or ".." in relative.parts:
            raise ProxyError(f"{module}@{version}: unsafe path {info.filename!r} in the zip")
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(zipped.read(info))
