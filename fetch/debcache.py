"""Fetch Debian packages into a private cache, leaving the system's apt config alone.

Each suite gets its own apt state under ``<cache>/apt/<suite>/`` (``apt.conf`` used via
``APT_CONFIG``, sources, lists, an empty dpkg status; apt's binary package cache is kept in
memory only); downloaded ``.deb`` files land in ``<cache>/debs/<suite>/`` and are unpacked
once under ``<cache>/extract/<deb name>/`` (:func:`unpacked`). Once every requested package
is cached, no network is used; :func:`trim` drops the package lists (a later fetch of another
package updates them again) and empties the ``.deb`` files already unpacked. To inspect a
suite by hand: ``APT_CONFIG=<cache>/apt/<suite>/apt.conf apt-cache policy PKG``.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["FetchError", "cached", "default_cache", "extract", "fetch", "trim", "unpacked"]

log = logging.getLogger(__name__)

MIRROR = os.environ.get("MOKKA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
COMPONENTS = "main non-free non-free-firmware"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
ARCH = "amd64"
FRESH_SECONDS = 24 * 3600


class FetchError(RuntimeError):
    """A package or suite could not be fetched."""


def default_cache() -> Path:
    """Return ``$MOKKA_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/mokka``."""
    if env := os.environ.get("MOKKA_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "mokka"


def _system_proxies() -> dict[str, str]:
    """Return the system's apt proxy settings (its config parts are otherwise not read)."""
    found = {}
    for key in ("Acquire::http::Proxy", "Acquire::https::Proxy"):
        try:
            out = subprocess.run(
                ["apt-config", "shell", "V", key], capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            break
        if out.startswith("V=") and (value := "".join(shlex.split(out[2:]))):
            found[key] = value
    return found


class _Suite:
    """Private apt state for one suite."""

    def __init__(self, cache: Path, suite: str) -> None:
        self.suite = suite
        self.root = cache / "apt" / suite
        self.debs = cache / "debs" / suite
        self.stamp = self.root / "updated"
        self.config = self.root / "apt.conf"

    def prepare(self) -> None:
        for sub in (
            "sources.list.d",
            "parts",
            "preferences.d",
            "lists/partial",
            "cache/archives/partial",
            "state",
        ):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.debs.mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        self.write_config()
        sources = f"Types: deb\nURIs: {MIRROR}\nSuites: {self.suite}\nComponents: {COMPONENTS}\nSigned-By: {KEYRING}\n"
        path = self.root / "sources.list.d" / f"{self.suite}.sources"
        if not path.exists() or path.read_text() != sources:
            path.write_text(sources)
            self.stamp.unlink(missing_ok=True)

    def write_config(self) -> None:
        """Write the private apt.conf (read via ``APT_CONFIG``, before any system part)."""
        r = self.root
        items = {
            "Dir::Etc::main": "/dev/null",
            "Dir::Etc::Parts": r / "parts",
            "Dir::Etc::SourceList": "/dev/null",
            "Dir::Etc::SourceParts": r / "sources.list.d",
            "Dir::Etc::Preferences": "/dev/null",
            "Dir::Etc::PreferencesParts": r / "preferences.d",
            "Dir::State": r / "state",
            "Dir::State::Lists": r / "lists",
            "Dir::State::status": r / "status",
            "Dir::Cache": r / "cache",
            # apt's binary caches (pkgcache.bin, srcpkgcache.bin: ~50 MB each per suite) would
            # only speed up repeated apt calls; built in memory instead.
            "Dir::Cache::pkgcache": "",
            "Dir::Cache::srcpkgcache": "",
            "APT::Architecture": ARCH,
            "Acquire::Languages": "none",
            "Acquire::GzipIndexes": "true",
            # The archive copies this machine reaches can lag behind Debian's own: a
            # Release file past its Valid-Until date is still signed and checked.
            "Acquire::Check-Valid-Until": "false",
        }
        items.update(_system_proxies())
        if os.geteuid() == 0:
            items["APT::Sandbox::User"] = "root"
        lines = [f'{k} "{v}";' for k, v in items.items()]
        lines.append(f'APT::Architectures {{ "{ARCH}"; }};')
        self.config.write_text("\n".join(lines) + "\n")

    def apt(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "APT_CONFIG": str(self.config), "LC_ALL": "C"}
        return subprocess.run(["apt-get", "-q", *args], capture_output=True, text=True, cwd=cwd, env=env, check=False)

    def fresh(self) -> bool:
        try:
            return time.time() - self.stamp.stat().st_mtime < FRESH_SECONDS
        except FileNotFoundError:
            return False

    def has_lists(self) -> bool:
        return any((self.root / "lists").glob("*_Packages*"))

    def update(self) -> None:
        log.info("apt-get update (%s)", self.suite)
        res = self.apt("update")
        errors = _errors(res, warnings=True)
        if res.returncode == 0 and not errors and self.has_lists():
            self.stamp.touch()
            return
        msg = errors[0] if errors else res.stderr.strip() or f"exit {res.returncode}"
        if self.has_lists():
            log.warning("apt-get update (%s) failed, using stale lists: %s", self.suite, msg)
            return
        raise FetchError(f"suite {self.suite!r}: apt-get update failed: {msg}")

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "lock").open("w") as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield


