"""Mokka's image built from the repository's own Dockerfile with Debian's podman, without docker
and without a container registry, as an archive ``kind load image-archive`` takes.

``python -m kind.dockerfile_image --out mokka.tar [--tag mokka:dev] [--nvidia-smi 550]`` (root):

1. the Dockerfile's base image, ``debian:bookworm-slim``, made from Debian's archive by
   bookworm's mmdebstrap (fetched and unpacked into the cache by :mod:`fetch.debcache`; the
   machine's apt sources are never read or changed): the ``minbase`` variant (Priority: required
   and apt; ``usr-is-merged`` rather than the perl-based ``usrmerge``), slimmed the way Debian's
   official slim images are (dpkg path-excludes for documentation, manual pages, info pages and
   translations, copyright files kept, the rules left in the image so later installs stay slim),
   apt and dpkg set up for image builds (no apt caches, no translations, gzipped lists, no
   services started, no fsync), and deb822 sources naming the archive as this machine reaches it
   (``$MOKKA_DEBIAN_MIRROR``, default deb.debian.org: bookworm, -updates, -security). The rootfs
   tarball is cached under ``<cache>/dockerfile-image/`` keyed by every input of the recipe;
2. ``podman build`` of the Dockerfile, unchanged, with all of podman's state private: the image
   store (overlay, kept between builds so a second build reuses every layer) under
   ``<cache>/dockerfile-image/storage``, everything else (configuration, run root, libpod's
   database, runc's state, temporary files) in a directory removed afterwards, every podman call
   in a private mount namespace (none of its mounts reaches the host), its containers under a
   private cgroup parent removed afterwards. The RUN steps share the host's network namespace
   (``--network host``: podman then sets up no network at all, no bridge, no firewall rule), so
   they reach Debian's archive and PyPI as the host does; when the host's pip trusts a CA bundle
   of its own (``PIP_CERT``, ``REQUESTS_CA_BUNDLE`` or a pip.conf ``cert``: an intercepting
   proxy's CA), root's RUN steps get a build-time home mounted over /root with a pip.conf naming
   a copy of that bundle (a volume over a directory every stage has: nothing of it reaches a layer);
3. ``podman save`` as a docker archive of ``docker.io/library/<name>:<tag>`` (what a pod's
   ``image: mokka:dev`` means to containerd).

One file, though long: the base image's recipe, the private podman and the build share one cache
layout, one lock and one error type, and are one developer tool (not in the wheel).
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python kind/dockerfile_image.py` as well as `python -m`
    sys.path.insert(0, str(REPO))

from containers import cleanup  # noqa: E402
from containers.command import SandboxError  # noqa: E402
from fetch import containerd_dist, debcache  # noqa: E402
from fetch.progress import Progress  # noqa: E402

__all__ = [
    "BASE_IMAGE",
    "ImageError",
    "Podman",
    "base_rootfs",
    "build",
    "cached_base",
    "full_name",
    "main",
]

SUITE = "bookworm"
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"  # the Dockerfile's ARG DEBIAN_IMAGE default
MMDEBSTRAP_SUITE = "bookworm"
RECIPE_VERSION = 1  # raise when the recipe changes in a way its data below does not show
ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")  # podman's defaults are above root's hard limits here
BUILD_TIMEOUT = 3600.0
CALL_TIMEOUT = 600.0

# What Debian's slim images drop: dpkg path filters, kept in the image (/etc/dpkg/dpkg.cfg.d/).
SLIM_EXCLUDE = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
)
SLIM_INCLUDE = (
    "/usr/share/doc/*/copyright",
    "/usr/share/locale/locale.alias",
    "/usr/share/locale/languages",
    "/usr/share/locale/all_languages",
    "/usr/share/locale/currency/*",
    "/usr/share/locale/l10n/*",
)
DPKG_OPTIONS = (
    *(f"path-exclude={p}" for p in SLIM_EXCLUDE),
    *(f"path-include={p}" for p in SLIM_INCLUDE),
    "force-unsafe-io",  # an image build is thrown away on power loss anyway
)
_CLEAN = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
APT_OPTIONS = (
    'Acquire::Languages "none";',
    'Acquire::GzipIndexes "true";',
    'Dir::Cache::pkgcache "";',
    'Dir::Cache::srcpkgcache "";',
    f"DPkg::Post-Invoke {{ {_CLEAN} }};",
    f"APT::Update::Post-Invoke {{ {_CLEAN} }};",
    'APT::AutoRemove::SuggestsImportant "false";',
)
# mmdebstrap's own merged-/usr hooks: the /usr symlinks made up front and usr-is-merged installed
# (else apt satisfies init-system-helpers' "usrmerge | usr-is-merged" with usrmerge, and perl).
HOOK_DIR = "usr/share/mmdebstrap/hooks/merged-usr"
_SLIM_SWEEP = (  # what was there before the filters applied (install-info's dir, ...), then empty directories
    f"for d in {' '.join(p.removesuffix('/*') for p in SLIM_EXCLUDE)}; do "
    'if [ -d "$1$d" ]; then find "$1$d" -mindepth 1 ! -type d '
    + " ".join(f'! -path "$1{p}"' for p in SLIM_INCLUDE)
    + ' -delete && find "$1$d" -mindepth 1 -type d -empty -delete; fi; done'
)
# Run in the new root (as $1) after mmdebstrap is done: deb822 sources under their usual name,
# no service starts from maintainer scripts, nothing of the machine that made it.
CUSTOMIZE = (
    'rm -f "$1/etc/apt/sources.list" "$1"/etc/apt/sources.list.d/*.sources',
    'cp "$MOKKA_SOURCES" "$1/etc/apt/sources.list.d/debian.sources"',
    'chmod 0644 "$1/etc/apt/sources.list.d/debian.sources"',
    "printf '#!/bin/sh\\n# no services are started inside an image build\\nexit 101\\n' > \"$1/usr/sbin/policy-rc.d\"",
    'chmod 0755 "$1/usr/sbin/policy-rc.d"',
    'rm -f "$1/etc/hostname" "$1/etc/resolv.conf"',
    _SLIM_SWEEP,
)
IMAGE_CONFIG = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["bash"]',
)


class ImageError(RuntimeError):
    """The base image, the build or the archive could not be made."""


def _sources() -> str:
    """The image's deb822 sources: the archive as this machine reaches it (debcache's mirror)."""
    mirror = debcache.MIRROR.rstrip("/")
    security = mirror[: -len("/debian")] + "/debian-security" if mirror.endswith("/debian") else None
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    text = f"Types: deb\nURIs: {mirror}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\nSigned-By: {keyring}\n"
    if security:
        text += f"\nTypes: deb\nURIs: {security}\nSuites: {SUITE}-security\nComponents: main\nSigned-By: {keyring}\n"
    return text


def _mmdebstrap(cache: Path) -> Path:
    """bookworm's mmdebstrap (with its mmtarfilter, which applies the path filters, and its hooks), unpacked once."""
    deb = debcache.fetch(MMDEBSTRAP_SUITE, ["mmdebstrap"], cache)["mmdebstrap"]
    hook = debcache.unpacked(
        deb, Path(HOOK_DIR) / "setup00.sh", cache, keep=[Path("usr/bin"), Path("usr/share/mmdebstrap")]
    )
    return hook.parents[5] / "usr/bin/mmdebstrap"


