"""A private containerd, driven through CRI as kubelet drives it; images built without a registry.

Everything a :class:`Sandbox` makes lives under one private BASE directory: config, root,
state, sockets, runc state, pod logs and images. Pods get a cgroup parent of their own.
``stop()`` (also run when ``start()`` fails, and by the context manager) removes the pods,
stops containerd, kills what is left of its shims and containers, unmounts everything under
BASE, removes the cgroups and BASE itself; :func:`leftovers` lists whatever survived.

Images are OCI image-layout tarballs written here (one uncompressed layer) and imported
with ``ctr images import``: a pause image made of Debian's static busybox, and a workload
image with busybox plus the host glibc libraries some programs need (:func:`make_rootfs`).
The CRI client is crictl, built from the Go module proxy (:func:`crictl`). :func:`podman_run`
runs Debian's podman the same way: private state, cleaned up after each run.

Facts this relies on are in ``reference/containerd-sandbox.md`` (``restrict_oom_score_adj``
is required on a host where root lacks CAP_SYS_RESOURCE; runc's ``Root`` must be set or
its state escapes to /run/containerd/runc).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import time
import tomllib
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import tomlkit

from . import containerd_dist, debcache, gotool

__all__ = [
    "CRICTL_MODULE",
    "CRICTL_VERSION",
    "PAUSE_IMAGE",
    "PODMAN_CDI_DIRS",
    "WORKLOAD_IMAGE",
    "ContainerResult",
    "Sandbox",
    "SandboxError",
    "busybox",
    "cgroup_parent",
    "crictl",
    "leftovers",
    "make_rootfs",
    "oci_archive",
    "podman_run",
]

log = logging.getLogger(__name__)

CRICTL_MODULE = "sigs.k8s.io/cri-tools/cmd/crictl"
CRICTL_VERSION = "v1.34.0"  # its go.mod asks for go 1.24.1: Debian trixie's golang-1.24 builds it
PAUSE_IMAGE = "localhost/mokka/pause:1"
WORKLOAD_IMAGE = "localhost/mokka/workload:1"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHIM_SOCKET_DIR = Path("/run/containerd/s")  # where 1.7 and 2.x put shim sockets, whatever the config
NAMESPACE = "k8s.io"
START_TIMEOUT = 20.0
CALL_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; leave room for suffixes


class SandboxError(RuntimeError):
    """The private containerd could not be set up, driven, or cleaned up."""


# ---- binaries -------------------------------------------------------------------------


def _run(
    argv: Sequence[str | Path], *, timeout: float = CALL_TIMEOUT, check: bool = True, **kw: Any
) -> subprocess.CompletedProcess[str]:
    cmd = [str(a) for a in argv]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{' '.join(cmd)}: no answer within {timeout:g}s") from None
    except OSError as exc:
        raise SandboxError(f"{cmd[0]}: {exc}") from None
    if check and res.returncode != 0:
        detail = (res.stderr.strip() or res.stdout.strip())[-2000:]
        raise SandboxError(f"{' '.join(cmd)}: exit {res.returncode}: {detail}")
    return res


def busybox(cache: Path | None = None) -> Path:
    """Debian bookworm's static busybox, downloaded and unpacked once into the cache."""
    cache = cache or debcache.default_cache()
    deb = debcache.fetch("bookworm", ["busybox-static"], cache)["busybox-static"]
    binary = cache / "extract" / deb.stem / "bin" / "busybox"
    if not binary.exists():
        tmp = binary.parents[1].with_name(deb.stem + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        debcache.extract(deb, tmp)
        shutil.rmtree(binary.parents[1], ignore_errors=True)
        tmp.rename(binary.parents[1])
    return binary


def crictl(cache: Path | None = None, version: str = CRICTL_VERSION) -> Path:
    """crictl ``version``, built once with ``go install`` from the Go module proxy into the cache."""
    try:
        return gotool.install(f"{CRICTL_MODULE}@{version}", cache)
    except (RuntimeError, OSError) as exc:
        raise SandboxError(f"cannot build crictl {version}: {exc}") from None


# ---- root filesystems and images -------------------------------------------------------


def _shared_libraries(programs: Iterable[Path]) -> list[Path]:
    """Host paths of the shared libraries ``programs`` need (by ``ldd``), the loader included."""
    found: list[Path] = []
    for program in programs:
        res = _run(["ldd", program], check=False)
        if res.returncode != 0 and "not a dynamic executable" not in res.stdout + res.stderr:
            raise SandboxError(f"ldd {program}: {res.stderr.strip() or res.stdout.strip()}")
        for line in res.stdout.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/") and Path(path) not in found:
                found.append(Path(path))
            elif "not found" in line:
                raise SandboxError(f"ldd {program}: {line.strip()}")
    return found


def make_rootfs(dest: Path, *, programs: Sequence[Path] = (), cache: Path | None = None) -> Path:
    """A small usr-merged root: static busybox (every applet in /usr/bin) and, when ``programs``
    are given, the host libraries they need (glibc: loader, libc, libm, ...), nothing else.

    ``programs`` themselves are not copied: a test mounts them in (CDI, NRI, bind mounts).
    """
    dest.mkdir(parents=True, exist_ok=True)
    for sub in ("usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "etc", "dev", "proc", "sys", "run"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").mkdir(mode=0o1777, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    for top in ("bin", "sbin", "lib", "lib64"):
        if not (dest / top).is_symlink():
            (dest / top).symlink_to(f"usr/{top}")
    bb = busybox(cache)
    shutil.copy2(bb, dest / "usr/bin/busybox")
    applets = _run([bb, "--list"]).stdout.split()
    for applet in applets:
        link = dest / "usr/bin" / applet
        if applet != "busybox" and not link.is_symlink():
            link.symlink_to("busybox")
    (dest / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (dest / "etc/group").write_text("root:x:0:\n")
    for lib in _shared_libraries(programs):
        rel = lib.relative_to("/")
        target = dest / rel if rel.parts[0] == "usr" else dest / "usr" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, target)  # follows the host's symlinks: the soname path holds the file
    return dest


def _layer(rootfs: Path) -> bytes:
    """An uncompressed, reproducible tar of ``rootfs`` (root-owned, fixed mtimes)."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            here = Path(dirpath)
            for name in sorted(dirnames + filenames):
                path = here / name
                tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=clean)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def oci_archive(
    rootfs: Path, out: Path, name: str, *, cmd: Sequence[str] = ("/bin/sh",), env: Sequence[str] = (PATH_ENV,)
) -> Path:
    """Write ``rootfs`` as a one-layer OCI image-layout tarball ``out`` named ``name``.

    The index carries ``io.containerd.image.name`` so ``ctr images import`` registers ``name``.
    """
    layer = _layer(rootfs)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": list(env), "Cmd": list(cmd), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created_by": "testbed.sandbox.oci_archive", "comment": str(rootfs)}],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(tar, layer)}
        config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(tar, _json(config))}
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            **_blob(tar, _json(manifest)),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rpartition(":")[2],
            },
        }
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [manifest_desc],
        }
        for member, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# ---- clean-up primitives ----------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def _mounts_under(base: Path) -> list[Path]:
    """Mount points at or below ``base`` (this mount namespace), deepest first."""
    found: list[Path] = []
    prefix = str(base).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(base) or point.startswith(prefix):
                found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _unmount(path: Path) -> None:
    for flags in (0, MNT_DETACH):
        if _libc.umount2(os.fsencode(path), flags) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            return
    raise SandboxError(f"cannot unmount {path}: {os.strerror(err)}")


def _cgroup_roots() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones, and cgroup2)."""
    roots: list[Path] = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] in ("cgroup", "cgroup2"):
                roots.append(Path(fields[1]))
    return roots


def _cgroup_dirs(parent: str) -> list[Path]:
    """Every existing directory of cgroup ``parent`` in every hierarchy, children first."""
    found: list[Path] = []
    for root in _cgroup_roots():
        top = root / parent.strip("/")
        if top.is_dir():
            found += [Path(d) for d, _subdirs, _files in os.walk(top, topdown=False)]
    return found


def _remove_tree(path: Path, problems: list[str]) -> None:
    try:
        shutil.rmtree(path)
    except OSError as exc:
        problems.append(f"cannot remove {path}: {exc}")


def _rmdir_cgroup(d: Path, problems: list[str]) -> None:
    """Remove one (empty) cgroup directory; a cgroup whose last task just died is briefly busy."""
    for _ in range(100):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                problems.append(f"cannot remove cgroup {d}: {exc.strerror}")
                return
            time.sleep(0.05)
    problems.append(f"cgroup {d} stayed busy")


def cgroup_parent(base: Path, kind: str = "sandbox") -> str:
    """The cgroup parent of the pods (``kind="sandbox"``) or podman containers (``"podman"``) of ``base``."""
    return f"/mokka-{kind}-" + hashlib.sha256(str(base.absolute()).encode()).hexdigest()[:12]


def _processes(match: Sequence[str], *, within: bool = False) -> dict[int, list[str]]:
    """Processes with an argv element equal to one of ``match`` (or containing one, with ``within``)."""
    found: dict[int, list[str]] = {}
    wanted = set(match)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        hit = any(w in a for w in wanted for a in args) if within else bool(wanted.intersection(args))
        if hit:
            found[int(entry.name)] = args
    return found


def _shim_socket(argv: Sequence[str]) -> Path | None:
    """The socket a shim with command line ``argv`` listens on (containerd's ``shim.SocketAddress``)."""
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    if not Path(argv[0]).name.startswith("containerd-shim") or not {"-namespace", "-id", "-address"} <= set(opts):
        return None
    key = f"{opts['-address']}/{opts['-namespace']}/{opts['-id']}"
    return SHIM_SOCKET_DIR / hashlib.sha256(key.encode()).hexdigest()


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if Path(f"/proc/{p}").exists() and not _zombie(p)}
        if pending:
            time.sleep(0.05)
    return sorted(pending)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def leftovers(base: Path, kind: str = "sandbox") -> list[str]:
    """What a sandbox (``kind="sandbox"``) or :func:`podman_run` (``"podman"``) under ``base`` left
    behind: live processes whose command line mentions ``base``, mounts under it, its cgroups,
    the directory itself."""
    base = base.absolute()
    found = [
        f"process {pid}: {' '.join(argv)}"
        for pid, argv in _processes([str(base)], within=True).items()
        if not _zombie(pid)
    ]
    found += [f"mount {m}" for m in _mounts_under(base)]
    found += [f"cgroup {d}" for d in _cgroup_dirs(cgroup_parent(base, kind))]
    if base.exists():
        found.append(f"directory {base}")
    return found