def _errors(res: subprocess.CompletedProcess[str], *, warnings: bool = False) -> list[str]:
    """Return apt's ``E:`` lines (and, with ``warnings``, its ``W:`` lines)."""
    tags = ("E: ", "W: ") if warnings else ("E: ",)
    lines = (res.stderr + res.stdout).splitlines()
    return [ln[3:].strip() for ln in lines if ln.startswith(tags)]


def _version_cmp(a: Path, b: Path) -> int:
    va, vb = (p.name.split("_")[1].replace("%3a", ":") for p in (a, b))
    if va == vb:
        return 0
    lt = subprocess.run(["dpkg", "--compare-versions", va, "lt", vb], check=False)
    return -1 if lt.returncode == 0 else 1


def _cached(debs: Path, spec: str) -> Path | None:
    """Return the newest cached ``.deb`` for ``pkg`` or ``pkg=version``."""
    name, _, version = spec.partition("=")
    version = version.replace(":", "%3a") or "*"
    hits = list(debs.glob(f"{name}_{version}_*.deb"))
    return max(hits, key=functools.cmp_to_key(_version_cmp)) if hits else None


def cached(suite: str, spec: str, cache: Path | None = None) -> Path | None:
    """The newest ``.deb`` of ``spec`` (``pkg`` or ``pkg=version``) already fetched from ``suite`` (no network)."""
    debs = (cache or default_cache()) / "debs" / suite
    return _cached(debs, spec) if debs.is_dir() else None


def _download(suite: _Suite, spec: str) -> Path:
    res = suite.apt("download", "--print-uris", spec)
    errors = _errors(res)
    if res.returncode != 0 or errors:
        msg = errors[-1] if errors else res.stderr.strip()
        raise FetchError(f"suite {suite.suite!r}: package {spec!r}: {msg}")
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("'")), "")
    try:
        _uri, filename, size, *_ = line.split()
    except ValueError:
        raise FetchError(f"suite {suite.suite!r}: package {spec!r}: no download URI") from None
    target = suite.debs / filename
    if target.is_file() and target.stat().st_size == int(size):
        return target
    log.info("downloading %s (%s)", filename, suite.suite)
    res = suite.apt("download", spec, cwd=suite.debs)
    errors = _errors(res)
    if res.returncode != 0 or errors or not target.is_file():
        msg = errors[-1] if errors else res.stderr.strip() or f"{filename} missing"
        raise FetchError(f"suite {suite.suite!r}: package {spec!r}: {msg}")
    return target


def fetch(suite: str, packages: list[str], cache: Path | None = None, *, refresh: bool = False) -> dict[str, Path]:
    """Download ``packages`` (``pkg`` or ``pkg=version``) from ``suite``; map each to its .deb.

    Already-cached packages are returned without network access unless ``refresh``.
    """
    state = _Suite(cache or default_cache(), suite)
    with state.locked():
        state.prepare()
        result = {p: d for p in packages if (d := _cached(state.debs, p)) and not refresh}
        missing = [p for p in packages if p not in result]
        if not missing:
            return result
        if refresh or not state.fresh() or not state.has_lists():
            state.update()
        for spec in missing:
            result[spec] = _download(state, spec)
        return {p: result[p] for p in packages}


