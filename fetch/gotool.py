"""Pinned Go builds, once, cached by version; Go's own caches are dropped afterwards.

A Go toolchain is ``go`` from PATH (or /usr/local/go) when it is new enough, else Debian
trixie's golang, unpacked into the private cache (:data:`fetch.versions.GO_DEBIAN`; the
toolchain is self-contained). :func:`build` builds a :class:`fetch.versions.GoBuild`:

* a module from the Go module proxy through a throw-away wrapper module that requires it
  (``go install MODULE/CMD@VERSION`` would refuse modules with replace directives or ones the
  proxy does not list; the wrapper builds both, with the versions the module's go.mod pins);
* or a local module of this repository, copied first so the build writes nothing into it.

Binaries land in ``CACHE/gobin/<name>-<version>-<hash of what was asked>/`` and are reused;
each build gets its own GOPATH, module cache and build cache in a temporary directory that is
removed once the binaries are in place (a helm build leaves ~2 GB of them otherwise), unless
the caller passes ``caches``: a directory that several builds share and the caller removes
(:mod:`fetch.gobuilds`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fetch import debcache, versions
from fetch.versions import GoBuild

__all__ = [
    "BuildError",
    "build",
    "cache_environment",
    "cached",
    "candidates",
    "debian_toolchain",
    "drop_debian_toolchain",
    "existing",
    "find",
    "install",
    "output_dir",
    "prune",
    "remove_tree",
]

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """A Go toolchain could not be found or a pinned build failed."""


def _version(go: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.match(r"go(\d+)\.(\d+)", out.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def candidates() -> list[str]:
    """Where a Go toolchain may already be: PATH, then the official tarball's place."""
    return [c for c in (shutil.which("go"), "/usr/local/go/bin/go") if c]


def _debian(minimum: tuple[int, int]) -> versions.DebianPackage:
    try:
        return versions.GO_DEBIAN_BY_MINIMUM[minimum]
    except KeyError:
        raise BuildError(f"no Debian golang is pinned for Go {minimum[0]}.{minimum[1]}") from None


def debian_toolchain(cache: Path | None = None, minimum: tuple[int, int] = versions.GO_MINIMUM) -> Path:
    """Where Debian's golang (``go`` binary) of Go ``minimum`` is unpacked in the cache, whether it
    is there or not."""
    ver = _debian(minimum).upstream
    return (
        (cache or debcache.default_cache()) / "extract" / f"golang-{ver}" / "usr" / "lib" / f"go-{ver}" / "bin" / "go"
    )


def existing(cache: Path | None = None, minimum: tuple[int, int] = versions.GO_MINIMUM) -> Path | None:
    """A ``go`` binary of at least ``minimum`` (default :data:`fetch.versions.GO_MINIMUM`)
    already here (no network)."""
    for candidate in candidates():
        if os.path.exists(candidate) and (_version(candidate) or (0, 0)) >= minimum:
            return Path(candidate)
    go = debian_toolchain(cache, minimum)
    return go if go.exists() else None


def find(cache: Path | None = None, minimum: tuple[int, int] = versions.GO_MINIMUM) -> Path:
    """A ``go`` binary of at least ``minimum``, fetching Debian's golang of that version when needed."""
    if found := existing(cache, minimum):
        return found
    go = debian_toolchain(cache, minimum)
    if not go.exists():
        spec = _debian(minimum)
        root = go.parents[4]
        debs = debcache.fetch(spec.suite, [f"{spec.package}-go", f"{spec.package}-src"], cache)
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for deb in debs.values():
            debcache.extract(deb, tmp)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    return go


def drop_debian_toolchain(cache: Path | None = None) -> bool:
    """Remove every unpacked Debian golang (their .debs stay: unpacking again needs no network)."""
    dropped = False
    for minimum in versions.GO_DEBIAN_BY_MINIMUM:
        root = debian_toolchain(cache, minimum).parents[4]
        if root.exists():
            shutil.rmtree(root)
            dropped = True
    return dropped


def remove_tree(path: Path) -> None:
    """Remove ``path`` even where Go left its module cache read-only."""
    for dirpath, dirnames, _files in os.walk(path):
        for d in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, d), 0o755)
    shutil.rmtree(path, ignore_errors=True)


def prune(keep: list[GoBuild], cache: Path | None = None) -> list[str]:
    """Remove other builds of ``keep``'s programs (older versions or flags), crictl (no longer
    used) and the Go caches an older layout of this cache kept (``gobuild/``, ``gopath/``: the
    modules whose files are read now live in ``gomod/``); the names removed. Other programs'
    builds stay."""
    cache = cache or debcache.default_cache()
    wanted = {output_dir(spec, cache) for spec in keep}
    names = (*(f"{spec.name}-" for spec in keep), "crictl-")
    stale = [d for d in sorted((cache / "gobin").glob("*")) if d.is_dir() and d.name.startswith(names)]
    stale = [d for d in stale if d not in wanted] + [d for d in (cache / "gobuild", cache / "gopath") if d.exists()]
    for path in stale:
        remove_tree(path)
    return [str(p.relative_to(cache)) for p in stale]