def _recipe(mmdebstrap_deb: str) -> dict[str, object]:
    return {
        "version": RECIPE_VERSION,
        "suite": SUITE,
        "arch": debcache.ARCH,
        "variant": "minbase",
        "hooks": HOOK_DIR,
        "sources": _sources(),
        "dpkg": DPKG_OPTIONS,
        "apt": APT_OPTIONS,
        "customize": CUSTOMIZE,
        "config": IMAGE_CONFIG,
        "tool": mmdebstrap_deb,
    }


def _key(recipe: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _work(cache: Path) -> Path:
    return cache / "dockerfile-image"


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One build at a time per cache (the store and the base tarballs are shared)."""
    _work(cache).mkdir(parents=True, exist_ok=True)
    with (_work(cache) / "lock").open("w") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield


def _cached_base(cache: Path) -> tuple[Path, str] | None:
    """The cached rootfs tarball of the current recipe and its key, without network."""
    deb = debcache.cached(MMDEBSTRAP_SUITE, "mmdebstrap", cache)
    if deb is None:
        return None
    key = _key(_recipe(deb.name))
    tarball = _work(cache) / f"base-{SUITE}-slim-{key}.tar"
    return (tarball, key) if tarball.is_file() else None


def cached_base(cache: Path | None = None) -> Path | None:
    """The cached rootfs tarball of the current recipe, if made (never uses the network)."""
    found = _cached_base(cache or debcache.default_cache())
    return found[0] if found else None


def base_rootfs(cache: Path | None = None) -> Path:
    """The rootfs tarball of ``debian:bookworm-slim`` (made once per recipe, then cached)."""
    cache = cache or debcache.default_cache()
    with _locked(cache):
        return _base_rootfs(cache)[0]


def _base_rootfs(cache: Path) -> tuple[Path, str, bool]:
    """(tarball, key, made now)."""
    if found := _cached_base(cache):
        return (*found, False)
    mmdebstrap = _mmdebstrap(cache)
    deb = debcache.cached(MMDEBSTRAP_SUITE, "mmdebstrap", cache)
    assert deb is not None
    key = _key(_recipe(deb.name))
    tarball = _work(cache) / f"base-{SUITE}-slim-{key}.tar"
    for old in _work(cache).glob(f"base-{SUITE}-slim-*.tar"):  # older recipes
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="base-", dir=_work(cache)) as tmp:
        sources = Path(tmp) / "debian.sources"
        sources.write_text(_sources())
        partial = Path(tmp) / "rootfs.tar"
        argv: list[str] = [
            "unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private",
            str(mmdebstrap), "--quiet", "--mode=root", "--variant=minbase", "--format=tar",
            f"--architectures={debcache.ARCH}", f"--hook-dir={mmdebstrap.parents[2] / HOOK_DIR}",
        ]  # fmt: skip
        argv += [f"--aptopt={o}" for o in APT_OPTIONS]
        argv += [f'--aptopt={k} "{v}";' for k, v in debcache._system_proxies().items()]
        argv += [f"--dpkgopt={o}" for o in DPKG_OPTIONS]
        argv += [f"--customize-hook={c}" for c in CUSTOMIZE]
        argv += [SUITE, str(partial), str(sources)]
        env = {**os.environ, "PATH": f"{mmdebstrap.parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}
        env["TMPDIR"] = tmp  # mmdebstrap's chroot directory, removed with tmp
        env["MOKKA_SOURCES"] = str(sources)  # the hooks' copy
        res = _run(argv, timeout=CALL_TIMEOUT, env=env)
        if res.returncode != 0 or not partial.is_file():
            raise ImageError(f"mmdebstrap {SUITE} failed (exit {res.returncode}): {_last(res, first=True)}")
        partial.rename(tarball)
    return tarball, key, True


def _run(argv: Sequence[str | Path], *, timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(a) for a in argv]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{cmd[0]}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise ImageError(f"{cmd[0]}: {exc.strerror}") from None


def _last(res: subprocess.CompletedProcess[str], *, first: bool = False) -> str:
    """The program's last (``first``: first) error line, else its last line."""
    lines = [ln.strip() for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith(("error", "e:")) or "error" in ln.lower()]
    if errors:
        return errors[0 if first else -1][:500]
    return (lines or ["no output"])[-1][:500]


def _pip_ca_bundle() -> Path | None:
    """The CA bundle the host's pip is told to trust, if any (env, then pip.conf files)."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE"):
        if (value := os.environ.get(var)) and Path(value).is_file():
            return Path(value)
    home = Path.home()
    for conf in (
        home / ".config/pip/pip.conf",
        home / ".pip/pip.conf",
        Path("/etc/pip.conf"),
        Path("/etc/xdg/pip/pip.conf"),
    ):
        parser = configparser.ConfigParser()
        with contextlib.suppress(OSError, configparser.Error):
            parser.read(conf)
            value = parser.get("global", "cert", fallback="") or parser.get("install", "cert", fallback="")
            if value and Path(value).is_file():
                return Path(value)
    return None


def _host_builds(cache: Path | None) -> list[Path]:
    """The host's builds of the Go programs the Dockerfile's fleet stage builds (NVIDIA's GFD, KWOK):
    the same :mod:`fetch.kube.gobuild` recipes, under the same keys, when ``.ci/setup --tests`` made them
    — on a host of the image's own Debian release only (GFD links the host's glibc)."""
    from fetch.kube import binaries, gobuild

    try:
        release = platform.freedesktop_os_release()
    except OSError:
        return []
    if release.get("ID") != "debian" or release.get("VERSION_CODENAME") != SUITE:
        return []
    found = (gobuild.cached(spec, cache) for spec in (binaries.DEVICE_PLUGIN, binaries.KWOK))
    return [d for d in found if d is not None]


def _build_home(base: Path, bundle: Path | None, builds: Sequence[Path]) -> Path:
    """A home for root's RUN steps, mounted over the image's /root (a directory every stage has:
    a mount target that does not exist would stay in the layer): pip's user configuration naming
    the host's CA bundle, copied beside it; and ``builds`` (the host's Go builds) in the Mokka cache
    there (``~/.cache/mokka/kube/bin/<key>``), which the fleet stage's ``gobuild.build`` then finds
    rather than compiling them again, as a cache mount would give them. What the steps write there
    is thrown away."""
    from fetch.kube import gobuild

    home = base / "build-home"
    home.mkdir(mode=0o700)
    if bundle is not None:
        (home / ".config" / "pip").mkdir(parents=True, mode=0o700)
        shutil.copyfile(bundle, home / ".config" / "pip" / "ca-bundle.crt")
        (home / ".config" / "pip" / "pip.conf").write_text("[global]\ncert = /root/.config/pip/ca-bundle.crt\n")
    for build in builds:
        shutil.copytree(build, gobuild.bin_root(home / ".cache" / "mokka") / build.name, symlinks=True)
    return home


def full_name(tag: str) -> str:
    """``mokka:dev`` -> ``docker.io/library/mokka:dev`` (containerd's reading of a short name)."""
    name, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return f"{name}:{version}"
    return f"docker.io/{name if '/' in name else 'library/' + name}:{version}"


class Podman:
    """Debian's podman with all of its state private.

    ``storage`` holds the image store (kept after exit unless ``keep_storage`` is false); the
    configuration, run root, libpod's database, runc's state and temporary files live in a
    directory removed on exit, with what podman's containers left: processes, cgroups, mounts.
    Every call runs in a private mount namespace.
    """

    def __init__(self, storage: Path, *, driver: str = "overlay", keep_storage: bool = True, cache: Path | None = None):
        self.storage = storage.absolute()
        self.driver = driver
        self.keep_storage = keep_storage
        self.cache = cache
        self.base = Path()
        self.parent = ""
        self.env: dict[str, str] = {}
        self.global_args: list[str] = []

    def __enter__(self) -> Podman:
        if shutil.which("podman") is None:
            raise ImageError("podman is needed (`.ci/setup --tests` installs Debian's)")
        if shutil.which("unshare") is None:
            raise ImageError("unshare (util-linux) is needed")
        runc = containerd_dist.runc(self.cache)
        for path in (self.storage, runc, Path(tempfile.gettempdir()).resolve()):
            if Path("/var/lib") in path.resolve().parents:  # hidden from podman (see argv)
                raise ImageError(
                    f"{path} is under /var/lib, which podman does not see here: use another cache or TMPDIR"
                )
        self.storage.mkdir(parents=True, exist_ok=True)
        self.base = Path(tempfile.mkdtemp(prefix="mokka-podman-"))
        self.parent = cleanup.cgroup_parent(self.base, "podman")
        b = self.base
        (b / "tmp").mkdir()
        (b / "containers.conf").write_text(
            "[containers]\n"
            f"default_ulimits = {json.dumps(list(ULIMITS))}\n"
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\nevents_logger = "none"\nlock_type = "file"\n'
            f'runtime = "runc"\n'
            f'tmp_dir = "{b}/libpod-tmp"\nstatic_dir = "{b}/libpod"\nvolume_path = "{b}/volumes"\n'
            "[engine.runtimes]\n"
            f'runc = ["{runc}"]\n'
            "[network]\n"
            f'network_config_dir = "{b}/net"\n'
        )
        (b / "storage.conf").write_text(
            f'[storage]\ndriver = "{self.driver}"\ngraphroot = "{self.storage}"\nrunroot = "{b}/run"\n'
        )
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(b / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(b / "storage.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(b / "registries.conf"),
            "TMPDIR": str(b / "tmp"),
            "LC_ALL": "C",
        }
        (b / "registries.conf").write_text('unqualified-search-registries = []\nshort-name-mode = "disabled"\n')
        self.global_args = ["--runtime", str(runc), "--runtime-flag", f"root={b}/runtime"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def argv(self, *args: str | Path) -> list[str]:
        """Podman in a private mount namespace whose /var/lib is an empty tmpfs: its image library
        keeps a blob cache in /var/lib/containers/cache for root, whatever the store's place."""
        inner = 'mount -t tmpfs -o mode=0755,size=64m mokka-podman /var/lib && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "podman",
                "podman", *self.global_args, *map(str, args)]  # fmt: skip

    def __call__(
        self, *args: str | Path, timeout: float = CALL_TIMEOUT, log: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGS`` (output captured; with ``log``, written there as it comes)."""
        if log is None:
            return _run(self.argv(*args), timeout=timeout, env=self.env)
        with log.open("w") as out:
            try:
                proc = subprocess.run(
                    self.argv(*args),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=self.env,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise ImageError(f"podman {args[0]}: no answer within {timeout:g}s (log: {log})") from None
        text = log.read_text(errors="replace")
        return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")

    def run_args(self) -> list[str]:
        """What ``podman run`` needs here: the private cgroup parent, limits root can set, no network."""
        args = [f"--cgroup-parent={self.parent}", "--network=none"]
        for limit in ULIMITS:
            args += ["--ulimit", limit]
        return args

    def close(self) -> None:
        if not self.base.parts or not self.base.exists():
            return
        problems: list[str] = []
        marks = [str(self.base), str(self.storage)]
        left = [p for p in cleanup.processes(marks, within=True) if not cleanup.zombie(p)]
        if left := cleanup.wait_gone(left, 15.0):
            for pid in left:
                cleanup.kill(pid)
            cleanup.wait_gone(left, 15.0)
        cleanup.kill_cgroup_members(self.parent)
        for d in cleanup.cgroup_dirs(self.parent):
            cleanup.rmdir_cgroup(d, problems)
        for root in (self.base, self.storage):
            for mount in cleanup.mounts_under(root):
                try:
                    cleanup.unmount(mount)
                except SandboxError as exc:
                    problems.append(str(exc))
        cleanup.remove_tree(self.base, problems)
        if not self.keep_storage and self.storage.exists():
            cleanup.remove_tree(self.storage, problems)
        if problems:
            raise ImageError("podman clean-up incomplete: " + "; ".join(problems))


def _import_base(podman: Podman, tarball: Path, key: str) -> bool:
    """Put the base rootfs in the store as BASE_IMAGE unless this recipe's import is there (True: imported)."""
    stamp = podman.storage / f"base-{key}.id"
    res = podman("image", "inspect", "--format", "{{.Id}}", BASE_IMAGE)
    if res.returncode == 0 and stamp.is_file() and stamp.read_text().strip() == res.stdout.strip():
        return False
    changes: list[str] = []
    for change in IMAGE_CONFIG:
        changes += ["--change", change]
    res = podman("import", *changes, "--message", f"mmdebstrap {SUITE} minbase, slim ({key})", tarball, BASE_IMAGE)
    if res.returncode != 0:
        raise ImageError(f"podman import of the base image failed: {_last(res)}")
    image_id = podman("image", "inspect", "--format", "{{.Id}}", BASE_IMAGE).stdout.strip()
    stamp.write_text(image_id + "\n")
    return True


def _remove_containers(podman: Podman) -> int:
    """Remove every container in the store: the store is this tool's alone (and locked), so any
    container there is a build's working container left by an interrupted build."""
    ids = podman("ps", "--all", "--storage", "--format", "{{.ID}}").stdout.split()
    if ids and (res := podman("rm", "--force", *ids)).returncode != 0:
        raise ImageError(f"cannot remove an interrupted build's containers: {_last(res)}")
    return len(ids)


def _stages(dockerfile: Path) -> list[str]:
    """The Dockerfile's stages in order, by name (``FROM ... AS name``) or index."""
    stages: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            upper = [w.upper() for w in words]
            stages.append(words[upper.index("AS") + 1] if "AS" in upper[:-1] else str(len(stages)))
    return stages


def _prune(podman: Podman) -> int:
    """Remove the images no tag reaches any more (earlier builds' layers), repeatedly: a parent
    becomes dangling once its last child is gone."""
    removed = 0
    for _ in range(50):
        res = podman("image", "prune", "--force")
        gone = [ln for ln in res.stdout.split() if ln.strip()]
        if res.returncode != 0 or not gone:
            break
        removed += len(gone)
    return removed


def _podman_build(
    podman: Podman, name: str, nvidia_smi: str, work: Path, note: Callable[[str], None], *, compile_fleet: bool = False
) -> None:
    """``podman build`` of the Dockerfile as ``name``; its earlier stages are tagged too, so that
    pruning the store keeps their layers for the next build. ``compile_fleet``: the fleet stage
    compiles GFD and KWOK itself even where the host has built them."""
    common: list[str | Path] = [
        "build", "--pull=never", "--layers", "--format=docker", "--network=host",
        f"--cgroup-parent={podman.parent}", "--build-arg", f"NVIDIA_SMI={nvidia_smi}",
        "--file", REPO / "Dockerfile",
    ]  # fmt: skip
    for limit in ULIMITS:
        common += ["--ulimit", limit]
    bundle, go_builds = _pip_ca_bundle(), [] if compile_fleet else _host_builds(podman.cache)
    if bundle or go_builds:
        common += ["--volume", f"{_build_home(podman.base, bundle, go_builds)}:/root"]
    if bundle:
        note(f"pip trusts {bundle}")
    if go_builds:
        note(f"the fleet stage finds the host's {', '.join(b.name for b in go_builds)} (same recipes, same keys)")
    if left := _remove_containers(podman):
        note(f"{left} containers of an interrupted build removed")
    version = name.rsplit(":", 1)[1]
    builds = [
        (f"localhost/mokka-dockerfile-stage-{s}:{version}", ["--target", s]) for s in _stages(REPO / "Dockerfile")[:-1]
    ]
    cached = 0
    for tag, extra in [*builds, (name, [])]:
        log = work / f"build-{tag.rsplit('/', 1)[1].replace(':', '-')}.log"
        res = podman(*common, *extra, "--tag", tag, REPO, timeout=BUILD_TIMEOUT, log=log)
        if res.returncode != 0:
            raise ImageError(f"podman build of {tag} failed (exit {res.returncode}): {_last(res)} (log: {log})")
        cached += res.stdout.count("--> Using cache")
    note(f"{cached} steps from the layer cache; logs {work}/build-*.log")
    if pruned := _prune(podman):
        note(f"{pruned} stale images pruned")


def _save(podman: Podman, name: str, out: Path) -> None:
    """``podman save`` of ``name`` as a docker archive at ``out`` (written beside it, then renamed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    res = podman("save", "--format", "docker-archive", "--output", partial, name)
    if res.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ImageError(f"podman save of {name} failed: {_last(res)}")
    partial.rename(out)


def build(
    out: Path,
    *,
    tag: str = "mokka:dev",
    nvidia_smi: str = "550",
    base_out: Path | None = None,
    cache: Path | None = None,
    progress: Progress | None = None,
    compile_fleet: bool = False,
) -> Path:
    """Build the Dockerfile's image on the local base and save it as a docker archive at ``out``
    (with ``base_out``, the base image too: kind's nodes cannot pull it either). The fleet stage
    takes the host's builds of GFD and KWOK where there are some (``compile_fleet``: never)."""
    cache = cache or debcache.default_cache()
    progress = progress or Progress(4, prefix="dockerfile-image ")
    name = full_name(tag)
    out = out.absolute()
    if os.geteuid() != 0:
        raise ImageError("needs root (podman's private store and runc run as root here)")
    work = _work(cache)
    with _locked(cache):
        with progress.step(f"base image {BASE_IMAGE} (mmdebstrap {SUITE} minbase, slim)") as note:
            tarball, key, made = _base_rootfs(cache)
            note(f"{'made' if made else 'cached'}; {tarball}")
        with Podman(work / "storage", cache=cache) as podman:
            with progress.step("base image in the private image store") as note:
                note("imported" if _import_base(podman, tarball, key) else "already there")
            with progress.step(
                f"podman build {REPO / 'Dockerfile'} -> {name} (nvidia-smi {nvidia_smi or 'none'})"
            ) as note:
                _podman_build(podman, name, nvidia_smi, work, note, compile_fleet=compile_fleet)
            with progress.step(f"docker archive {out}") as note:
                _save(podman, name, out)
                note(f"{out.stat().st_size / 1e6:.0f} MB")
                if base_out is not None:
                    _save(podman, BASE_IMAGE, base_out.absolute())
                    note(f"base image: {base_out}")
                note(f"`kind load image-archive {out}`")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kind.dockerfile_image",
        description="Build Mokka's image from the repository's Dockerfile with Debian's podman (root; no docker, "
        "no registry: the base image debian:bookworm-slim is made from Debian's archive) and save it as a "
        "docker archive for `kind load image-archive`. Cached in $MOKKA_CACHE/dockerfile-image: a second "
        "build makes nothing anew.",
    )
    ap.add_argument("--out", type=Path, required=True, metavar="PATH", help="the docker archive to write")
    ap.add_argument("--tag", default="mokka:dev", metavar="REPO:TAG", help="the image's name (default: %(default)s)")
    ap.add_argument(
        "--nvidia-smi", default="550", metavar="VERSION",
        help="Debian's nvidia-smi in the image: 550 (default), 535, or '' for none (the Dockerfile's NVIDIA_SMI)",
    )  # fmt: skip
    ap.add_argument(
        "--base-out",
        type=Path,
        metavar="PATH",
        help="also write the base image debian:bookworm-slim as a docker archive here (kind's nodes cannot pull it)",
    )
    ap.add_argument(
        "--cache", type=Path, default=None, metavar="DIR", help="the cache (default: $MOKKA_CACHE or ~/.cache/mokka)"
    )
    ap.add_argument(
        "--compile-fleet",
        action="store_true",
        help="compile NVIDIA's GFD and KWOK in the Dockerfile's fleet stage even where the cache holds the host's "
        "builds of the same recipes (by default the stage finds those in its build-time home, as a cache mount)",
    )
    args = ap.parse_args(argv)
    try:
        out = build(
            args.out,
            tag=args.tag,
            nvidia_smi=args.nvidia_smi,
            base_out=args.base_out,
            cache=args.cache,
            compile_fleet=args.compile_fleet,
        )
    except (ImageError, SandboxError, debcache.FetchError) as exc:
        print(f"dockerfile_image: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"dockerfile_image: error: {exc.filename or 'I/O'}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dockerfile_image: interrupted", file=sys.stderr)
        return 130
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