def extract(deb: Path, dest: Path) -> Path:
    """Unpack ``deb``'s files into ``dest`` with ``dpkg -x``; return ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = ["dpkg", "-x", str(deb), str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise FetchError(f"dpkg -x {deb}: {res.stderr.strip() or f'exit {res.returncode}'}")
    return dest


def unpacked(deb: Path, member: Path, cache: Path | None = None, *, keep: Sequence[Path] = ()) -> Path:
    """``deb`` unpacked once under ``<cache>/extract/<deb name>``; return the path of ``member`` in it.

    ``keep``: the only paths (files or directories, relative like ``member``) worth keeping;
    everything else the package holds is deleted after unpacking.
    """
    dest = (cache or default_cache()) / "extract" / deb.stem
    if (dest / member).exists():
        return dest / member
    if deb.stat().st_size == 0:  # emptied by trim(): this unpacking needs more than was kept
        deb = _refetch(deb, cache or default_cache())
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        extract(deb, tmp)
        if not (tmp / member).exists():
            raise FetchError(f"{deb.name} has no {member}")
        if keep:
            _keep_only(tmp, [tmp / k for k in keep])
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / member


def _keep_only(root: Path, keep: list[Path]) -> None:
    """Delete every file under ``root`` that is not one of ``keep`` or inside one; then empty directories."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        here = Path(dirpath)
        for name in filenames:
            path = here / name
            if not any(path == k or k in path.parents for k in keep):
                path.unlink()
        for name in dirnames:
            path = here / name
            if path.is_symlink():
                if not any(path == k or k in path.parents for k in keep):
                    path.unlink()
            elif not any(path.iterdir()):
                path.rmdir()


def _refetch(deb: Path, cache: Path) -> Path:
    """Download again a ``.deb`` that :func:`trim` emptied (its name gives package and version,
    its directory the suite)."""
    package, version = deb.name.split("_")[:2]
    state = _Suite(cache, deb.parent.name)
    with state.locked():
        state.prepare()
        if not state.fresh() or not state.has_lists():
            state.update()
        deb.unlink(missing_ok=True)
        return _download(state, f"{package}={version.replace('%3a', ':')}")


def trim(cache: Path | None = None) -> int:
    """Drop every suite's package lists (and any binary cache an older version left), and empty
    each ``.deb`` already unpacked under ``extract/`` (its name stays: :func:`fetch` still knows
    it, and :func:`unpacked` downloads it again only to unpack more than it kept). Packages
    never unpacked stay whole, usable offline. Returns the bytes freed."""
    cache = cache or default_cache()
    freed = 0
    for root in sorted((cache / "apt").glob("*/")):
        suite = _Suite(cache, root.name)
        with suite.locked():
            for waste in (root / "lists", root / "cache"):
                freed += sum(f.stat().st_size for f in waste.rglob("*") if f.is_file() and not f.is_symlink())
                shutil.rmtree(waste, ignore_errors=True)
            suite.stamp.unlink(missing_ok=True)
    for deb in sorted((cache / "debs").glob("*/*.deb")):
        if not deb.is_symlink() and deb.stat().st_size and (cache / "extract" / deb.stem).is_dir():
            freed += deb.stat().st_size
            deb.write_bytes(b"")
    return freed


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m nri_mokka.debcache SUITE PKG... [--extract DIR]``."""
    ap = argparse.ArgumentParser(prog="python -m nri_mokka.debcache", description=__doc__)
    ap.add_argument("suite", help="Debian suite, e.g. bookworm, trixie, sid")
    ap.add_argument("packages", nargs="+", metavar="PKG", help="package or package=version")
    ap.add_argument("--extract", type=Path, metavar="DIR", help="dpkg -x each package into DIR")
    ap.add_argument("--cache", type=Path, help="cache directory (default: %(default)s)", default=default_cache())
    ap.add_argument("--refresh", action="store_true", help="update lists, re-resolve packages")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="debcache: %(message)s", stream=sys.stderr)
    try:
        debs = fetch(args.suite, args.packages, args.cache, refresh=args.refresh)
        for pkg, deb in debs.items():
            print(f"{pkg}\t{deb}")
            if args.extract:
                extract(deb, args.extract)
                log.info("extracted %s into %s", deb.name, args.extract)
    except FetchError as exc:
        print(f"debcache: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