# ---- the sandbox ------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerResult:
    id: str
    exit_code: int
    logs: str


class Sandbox:
    """A private containerd (1.7 or 2.1 from Debian) with CRI, CDI and optionally NRI on.

    ``runtime_handlers`` maps CRI runtime handler names to runc-compatible OCI runtime
    binaries (all run by the ``io.containerd.runc.v2`` shim); the default is ``{"runc": <bookworm
    runc>}``, and the first handler is the default one. ``cdi_dirs`` are the CDI spec directories
    containerd watches (default: BASE/cdi, created). With ``nri=True`` the NRI socket is
    :attr:`nri_socket`; with ``nri=False`` NRI is disabled (2.x enables it by default).
    """

    def __init__(
        self,
        base: Path,
        version: str,
        *,
        nri: bool = False,
        cdi_dirs: Sequence[Path] | None = None,
        runtime_handlers: Mapping[str, Path] | None = None,
        log_file: Path | None = None,
        cache: Path | None = None,
        bindir: Path | None = None,
    ) -> None:
        """``bindir``: a directory with containerd, ctr and the runc shim to use instead of Debian's
        build of ``version`` (which must then name the same major version)."""
        if version not in containerd_dist.SUITES:
            raise ValueError(f"containerd {version!r}: known versions {', '.join(sorted(containerd_dist.SUITES))}")
        self.base = base.absolute()
        self.version = version
        self.nri = nri
        self.cdi_dirs = [d.absolute() for d in cdi_dirs] if cdi_dirs is not None else [self.base / "cdi"]
        self._handlers = dict(runtime_handlers) if runtime_handlers else None
        self.log_file = log_file.absolute() if log_file else self.base / "containerd.log"
        self.cache = cache
        self.address = self.base / "containerd.sock"
        self.nri_socket = self.base / "nri" / "nri.sock"
        self.config_path = self.base / "config.toml"
        self.cgroup_parent = cgroup_parent(self.base)
        self.bindir: Path | None = None
        self._bindir = bindir
        self.server_version = ""
        self._crictl: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() when the current containerd process was spawned
        self._pods: dict[str, Path] = {}  # pod id -> its config file
        self._created_dirs: list[Path] = []
        self._owns_base = False  # set once start() found BASE absent or empty: only then may stop() remove it
        for sock in (self.address, self.nri_socket):
            if len(str(sock)) + len(".ttrpc") > MAX_SOCKET_PATH:
                raise SandboxError(f"socket path {sock} is too long for a unix socket; choose a shorter base")

    # -- life cycle --

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def adopt(self) -> None:
        """Take charge of an existing BASE (a sandbox left running by an earlier process) so
        that ``stop()`` tears it down and removes it."""
        self._owns_base = True

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Sandbox:
        if os.geteuid() != 0:
            raise SandboxError("a private containerd needs root")
        if self.base.exists() and any(self.base.iterdir()):
            raise SandboxError(f"{self.base} exists and is not empty")
        self._owns_base = True
        try:
            self._start()
        except BaseException:
            log.warning("containerd %s failed to start; cleaning up %s", self.version, self.base)
            try:
                self.stop()
            except SandboxError as exc:
                log.error("clean-up after failed start: %s", exc)
            raise
        return self

    def _start(self) -> None:
        t0 = time.monotonic()
        self.bindir = self._bindir or containerd_dist.fetch(self.version, self.cache)
        handlers = self._handlers or {"runc": containerd_dist.runc(self.cache)}
        self._handlers = handlers
        self._crictl = crictl(self.cache)
        for d in (self.base, *self.cdi_dirs, self.base / "pods", self.base / "images", self.base / "nri"):
            d.mkdir(parents=True, exist_ok=True)
        self._note_created(SHIM_SOCKET_DIR)
        self.config_path.write_text(tomlkit.dumps(self.config()))
        self.verify_config()
        log.info("starting containerd %s under %s", self.version, self.base)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._spawn()
        self._wait_ready()
        self.server_version = self.ctr("version").stdout.split("Server:", 1)[-1].split()[1]
        (self.base / "crictl.yaml").write_text(
            f"runtime-endpoint: unix://{self.address}\nimage-endpoint: unix://{self.address}\n"
            "timeout: 30\npull-image-on-create: false\ndisable-pull-on-run: true\n"
        )
        pause = make_rootfs(self.base / "images" / "pause-rootfs", cache=self.cache)
        self.import_image(
            oci_archive(pause, self.base / "images" / "pause.tar", PAUSE_IMAGE, cmd=["sleep", "2147483647"])
        )
        shutil.rmtree(pause)
        self._wait_cri()
        log.info("containerd %s ready at %s in %.2fs", self.server_version, self.address, time.monotonic() - t0)

    def _spawn(self) -> None:
        assert self.bindir is not None
        with self.log_file.open("ab") as out:
            self._proc = subprocess.Popen(
                [str(self.bindir / "containerd"), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def restart(self) -> None:
        """Stop containerd (SIGTERM, as systemd does) and start it again on the same state."""
        assert self._proc is not None and self.bindir is not None
        self._proc.terminate()
        try:
            self._proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._spawn()
        self._wait_ready()
        self._wait_cri()
        log.info("containerd %s restarted", self.version)

    def _note_created(self, path: Path) -> None:
        """Remember the missing ancestors of ``path`` (outside BASE) so stop() can remove them if empty."""
        missing = [p for p in (path, *path.parents) if not p.exists()]
        self._created_dirs = missing  # deepest first

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        assert self.bindir is not None
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise SandboxError(f"containerd exited with {self._proc.returncode}:\n{self.log_tail()}")
            if self.address.exists():
                res = _run([self.bindir / "ctr", "-a", self.address, "version"], timeout=5, check=False)
                if res.returncode == 0:
                    return
            if time.monotonic() > deadline:
                raise SandboxError(f"containerd did not answer within {START_TIMEOUT:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _wait_cri(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            res = self.crictl("info", check=False, timeout=10)
            if res.returncode == 0:
                conditions = json.loads(res.stdout).get("status", {}).get("conditions", [])
                if any(c.get("type") == "RuntimeReady" and c.get("status") for c in conditions):
                    return
            if time.monotonic() > deadline:
                raise SandboxError(f"CRI not ready within {START_TIMEOUT:g}s: {res.stdout}{res.stderr}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no containerd log)"

    def stop(self) -> None:
        """Remove pods, stop containerd, kill leftovers, unmount, remove cgroups and BASE. Idempotent."""
        t0 = time.monotonic()
        problems: list[str] = []
        if self.running and self._crictl is not None:
            for args in (["stopp", *self._all_pods()], ["rmp", "--force", "--all"]):
                if args[0] == "stopp" and len(args) == 1:
                    continue
                res = self.crictl(*args, check=False, timeout=STOP_TIMEOUT)
                if res.returncode != 0:
                    problems.append(f"crictl {args[0]}: {res.stderr.strip()}")
        self._pods.clear()
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    problems.append("containerd ignored SIGTERM; killed")
                    self._proc.kill()
                    self._proc.wait(STOP_TIMEOUT)
            self._proc = None
        # Shims outlive containerd by design; their argv names our socket.
        strays = _processes([str(self.address), str(self.config_path)])
        for pid, argv in strays.items():
            log.info("killing leftover %s (pid %d)", Path(argv[0]).name, pid)
            _kill(pid)
        sockets = [s for argv in strays.values() if (s := _shim_socket(argv))]
        # Containers whose shim is gone: everything in our cgroup parent.
        for d in _cgroup_dirs(self.cgroup_parent):
            for procs in ("cgroup.procs", "tasks"):
                try:
                    pids = [int(p) for p in (d / procs).read_text().split()]
                except OSError:
                    continue
                for pid in pids:
                    _kill(pid)
                strays.update({pid: [] for pid in pids})
        if left := _wait_gone(strays, STOP_TIMEOUT):
            problems.append(f"processes survived SIGKILL: {left}")
        for sock in sockets:  # a killed shim leaves its socket behind
            sock.unlink(missing_ok=True)
        for mount in _mounts_under(self.base):
            try:
                _unmount(mount)
            except SandboxError as exc:
                problems.append(str(exc))
        for d in _cgroup_dirs(self.cgroup_parent):
            _rmdir_cgroup(d, problems)
        if self._owns_base and self.base.exists() and not _mounts_under(self.base):
            _remove_tree(self.base, problems)
        for d in self._created_dirs:
            with contextlib.suppress(OSError):  # in use (another containerd): not ours to force
                d.rmdir()
        self._created_dirs = []
        if self._owns_base and (left_behind := leftovers(self.base)):
            problems += left_behind
        self._owns_base = False
        log.info("sandbox %s stopped in %.2fs", self.base, time.monotonic() - t0)
        if problems:
            raise SandboxError("clean-up incomplete: " + "; ".join(problems))

    # -- configuration --

    def config(self) -> dict[str, Any]:
        """The containerd configuration, in the schema of this version (2 for 1.7, 3 for 2.x)."""
        b = self.base
        assert self._handlers is not None, "runtime handlers are resolved by start()"
        runtimes = {
            name: {
                "runtime_type": "io.containerd.runc.v2",
                "options": {"BinaryName": str(binary), "Root": str(b / "runtimes" / name)},
            }
            for name, binary in self._handlers.items()
        }
        default_runtime = next(iter(self._handlers))
        runtime = {
            "enable_cdi": True,
            "cdi_spec_dirs": [str(d) for d in self.cdi_dirs],
            "netns_mounts_under_state_dir": True,
            "disable_apparmor": True,
            "restrict_oom_score_adj": True,
        }
        containerd = {"default_runtime_name": default_runtime, "runtimes": runtimes}
        nri = {
            "disable": not self.nri,
            "socket_path": str(self.nri_socket),
            "plugin_path": str(b / "nri" / "plugins"),
            "plugin_config_path": str(b / "nri" / "conf.d"),
            "plugin_registration_timeout": "5s",
            "plugin_request_timeout": "2s",
        }
        streaming = {"disable_tcp_service": True, "stream_server_address": "127.0.0.1", "stream_server_port": "0"}
        plugins: dict[str, Any]
        if self.version == "1.7":
            cri = {
                **runtime,
                **streaming,
                "sandbox_image": PAUSE_IMAGE,
                "containerd": {"snapshotter": "overlayfs", **containerd},
                "cni": {"bin_dir": str(b / "cni" / "bin"), "conf_dir": str(b / "cni" / "conf")},
            }
            plugins = {"io.containerd.grpc.v1.cri": cri}
            version = 2
        else:
            plugins = {
                "io.containerd.cri.v1.images": {"snapshotter": "overlayfs", "pinned_images": {"sandbox": PAUSE_IMAGE}},
                "io.containerd.cri.v1.runtime": {
                    **runtime,
                    "containerd": containerd,
                    "cni": {"bin_dirs": [str(b / "cni" / "bin")], "conf_dir": str(b / "cni" / "conf")},
                },
                "io.containerd.grpc.v1.cri": streaming,
                "io.containerd.image-verifier.v1.bindir": {"bin_dir": str(b / "image-verifier")},
            }
            version = 3
        plugins["io.containerd.internal.v1.opt"] = {"path": str(b / "opt")}
        plugins["io.containerd.nri.v1.nri"] = nri
        return {
            "version": version,
            "root": str(b / "root"),
            "state": str(b / "state"),
            "temp": str(b / "tmp"),
            "grpc": {"address": str(self.address)},
            "ttrpc": {"address": str(self.address) + ".ttrpc"},
            "plugins": plugins,
        }

    def verify_config(self) -> None:
        """Check with ``containerd config dump`` that the binary took every key we set."""
        assert self.bindir is not None
        res = _run([self.bindir / "containerd", "--config", self.config_path, "config", "dump"], timeout=20)
        dumped = tomllib.loads(res.stdout)
        ignored = [f"{key} = {want!r} (dump: {got!r})" for key, want, got in _compare(self.config(), dumped)]
        if ignored:
            raise SandboxError(f"containerd {self.version} ignored config keys: " + "; ".join(ignored))

    # -- clients --

    def ctr(self, *args: str, timeout: float = CALL_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.bindir is not None, "start() first"
        return _run([self.bindir / "ctr", "-a", self.address, "-n", NAMESPACE, *args], timeout=timeout, check=check)

    def crictl(
        self, *args: str | Path, timeout: float = CALL_TIMEOUT, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        assert self._crictl is not None, "start() first"
        endpoint = f"unix://{self.address}"
        argv: list[str | Path] = [self._crictl, "--config", self.base / "crictl.yaml", "--runtime-endpoint", endpoint]
        argv += ["--image-endpoint", endpoint, "--timeout", f"{int(timeout)}s", *args]
        return _run(argv, timeout=timeout + 5, check=check)

    def import_image(self, tarball: Path) -> None:
        log.info("importing %s", tarball.name)
        self.ctr("images", "import", str(tarball.absolute()))

    def images(self) -> list[str]:
        data = json.loads(self.crictl("images", "-o", "json").stdout)
        return [tag for img in data.get("images", []) for tag in img.get("repoTags") or []]

    def _all_pods(self) -> list[str]:
        res = self.crictl("pods", "-q", check=False, timeout=STOP_TIMEOUT)
        return res.stdout.split() if res.returncode == 0 else []

    # -- pods and containers --

    def run_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        runtime_handler: str = "",
    ) -> str:
        """RunPodSandbox for a host-network pod (no CNI needed); returns the pod id."""
        logs = self.base / "pods" / f"{namespace}_{name}"
        config = {
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "attempt": 0},
            "log_directory": str(logs),
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
            "linux": {
                "cgroup_parent": self.cgroup_parent,
                "security_context": {"namespace_options": {"network": 2}},  # NODE
            },
        }
        path = self.base / "pods" / f"{namespace}_{name}.json"
        path.write_text(json.dumps(config, indent=2))
        args: list[str | Path] = ["runp"]
        if runtime_handler:
            args += ["--runtime", runtime_handler]
        pod = self.crictl(*args, path).stdout.strip()
        self._pods[pod] = path
        log.info("pod %s/%s: %s", namespace, name, pod[:13])
        return pod

    def create_container(
        self,
        pod: str,
        image: str,
        command: Sequence[str],
        *,
        name: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        cdi_devices: Sequence[str] = (),
    ) -> str:
        """CreateContainer in ``pod``; ``cdi_devices`` fill the CRI ``CDI_devices`` field. Returns the id."""
        name = name or f"c{len(list((self.base / 'pods').glob('*.ctr.json')))}"
        config: dict[str, Any] = {
            "metadata": {"name": name, "attempt": 0},
            "image": {"image": image},
            "command": list(command),
            "args": list(args),
            "envs": [{"key": k, "value": v} for k, v in (env or {}).items()],
            "annotations": dict(annotations or {}),
            "log_path": f"{name}.log",
            "linux": {},
        }
        if cdi_devices:
            config["CDI_devices"] = [{"name": d} for d in cdi_devices]
        path = self.base / "pods" / f"{pod[:13]}_{name}.ctr.json"
        path.write_text(json.dumps(config, indent=2))
        cid = self.crictl("create", "--no-pull", pod, path, self._pods[pod]).stdout.strip()
        log.info("container %s in pod %s: %s", name, pod[:13], cid[:13])
        return cid

    def start_container(self, cid: str) -> None:
        self.crictl("start", cid)

    def inspect(self, cid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.crictl("inspect", "-o", "json", cid).stdout)
        return data

    def wait(self, cid: str, timeout: float = CALL_TIMEOUT) -> int:
        """Wait for container ``cid`` to exit; return its exit code."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.inspect(cid)["status"]
            if status["state"] == "CONTAINER_EXITED":
                return int(status.get("exitCode", 0))
            if time.monotonic() > deadline:
                raise SandboxError(f"container {cid[:13]} still {status['state']} after {timeout:g}s")
            time.sleep(0.05)

    def logs(self, cid: str) -> str:
        """The container's stdout and stderr (as kubelet would read them)."""
        res = self.crictl("logs", cid)
        return res.stdout + res.stderr

    def remove_container(self, cid: str) -> None:
        self.crictl("rm", "--force", cid)

    def remove_pod(self, pod: str) -> None:
        self.crictl("stopp", pod)
        self.crictl("rmp", "--force", pod)
        self._pods.pop(pod, None)

    def run_container(
        self, pod: str, image: str, command: Sequence[str], *, timeout: float = CALL_TIMEOUT, **kw: Any
    ) -> ContainerResult:
        """Create, start and wait for a container; returns its exit code and logs (it stays until removed)."""
        cid = self.create_container(pod, image, command, **kw)
        self.start_container(cid)
        code = self.wait(cid, timeout)
        return ContainerResult(cid, code, self.logs(cid))


# ---- podman ----------------------------------------------------------------------------

PODMAN_CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))  # podman 4.3 reads only these


def _podman_supports(flag: str) -> bool:
    res = _run(["podman", "--help"], timeout=20, check=False)
    return flag in res.stdout


def _specs_for_kind(kind: str) -> list[Path]:
    found = []
    for d in PODMAN_CDI_DIRS:
        for spec in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                if json.loads(spec.read_text()).get("kind") == kind:
                    found.append(spec)
            except (OSError, ValueError):
                continue
    return found


def podman_run(
    base: Path,
    rootfs: Path,
    command: Sequence[str],
    *,
    devices: Sequence[str] = (),
    cdi_spec: Path | None = None,
    runtime: Path | None = None,
    timeout: float = CALL_TIMEOUT,
    cache: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``podman run --rm --rootfs ROOTFS --device D... COMMAND`` with all of podman's state under ``base``.

    Debian bookworm's podman (4.3) on this kind of host needs: bookworm's runc (crun 1.8 refuses
    hybrid cgroups), explicit low ``--ulimit nofile/nproc`` (podman asks for limits above what
    its conmon has and root lacks CAP_SYS_RESOURCE to raise them), ``--network=none`` (no CNI
    set up), cgroupfs, file locks and no events (nothing in /dev/shm or the journal). Podman
    4.3 has no ``--cdi-spec-dir``: ``cdi_spec`` is copied into /var/run/cdi for the run and
    removed afterwards (a newer podman gets a private spec directory instead). ``base`` is
    removed at the end, with the cgroups, processes and mounts of the run. The rootfs gets
    the mount targets the runtime creates: pass a copy.
    """
    base = base.absolute()
    if base.exists() and any(base.iterdir()):
        raise SandboxError(f"{base} exists and is not empty")
    parent = cgroup_parent(base, "podman")
    cdi_copy: Path | None = None
    made_dirs: list[Path] = []
    argv: list[str | Path] = ["podman"]
    try:
        base.mkdir(parents=True, exist_ok=True)
        (base / "containers.conf").write_text(
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\nevents_logger = "none"\nlock_type = "file"\n'
            f'tmp_dir = "{base}/tmp"\nstatic_dir = "{base}/root/libpod"\nvolume_path = "{base}/root/volumes"\n'
            f'[network]\nnetwork_config_dir = "{base}/net"\n'
        )
        (base / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{base}/root"\nrunroot = "{base}/run"\n'
        )
        env = {**os.environ, "CONTAINERS_CONF": str(base / "containers.conf")}
        env["CONTAINERS_STORAGE_CONF"] = str(base / "storage.conf")
        runtime = runtime or containerd_dist.runc(cache)
        argv += ["--runtime", runtime, "--runtime-flag", f"root={base}/runtime"]
        if cdi_spec is not None:
            if _podman_supports("--cdi-spec-dir"):
                (base / "cdi").mkdir()
                shutil.copy(cdi_spec, base / "cdi" / cdi_spec.name)
                argv += ["--cdi-spec-dir", base / "cdi"]
            else:
                kind = str(json.loads(cdi_spec.read_text()).get("kind", ""))
                if clash := _specs_for_kind(kind):
                    raise SandboxError(f"CDI specs for {kind} already installed ({', '.join(map(str, clash))})")
                target = PODMAN_CDI_DIRS[1]
                made_dirs = [p for p in (target, *target.parents) if not p.exists()]
                target.mkdir(parents=True, exist_ok=True)
                cdi_copy = target / f"mokka-{uuid.uuid4().hex[:12]}.json"
                shutil.copy(cdi_spec, cdi_copy)
        argv += ["run", "--rm", "--network=none", f"--cgroup-parent={parent}"]
        argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
        for device in devices:
            argv += ["--device", device]
        argv += ["--rootfs", rootfs.absolute(), *command]
        log.info("podman run %s (devices: %s)", " ".join(command), ", ".join(devices) or "none")
        return _run(argv, timeout=timeout, check=False, env=env)
    finally:
        if cdi_copy is not None:
            cdi_copy.unlink(missing_ok=True)
        for d in made_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        _podman_cleanup(base, parent)


def _podman_cleanup(base: Path, parent: str) -> None:
    """Wait for podman's exit command and conmon, then remove cgroups, mounts and ``base``."""
    marks = [str(base / "root"), str(base / "tmp"), f"--root={base}/runtime"]
    if left := _wait_gone(_processes(marks), STOP_TIMEOUT):
        for pid in left:
            _kill(pid)
        _wait_gone(left, STOP_TIMEOUT)
    problems: list[str] = []
    for d in _cgroup_dirs(parent):
        for procs in ("cgroup.procs", "tasks"):
            with contextlib.suppress(OSError, ValueError):
                for pid in [int(p) for p in (d / procs).read_text().split()]:
                    _kill(pid)
    for d in _cgroup_dirs(parent):
        _rmdir_cgroup(d, problems)
    for mount in _mounts_under(base):
        try:
            _unmount(mount)
        except SandboxError as exc:
            problems.append(str(exc))
    if base.exists() and not _mounts_under(base):
        _remove_tree(base, problems)
    if problems:
        raise SandboxError("podman clean-up incomplete: " + "; ".join(problems))


def _compare(want: Mapping[str, Any], got: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(key, wanted, found) for every leaf of ``want`` that ``got`` lacks or holds differently."""
    for key, value in want.items():
        path = f"{prefix}.{key}" if prefix else key
        found = got.get(key) if isinstance(got, Mapping) else None
        if isinstance(value, Mapping):
            yield from _compare(value, found, path)
        elif found != value:
            yield path, value, found