def _source_digest(source: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def output_dir(spec: GoBuild, cache: Path | None = None) -> Path:
    """Where ``spec``'s binaries are (or will be): named by its version and a hash of everything asked."""
    asked: list[object] = [spec.module, spec.commands, spec.ldflags, spec.cgo, spec.env]
    if spec.source is not None:
        asked.append(_source_digest(spec.source))
    digest = hashlib.sha256(json.dumps(asked).encode()).hexdigest()[:12]
    return (cache or debcache.default_cache()) / "gobin" / f"{spec.name}-{spec.version}-{digest}"


def cached(spec: GoBuild, cache: Path | None = None) -> Path | None:
    """The directory with ``spec``'s binaries when they are built already (no Go needed)."""
    out = output_dir(spec, cache)
    return out if all((out / b).is_file() for b in spec.binaries) else None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held while one process builds into the cache (others wait, then find the build)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build(
    spec: GoBuild, cache: Path | None = None, progress: Progress | None = None, caches: Path | None = None
) -> Path:
    """Build ``spec`` once and return the directory holding its binaries (later calls: at once);
    ``caches``: Go's module and build caches there, shared with other builds, instead of the build's own."""
    cache = cache or debcache.default_cache()
    if found := cached(spec, cache):
        return found
    with locked(cache / "gobin" / f".{spec.name}.lock"):
        if found := cached(spec, cache):  # another process built it while we waited
            return found
        return _build(spec, cache, progress or (lambda _line: None), caches)


def _build(spec: GoBuild, cache: Path, progress: Progress, caches: Path | None) -> Path:
    out = output_dir(spec, cache)
    work = cache / "gobin" / f".work-{spec.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    go = str(find(cache))
    env = _environment(spec, caches or work)
    src = work / "src"
    staging = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        if spec.source is not None:
            shutil.copytree(spec.source, src)
            targets = ["."]
            dest = str(staging / spec.name)
        else:
            src.mkdir(parents=True)
            minimum = ".".join(map(str, versions.GO_MINIMUM))
            require = f"\nrequire {spec.module} {spec.version}\n" if spec.module else ""
            (src / "go.mod").write_text(f"module mokka.local/build/{spec.name}\n\ngo {minimum}\n{require}")
            if not spec.module:  # let Go find the module that holds the commands
                _go(go, ["get", *(f"{c}@{spec.version}" for c in spec.commands)], src, env)
            imports = "".join(f'\t_ "{c}"\n' for c in spec.commands)
            (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n")
            t0 = time.monotonic()
            _go(go, ["mod", "tidy"], src, env)
            progress(f"{spec.name} {spec.version}: modules resolved in {time.monotonic() - t0:.0f}s")
            targets = list(spec.commands)
            dest = str(staging) + "/"
        ldflags = " ".join(("-s", "-w", *spec.ldflags))
        staging.mkdir(parents=True)
        _go(go, ["build", "-trimpath", "-ldflags", ldflags, "-o", dest, *targets], src, env)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)  # the source; GOPATH, module cache (-modcacherw), build cache


def install(command_at_version: str, cache: Path | None = None) -> Path:
    """The binary of ``MODULE/CMD@VERSION`` (pinned: no ``@latest``), built once like any
    :class:`~fetch.versions.GoBuild`; for scripts (``kind/bootstrap.sh``) that need a tool
    the tests do not."""
    command, sep, version = command_at_version.partition("@")
    if not sep or not command or not version or version in ("latest", "upgrade", "patch"):
        raise BuildError(f"{command_at_version!r}: pin a version (MODULE/CMD@vX.Y.Z)")
    name = versions.command_name(command)
    return build(GoBuild(name=name, version=version, commands=(command,)), cache) / name


def cache_environment(caches: Path) -> dict[str, str]:
    """Go's GOPATH, module cache and build cache under ``caches`` (a build's own, or shared)."""
    return {
        "GOPATH": str(caches / "gopath"),
        "GOMODCACHE": str(caches / "gopath" / "pkg" / "mod"),
        "GOCACHE": str(caches / "gocache"),
    }


def _environment(spec: GoBuild, caches: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("GOROOT", "GOBIN", "GOPATH", "GOMODCACHE", "GOCACHE", "GOFLAGS"):
        env.pop(key, None)
    env.update(cache_environment(caches))
    env.update(
        GOWORK="off",
        GOFLAGS="-mod=mod -modcacherw",
        GOTOOLCHAIN="local",
        CGO_ENABLED="1" if spec.cgo else "0",
        **dict(spec.env),
    )
    return env


def _go(go: str, args: list[str], cwd: Path, env: dict[str, str]) -> str:
    try:
        res = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise BuildError(f"{go}: {exc}") from None
    if res.returncode != 0:
        raise BuildError(f"go {' '.join(args[:1])} in {cwd} failed:\n{res.stderr.strip()[-3000:]}")
    return res.stdout
