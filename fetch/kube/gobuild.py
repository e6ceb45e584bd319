"""Pinned Go builds through a wrapper module, cached by version; Go's own caches dropped afterwards.

Some Go programs cannot be built with ``go install MODULE/CMD@VERSION``: Kubernetes' go.mod
replaces its staging modules with ``./staging/...`` paths, and NVIDIA's device plugin is not
listed by the module proxy. A wrapper module that *requires* the program's module (redirecting
local replaces to the published staging modules) builds them. The binaries land in
``CACHE/kube/bin/<name>-<version>-<flags hash>/`` and are reused; the module and build caches
of the build live in a temporary directory that is removed once the binaries are in place, or,
where the caller passes ``caches``, in that directory, shared with other builds
(:mod:`fetch.gobuilds`: Kubernetes and kubeadm compile the same packages).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fetch import debcache, gotool, versions

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class BuildError(RuntimeError):
    """A pinned Go build failed."""


@dataclass(frozen=True)
class GoBuild:
    """What to build: ``commands`` (package paths) of ``module`` at ``version``; or, with ``main``,
    that Go file as the wrapper module's main package — one program called ``name``, with symlinks
    ``links`` to it (a multi-call program choosing by the name it runs as).

    ``staging_version``: the module's local ``=> ./staging/...`` replaces point at the published
    modules of this version instead (Kubernetes). ``cgo``: the commands need cgo (go-nvml's dlopen).
    ``go``: the Go version the module's go.mod asks for (a toolchain at least that new builds it).
    ``files``: paths inside the module copied beside the binaries (the configuration a program
    ships in its module, e.g. KWOK's stages; a directory is copied whole: the GPU Operator's chart
    and assets), each under its base name, or ``(path, name)`` under ``name``. ``requires``: modules the
    wrapper requires at these versions besides ``module`` (one the module replaces with a local
    directory, which a dependency's replace cannot do: NFD's ``api/nfd``). ``replaces``: modules
    the build takes at another version than the module asks (one the proxy does not serve).
    """

    name: str
    module: str
    version: str
    commands: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    staging_version: str | None = None
    cgo: bool = False
    env: tuple[tuple[str, str], ...] = field(default=())
    main: Path | None = None
    links: tuple[str, ...] = ()
    go: tuple[int, int] = versions.GO_MINIMUM
    files: tuple[str | tuple[str, str], ...] = ()
    requires: tuple[tuple[str, str], ...] = ()
    replaces: tuple[tuple[str, str], ...] = ()

    @property
    def binaries(self) -> tuple[str, ...]:
        if self.main is not None:
            return (self.name, *self.links)
        return tuple(c.rstrip("/").rsplit("/", 1)[-1] for c in self.commands)

    def key(self) -> str:
        source = self.main.read_text() if self.main is not None else ""
        asked: list[object] = [
            self.commands,
            self.ldflags,
            self.staging_version,
            self.cgo,
            self.env,
            source,
            self.links,
        ]
        if self.go != versions.GO_MINIMUM or self.files:  # keys of the builds before these fields stay
            asked += [self.go, self.files]
        if self.requires:
            asked.append(self.requires)
        if self.replaces:
            asked.append(self.replaces)
        desc = json.dumps(asked)
        return f"{self.name}-{self.version}-{hashlib.sha256(desc.encode()).hexdigest()[:10]}"


def bin_root(cache: Path | None = None) -> Path:
    return (cache or debcache.default_cache()) / "kube" / "bin"


def cached(spec: GoBuild, cache: Path | None = None) -> Path | None:
    """The directory with ``spec``'s binaries when they are built already."""
    out = bin_root(cache) / spec.key()
    wanted = [*spec.binaries, *(name for _path, name in _files(spec))]
    return out if all((out / b).exists() for b in wanted) and (out / "build.json").is_file() else None


def build(
    spec: GoBuild, cache: Path | None = None, progress: Progress = stderr_progress, caches: Path | None = None
) -> Path:
    """Build ``spec`` once (later calls return the cached directory at once); ``caches``: Go's
    module and build caches there, shared with other builds, instead of the build's own."""
    cache = cache or debcache.default_cache()
    if found := cached(spec, cache):
        return found
    with gotool.locked(bin_root(cache) / f".{spec.name}.lock"):
        if found := cached(spec, cache):  # another process built it while we waited
            return found
        _sweep(spec, cache)
        return _build(spec, cache, progress, caches)


def prune(keep: Sequence[GoBuild], cache: Path | None = None) -> list[str]:
    """Remove the other builds of ``keep``'s programs (an older version, source or flags: a build
    is keyed by all of them); the names removed."""
    root = bin_root(cache)
    wanted = {spec.key() for spec in keep}
    stale = [
        d
        for spec in keep
        for d in sorted(root.glob(f"{spec.name}-v*"))
        if d.is_dir() and d.name not in wanted and ".tmp" not in d.name
    ]
    for d in stale:
        shutil.rmtree(d, ignore_errors=True)
    return [d.name for d in stale]


def _sweep(spec: GoBuild, cache: Path) -> None:
    """Remove what builds of ``spec.name`` killed midway left (their process is gone)."""
    root = bin_root(cache)
    for left in [*root.glob(f"{spec.name}-*.tmp*"), *root.parent.glob(f"work-{spec.name}-*")]:
        pid = left.name.rsplit(".tmp", 1)[-1] if ".tmp" in left.name else left.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove_work(left)


def _build(spec: GoBuild, cache: Path, progress: Progress, caches: Path | None) -> Path:
    out = bin_root(cache) / spec.key()
    work = cache / "kube" / f"work-{spec.name}-{os.getpid()}"
    _remove_work(work)
    (work / "src").mkdir(parents=True)
    env = _go_env(spec, caches or work)
    go = str(gotool.find(cache, spec.go))
    t0 = time.monotonic()
    try:
        src = work / "src"
        go_version = ".".join(map(str, spec.go))
        (src / "go.mod").write_text(
            f"module mokka.local/build/{spec.name}\n\ngo {go_version}\n\nrequire {spec.module} {spec.version}\n"
            + "".join(f"require {module} {version}\n" for module, version in spec.requires)
            + "".join(f"replace {module} => {module} {version}\n" for module, version in spec.replaces)
        )
        if spec.staging_version:
            step = _step(progress, spec, f"downloading {spec.module}@{spec.version}")
            info = json.loads(_go(go, ["mod", "download", "-json", f"{spec.module}@{spec.version}"], src, env))
            replaces = staging_replaces(Path(info["GoMod"]).read_text(), spec.staging_version)
            with (src / "go.mod").open("a") as fh:
                fh.write("\n" + "".join(f"replace {m} => {m} {v}\n" for m, v in sorted(replaces.items())))
            step()
        if spec.main is not None:
            shutil.copy(spec.main, src / "main.go")
        else:
            imports = "".join(f'\t_ "{c}"\n' for c in spec.commands)
            (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n")
        step = _step(progress, spec, "resolving modules (go mod tidy)")
        _go(go, ["mod", "tidy"], src, env)
        step()
        step = _step(progress, spec, f"compiling {', '.join(spec.binaries)}")
        tmp_out = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp_out, ignore_errors=True)
        ldflags = " ".join(("-s", "-w", *spec.ldflags))
        if spec.main is not None:
            targets, dest = ["."], str(tmp_out / spec.name)
        else:
            targets, dest = list(spec.commands), str(tmp_out) + "/"
        _go(go, ["build", "-trimpath", "-ldflags", ldflags, "-o", dest, *targets], src, env)
        for link in spec.links:
            (tmp_out / link).symlink_to(spec.name)
        if spec.files:
            module_dir = Path(json.loads(_go(go, ["list", "-m", "-json", spec.module], src, env))["Dir"])
            for path, name in _files(spec):
                if (module_dir / path).is_dir():
                    shutil.copytree(module_dir / path, tmp_out / name, copy_function=shutil.copyfile)
                    _writable(tmp_out / name)  # the module cache's copies are read-only
                else:
                    shutil.copyfile(module_dir / path, tmp_out / name)
        step()
        sizes = {b: (tmp_out / b).stat().st_size for b in spec.binaries if not (tmp_out / b).is_symlink()}
        (tmp_out / "build.json").write_text(
            json.dumps({"spec": spec.key(), "seconds": round(time.monotonic() - t0, 1), "sizes": sizes}, indent=1)
        )
        shutil.rmtree(out, ignore_errors=True)
        tmp_out.rename(out)
        total = sum(sizes.values()) / 2**20
        progress(f"{spec.name} {spec.version}: built in {time.monotonic() - t0:.0f}s, {total:.0f} MiB of binaries")
        return out
    finally:
        _remove_work(work, go, None if caches else env)  # shared caches stay for the next build


def staging_replaces(gomod: str, version: str) -> dict[str, str]:
    """``{module: version}`` for every ``MODULE => ./staging/...`` replace in a go.mod text."""
    found = re.findall(r"^\s*(?:replace\s+)?(\S+)\s*=>\s*\./staging/\S+\s*$", gomod, re.MULTILINE)
    return dict.fromkeys(found, version)


def _go_env(spec: GoBuild, caches: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("GOROOT", "GOBIN", "GOWORK"):
        env.pop(key, None)
    env.update(gotool.cache_environment(caches))
    env.update(
        GOFLAGS="-mod=mod -modcacherw",  # shared caches are removed without Go
        GOTOOLCHAIN="local",
        CGO_ENABLED="1" if spec.cgo else "0",
    )
    env.update(spec.env)  # the spec's own win (a newer GOTOOLCHAIN, taken from the module proxy)
    return env


def _why(res: subprocess.CompletedProcess[str]) -> str:
    """Go's reason for a failure in one line: a ``-json`` answer's ``Error``, else its last line."""
    if found := re.search(r'"Error":\s*("(?:[^"\\]|\\.)*")', res.stdout):
        return str(json.loads(found.group(1)))
    for text in (res.stderr, res.stdout):
        if lines := [line.strip() for line in text.splitlines() if line.strip()]:
            return lines[-1]
    return f"exit {res.returncode}"


def _go(go: str, args: list[str], cwd: Path, env: dict[str, str]) -> str:
    res = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"go {' '.join(args[:2])} failed: {_why(res)}")
    return res.stdout


def _step(progress: Progress, spec: GoBuild, what: str) -> Callable[[], None]:
    progress(f"{spec.name} {spec.version}: {what} ...")
    t0 = time.monotonic()
    return lambda: progress(f"{spec.name} {spec.version}: {what} done ({time.monotonic() - t0:.0f}s)")


def _files(spec: GoBuild) -> list[tuple[str, str]]:
    """(path in the module, name beside the binaries) of each of ``spec.files``."""
    return [(f, Path(f).name) if isinstance(f, str) else f for f in spec.files]


def _writable(tree: Path) -> None:
    for dirpath, _dirs, _files in os.walk(tree):
        os.chmod(dirpath, 0o755)


def _remove_work(work: Path, go: str | None = None, env: dict[str, str] | None = None) -> None:
    """Remove a build's temporary GOPATH and caches (the module cache is read-only: Go cleans it)."""
    if not work.exists():
        return
    if go and env:
        subprocess.run([go, "clean", "-modcache"], cwd=work, env=env, capture_output=True, check=False)
    for dirpath, dirnames, _files in os.walk(work):
        for d in dirnames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, d), 0o755)
    shutil.rmtree(work, ignore_errors=True)
