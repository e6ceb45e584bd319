"""A Go toolchain for building Go consumers (go-nvml programs) in tests and demos.

Uses `go` from PATH when it is new enough, else Debian trixie's golang, fetched into the
private cache and unpacked there (the Go toolchain is self-contained: no install needed).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from . import debcache

MINIMUM = (1, 24)  # crictl v1.34 needs go 1.24.1
DEBIAN = ("trixie", "1.24")


def _version(go: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.match(r"go(\d+)\.(\d+)", out.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def find(cache: Path | None = None) -> Path:
    """Path of a `go` binary of at least MINIMUM, fetching Debian's when needed."""
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.path.exists(candidate) and (_version(candidate) or (0, 0)) >= MINIMUM:
            return Path(candidate)
    cache = cache or debcache.default_cache()
    suite, ver = DEBIAN
    root = cache / "extract" / f"golang-{ver}"
    go = root / "usr" / "lib" / f"go-{ver}" / "bin" / "go"
    if not go.exists():
        debs = debcache.fetch(suite, [f"golang-{ver}-go", f"golang-{ver}-src"], cache)
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for deb in debs.values():
            debcache.extract(deb, tmp)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    return go


def build(package_dir: Path, output: Path, cache: Path | None = None) -> Path:
    """`go build` a module directory (modules from the Go module proxy, cached privately)."""
    go = find(cache)
    cache = cache or debcache.default_cache()
    env = dict(os.environ)
    env.update(
        GOPATH=str(cache / "gopath"),
        GOCACHE=str(cache / "gobuild"),
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
        CGO_ENABLED="1",
        CGO_CFLAGS="-O2 -Wno-deprecated-declarations",
    )
    env.pop("GOROOT", None)
    subprocess.run(
        [str(go), "build", "-o", str(output), "."], cwd=package_dir, env=env, check=True, capture_output=True, text=True
    )
    return output


def install(module_at_version: str, cache: Path | None = None, ldflags: Sequence[str] = ()) -> Path:
    """`go install MODULE/CMD@VERSION` into the private cache; the path of the binary.

    The version must be pinned (no ``@latest``): the binary lands in
    ``CACHE/gobin/<name>-<version>[-<ldflags hash>]/<name>`` and is reused on later calls
    without Go being asked again. Modules come from the Go module proxy, built with this
    cache's GOPATH. ``ldflags`` (e.g. ``-X pkg.var=value``) are what a project's own release
    build stamps in and ``go install`` alone leaves out.
    """
    package, sep, version = module_at_version.partition("@")
    if not sep or not package or not version or version in ("latest", "upgrade", "patch"):
        raise ValueError(f"{module_at_version!r}: pin a version (MODULE/CMD@vX.Y.Z)")
    cache = cache or debcache.default_cache()
    name = package.rstrip("/").rsplit("/", 1)[-1]
    if re.fullmatch(r"v\d+", name):  # a module's major-version suffix is not the command's name
        name = package.rstrip("/").rsplit("/", 2)[-2]
    tag = f"-{hashlib.sha256(' '.join(ldflags).encode()).hexdigest()[:12]}" if ldflags else ""
    bindir = cache / "gobin" / f"{name}-{version}{tag}"
    binary = bindir / name
    if binary.exists():
        return binary
    go = find(cache)
    tmp = bindir.with_name(bindir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        GOPATH=str(cache / "gopath"),
        GOCACHE=str(cache / "gobuild"),
        GOBIN=str(tmp),
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
        CGO_ENABLED="0",
    )
    env.pop("GOROOT", None)
    try:
        subprocess.run(
            [str(go), "install", "-trimpath", *(["-ldflags", " ".join(ldflags)] if ldflags else []), module_at_version],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"go install {module_at_version} failed:\n{exc.stderr.strip()}") from None
    shutil.rmtree(bindir, ignore_errors=True)
    tmp.rename(bindir)
    return binary
