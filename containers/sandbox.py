"""A private containerd (1.7 or 2.1 from Debian), driven through CRI as kubelet drives it.

Everything a :class:`Sandbox` makes lives under one private BASE directory: config, root,
state, sockets, runc state, pod logs and images. Pods get a cgroup parent of their own.
``stop()`` (also run when ``start()`` fails, and by the context manager) removes the pods,
stops containerd, kills what is left of its shims and containers, unmounts everything under
BASE, removes the cgroups and BASE itself; :func:`containers.cleanup.leftovers` lists whatever
survived.

CRI calls go through :class:`containers.cri.client.CriClient` (gRPC on containerd's socket);
images are imported with containerd's own ``ctr``. The configuration, and what this kind of
host requires of it, is :mod:`containers.sandbox_config`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import tomlkit

from containers import cleanup, images, sandbox_config
from containers.command import CALL_TIMEOUT, SandboxError, run
from fetch import containerd_dist

if TYPE_CHECKING:
    from containers.cri.client import CriClient

__all__ = ["ContainerResult", "Sandbox", "SandboxError"]

log = logging.getLogger(__name__)
T = TypeVar("T")

SHIM_SOCKET_DIR = Path("/run/containerd/s")  # where 1.7 and 2.x put shim sockets, whatever the config
NAMESPACE = "k8s.io"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; leave room for suffixes


@dataclass(frozen=True)
class ContainerResult:
    id: str
    exit_code: int
    logs: str


@dataclass
class _Pod:
    config: object  # the pod's CRI PodSandboxConfig, sent again with each CreateContainer
    log_directory: Path
    containers: int = 0


def _shim_socket(argv: Sequence[str]) -> Path | None:
    """The socket a shim with command line ``argv`` listens on (containerd's ``shim.SocketAddress``)."""
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    if not Path(argv[0]).name.startswith("containerd-shim") or not {"-namespace", "-id", "-address"} <= set(opts):
        return None
    key = f"{opts['-address']}/{opts['-namespace']}/{opts['-id']}"
    return SHIM_SOCKET_DIR / hashlib.sha256(key.encode()).hexdigest()


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
        self.cgroup_parent = cleanup.cgroup_parent(self.base)
        self.bindir: Path | None = None
        self._bindir = bindir
        self.server_version = ""
        self._cri: CriClient | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() when the current containerd process was spawned
        self._pods: dict[str, _Pod] = {}
        self._logs: dict[str, Path] = {}  # container id -> its CRI log file
        self._created_dirs: list[Path] = []
        self._owns_base = False  # set once start() found BASE absent or empty: only then may stop() remove it
        for sock in (self.address, self.nri_socket):
            if len(str(sock)) + len(".ttrpc") > MAX_SOCKET_PATH:
                raise SandboxError(f"socket path {sock} is too long for a unix socket; choose a shorter base")

    @property
    def pid(self) -> int:
        """The running containerd's process id (0 while none runs)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else 0

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

    @property
    def cri(self) -> CriClient:
        """The CRI client of this containerd (``start()`` first)."""
        assert self._cri is not None, "start() first"
        return self._cri

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

    def config(self) -> sandbox_config.SandboxConfig:
        assert self._handlers is not None, "runtime handlers are resolved by start()"
        return sandbox_config.SandboxConfig(
            self.version, self.base, self.address, self.nri, self.nri_socket, self.cdi_dirs, self._handlers
        )

    def _start(self) -> None:
        from containers.cri.client import CriClient, CriError

        t0 = time.monotonic()
        self.bindir = self._bindir or containerd_dist.fetch(self.version, self.cache)
        self._handlers = self._handlers or {"runc": containerd_dist.runc(self.cache)}
        for d in (self.base, *self.cdi_dirs, self.base / "pods", self.base / "images", self.base / "nri"):
            d.mkdir(parents=True, exist_ok=True)
        self._note_created(SHIM_SOCKET_DIR)
        wanted = self.config().render()
        self.config_path.write_text(tomlkit.dumps(wanted))
        sandbox_config.verify(self.bindir / "containerd", self.config_path, wanted, self.version)
        self._cri = CriClient(self.address, cache=self.cache)
        log.info("starting containerd %s under %s", self.version, self.base)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._spawn()
        self._wait_ready()
        try:
            self.server_version = self.cri.version().runtime_version.lstrip("v")
        except CriError as exc:
            raise SandboxError(str(exc)) from None
        pause = images.make_rootfs(self.base / "images" / "pause-rootfs", cache=self.cache)
        self.import_image(
            images.oci_archive(
                pause, self.base / "images" / "pause.tar", images.PAUSE_IMAGE, cmd=["sleep", "2147483647"]
            )
        )
        shutil.rmtree(pause)
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
        log.info("containerd %s restarted", self.version)

    def _note_created(self, path: Path) -> None:
        """Remember the missing ancestors of ``path`` (outside BASE) so stop() can remove them if empty."""
        missing = [p for p in (path, *path.parents) if not p.exists()]
        self._created_dirs = missing  # deepest first

    def _wait_ready(self) -> None:
        """Wait until containerd's CRI answers and reports RuntimeReady."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise SandboxError(f"containerd exited with {self._proc.returncode}:\n{self.log_tail()}")
            if self.address.exists() and self.cri.ready(timeout=5):
                return
            if time.monotonic() > deadline:
                raise SandboxError(f"containerd's CRI not ready within {START_TIMEOUT:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no containerd log)"

    def stop(self) -> None:
        """Remove pods, stop containerd, kill leftovers, unmount, remove cgroups and BASE. Idempotent."""
        t0 = time.monotonic()
        problems: list[str] = []
        if self.running and self._cri is not None:
            problems += self._remove_all_pods()
        self._pods.clear()
        self._logs.clear()
        if self._cri is not None:
            self._cri.close()
            self._cri = None
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
        strays = cleanup.processes([str(self.address), str(self.config_path)])
        for pid, argv in strays.items():
            log.info("killing leftover %s (pid %d)", Path(argv[0]).name, pid)
            cleanup.kill(pid)
        sockets = [s for argv in strays.values() if (s := _shim_socket(argv))]
        # Containers whose shim is gone: everything in our cgroup parent.
        members = cleanup.kill_cgroup_members(self.cgroup_parent)
        if left := cleanup.wait_gone([*strays, *members], STOP_TIMEOUT):
            problems.append(f"processes survived SIGKILL: {left}")
        for sock in sockets:  # a killed shim leaves its socket behind
            sock.unlink(missing_ok=True)
        for mount in cleanup.mounts_under(self.base):
            try:
                cleanup.unmount(mount)
            except SandboxError as exc:
                problems.append(str(exc))
        for d in cleanup.cgroup_dirs(self.cgroup_parent):
            cleanup.rmdir_cgroup(d, problems)
        if self._owns_base and self.base.exists() and not cleanup.mounts_under(self.base):
            cleanup.remove_tree(self.base, problems)
        for d in self._created_dirs:
            with contextlib.suppress(OSError):  # in use (another containerd): not ours to force
                d.rmdir()
        self._created_dirs = []
        if self._owns_base and (left_behind := cleanup.leftovers(self.base)):
            problems += left_behind
        self._owns_base = False
        log.info("sandbox %s stopped in %.2fs", self.base, time.monotonic() - t0)
        if problems:
            raise SandboxError("clean-up incomplete: " + "; ".join(problems))

    def _remove_all_pods(self) -> list[str]:
        """Stop and remove every pod containerd knows (StopPodSandbox, RemovePodSandbox)."""
        from containers.cri.client import CriError

        problems = []
        try:
            pods = [p.id for p in self.cri.list_pod_sandbox(timeout=STOP_TIMEOUT)]
        except CriError as exc:
            return [str(exc)]
        for pod in pods:
            try:
                self.cri.stop_pod_sandbox(pod, timeout=STOP_TIMEOUT)
                self.cri.remove_pod_sandbox(pod, timeout=STOP_TIMEOUT)
            except CriError as exc:
                problems.append(f"pod {pod[:13]}: {exc}")
        return problems

    # -- images --

    def ctr(self, *args: str, timeout: float = CALL_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.bindir is not None, "start() first"
        return run([self.bindir / "ctr", "-a", self.address, "-n", NAMESPACE, *args], timeout=timeout, check=check)

    def import_image(self, tarball: Path) -> None:
        """``ctr images import`` an OCI archive; return once CRI lists its images (containerd 2.x
        learns of an import asynchronously, and CreateContainer could otherwise miss it)."""
        log.info("importing %s", tarball.name)
        self.ctr("images", "import", str(tarball.absolute()))
        names = images.names(tarball)
        deadline = time.monotonic() + START_TIMEOUT
        while not set(names) <= set(self.images()):
            if time.monotonic() > deadline:
                raise SandboxError(f"CRI does not list {', '.join(names)} {START_TIMEOUT:g}s after the import")
            time.sleep(0.02)

    def images(self) -> list[str]:
        """The tags of every image CRI lists."""
        return [tag for image in self._call(self.cri.list_images) for tag in image.repo_tags]

    # -- pods and containers --

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """A CRI call whose failure is a SandboxError."""
        from containers.cri.client import CriError

        try:
            return fn(*args)
        except CriError as exc:
            raise SandboxError(str(exc)) from None

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
        api = self.cri.api
        logs = self.base / "pods" / f"{namespace}_{name}"
        config = api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name=name, namespace=namespace, uid=str(uuid.uuid4()), attempt=0),
            log_directory=str(logs),
            annotations=dict(annotations or {}),
            labels=dict(labels or {}),
            linux=api.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=api.LinuxSandboxSecurityContext(
                    namespace_options=api.NamespaceOption(network=api.NamespaceMode.NODE)
                ),
            ),
        )
        pod = self._call(self.cri.run_pod_sandbox, config, runtime_handler)
        self._pods[pod] = _Pod(config, logs)
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
        devices: Sequence[tuple[str, str]] = (),
    ) -> str:
        """CreateContainer in ``pod``; ``cdi_devices`` fill the CRI ``CDI_devices`` field, ``devices``
        (container path, host path) its ``devices``, as kubelet passes a device plugin's. Returns the id."""
        api = self.cri.api
        record = self._pods[pod]
        record.containers += 1
        name = name or f"c{record.containers}"
        config = api.ContainerConfig(
            metadata=api.ContainerMetadata(name=name, attempt=0),
            image=api.ImageSpec(image=image),
            command=list(command),
            args=list(args),
            envs=[api.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            annotations=dict(annotations or {}),
            log_path=f"{name}.log",
            linux=api.LinuxContainerConfig(),
            cdi_devices=[api.CdiDevice(name=d) for d in cdi_devices],
            devices=[api.Device(container_path=c, host_path=h, permissions="rw") for c, h in devices],
        )
        cid = self._call(self.cri.create_container, pod, config, record.config)
        self._logs[cid] = record.log_directory / f"{name}.log"
        log.info("container %s in pod %s: %s", name, pod[:13], cid[:13])
        return cid

    def container_info(self, cid: str) -> dict[str, Any]:
        """containerd's verbose view of a container: its OCI ``runtimeSpec`` and more."""
        return self._call(self.cri.container_info, cid)

    def start_container(self, cid: str) -> None:
        self._call(self.cri.start_container, cid)

    def wait(self, cid: str, timeout: float = CALL_TIMEOUT) -> int:
        """Wait for container ``cid`` to exit; return its exit code."""
        exited = self.cri.api.ContainerState.CONTAINER_EXITED
        deadline = time.monotonic() + timeout
        while True:
            status = self._call(self.cri.container_status, cid)
            if status.state == exited:
                return int(status.exit_code)
            if time.monotonic() > deadline:
                raise SandboxError(f"container {cid[:13]} still {status.state.name} after {timeout:g}s")
            time.sleep(0.02)

    def logs(self, cid: str) -> str:
        """The container's stdout, then its stderr, from the log file CRI wrote (as kubelet reads them).

        The two streams reach the file through separate pipes: their relative order is not
        the order the container wrote them in, so they are not interleaved here."""
        from containers.cri import logfile

        return logfile.read(self._logs[cid], ("stdout",)) + logfile.read(self._logs[cid], ("stderr",))

    def remove_container(self, cid: str) -> None:
        """StopContainer (SIGKILL at once when still running), then RemoveContainer."""
        self._call(self.cri.stop_container, cid)
        self._call(self.cri.remove_container, cid)
        self._logs.pop(cid, None)

    def remove_pod(self, pod: str) -> None:
        self._call(self.cri.stop_pod_sandbox, pod)
        self._call(self.cri.remove_pod_sandbox, pod)
        self._pods.pop(pod, None)

    def run_container(
        self, pod: str, image: str, command: Sequence[str], *, timeout: float = CALL_TIMEOUT, **kw: Any
    ) -> ContainerResult:
        """Create, start and wait for a container; returns its exit code and logs (it stays until removed)."""
        cid = self.create_container(pod, image, command, **kw)
        self.start_container(cid)
        code = self.wait(cid, timeout)
        return ContainerResult(cid, code, self.logs(cid))
