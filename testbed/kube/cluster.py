"""A real single-node Kubernetes with mock GPUs, on this machine, without Docker.

``Cluster.up(Options(base=DIR))`` stages the mock node under ``DIR/node``, generates a CA and
certificates, starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a private
containerd 2.1 (CRI, CDI and NRI on) and kubelet — all on loopback, on free ports, inside one
private mount namespace (:mod:`.namespace`) — then the NRI plugin, NVIDIA's device plugin (or a
DRA driver) and GPU Feature Discovery, and waits until the node is Ready with its GPUs
allocatable. ``Cluster.load(DIR).down()`` stops everything and leaves no process, mount, cgroup,
network interface or file outside DIR and the cache; DIR itself is removed.

For tests and later plugins: :meth:`Cluster.api` (a ``kubernetes`` client), :meth:`Cluster.kubectl`,
:meth:`Cluster.run` (a command inside the cluster's mount namespace, e.g. a client of a kubelet
socket) and :meth:`Cluster.spawn` (a long-running host process in that namespace, stopped by
``down``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpumodel import profile as profiles
from testbed import containerd_dist, debcache, gotool, kubelet_api, nvidia_smi

from . import binaries, cgroups, config, gpustack, images, namespace, process, versions
from .config import Layout, Ports
from .gobuild import BuildError
from .pki import Pki

Progress = Callable[[str], None]
DEFAULT_BASE = Path("/run/mokka-cluster")
READY_TIMEOUT = 120.0


class ClusterError(RuntimeError):
    """The cluster could not be brought up, reached or torn down; the message says what."""


@dataclass(frozen=True)
class Options:
    base: Path = DEFAULT_BASE
    profile: str = "h100"
    gpus: int | None = None
    allocator: str = "device-plugin"  # device-plugin | dra | none
    device_list_strategy: str = "envvar"  # the device plugin's: envvar | cdi-cri | cdi-annotations
    cache: Path | None = None
    keep_on_failure: bool = False  # leave a failed cluster running for inspection (then `down`)
    nri_plugin: bool = True  # False: none is started (e.g. the Helm chart's DaemonSet brings its own)
    mig_strategy: str = "none"  # the device plugin's and GFD's --mig-strategy: none | single | mixed


@dataclass
class State:
    """What ``down``/``status`` of another process need: written to ``DIR/cluster.json``."""

    options: dict[str, Any]
    ports: dict[str, int]
    namespace_inode: int = 0
    procs: list[dict[str, Any]] = field(default_factory=list)
    cgroup_root: str = ""
    bridge: str = ""
    gpus: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    nri_external: bool = False
    host_sysctls: dict[str, str] = field(default_factory=dict)  # the host's values when the cluster came up


def _quiet(_: str) -> None:
    pass


class Cluster:
    def __init__(self, layout: Layout, state: State) -> None:
        self.layout = layout
        self.state = state

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, base: Path) -> Cluster:
        layout = Layout(base.absolute())
        try:
            data = json.loads(layout.state_file.read_text())
            state = State(**data)
        except FileNotFoundError:
            raise ClusterError(f"no cluster there ({layout.state_file.name} missing)") from None
        except (ValueError, TypeError) as exc:
            raise ClusterError(f"{layout.state_file.name} is not a cluster state file ({exc})") from None
        except OSError as exc:
            raise ClusterError(f"cannot read {layout.state_file.name}: {exc.strerror}") from None
        return cls(layout, state)

    def save(self) -> None:
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.state), indent=1))
        tmp.replace(self.layout.state_file)

    # ------------------------------------------------------------------ facts

    @property
    def ports(self) -> Ports:
        return Ports(**self.state.ports)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def node_name(self) -> str:
        return "localhost"

    @property
    def procs(self) -> list[process.Proc]:
        return [process.Proc(**p) for p in self.state.procs]

    def proc(self, name: str) -> process.Proc | None:
        return next((p for p in self.procs if p.name == name), None)

    @property
    def holder(self) -> int | None:
        p = self.proc("namespace")
        return p.pid if p and p.alive() else None

    # ------------------------------------------------------------------ for tests and plugins

    def api(self) -> Any:
        """A ``kubernetes.client.ApiClient`` with the admin's credentials."""
        from kubernetes import config as kconfig  # type: ignore[import-untyped, unused-ignore]

        return kconfig.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        kubectl = binaries.cached(self._cache)
        if kubectl is None:
            raise ClusterError("kubectl is not in the cache")
        argv = [str(kubectl["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
        return res

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the cluster's mount namespace (where kubelet's sockets are)."""
        if self.holder is None:
            raise ClusterError("the cluster's namespace is gone (is the cluster down?)")
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(process.in_namespace(self.holder, argv), check=False, **kw)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> process.Proc:
        """Start a long-running process in the namespace; ``down`` stops it (before kubelet)."""
        if self.proc(name) is not None and self.proc(name).alive():  # type: ignore[union-attr]
            raise ClusterError(f"a process named {name!r} runs already")
        proc = process.spawn(name, argv, self.layout.logs / f"{name}.log", holder=self.holder, env=env)
        self.state.procs = [p for p in self.state.procs if p["name"] != name] + [asdict(proc)]
        self.save()
        return proc

    def stop_process(self, name: str) -> None:
        p = self.proc(name)
        if p is not None:
            p.stop()
            self.state.procs = [q for q in self.state.procs if q["name"] != name]
            self.save()

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = containerd_dist.fetch(config_version(), self._cache)
        argv = [str(bindir / "ctr"), "-a", str(self.layout.containerd_socket), "-n", "k8s.io", *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and res.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res

    def import_image(self, tarball: Path) -> None:
        self.ctr("images", "import", str(tarball.absolute()))

    @property
    def _cache(self) -> Path | None:
        cache = self.state.options.get("cache")
        return Path(cache) if cache else None

    # ------------------------------------------------------------------ status

    def node(self) -> dict[str, Any] | None:
        """The Node object as the API server has it (None while it is unreachable or absent)."""
        try:
            return self._get(f"/api/v1/nodes/{self.node_name}")
        except ClusterError:
            return None

    def node_ready(self) -> bool:
        node = self.node()
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def allocatable_gpus(self) -> int:
        return self.allocatable("nvidia.com/gpu")

    def allocatable(self, resource: str) -> int:
        node = self.node() or {}
        return int(node.get("status", {}).get("allocatable", {}).get(resource, "0"))

    def slice_devices(self) -> int:
        """Devices the node's ResourceSlices publish (0 while none, or the API is unreachable)."""
        try:
            found = self._get(f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={self.node_name}")
        except ClusterError:
            return 0
        return sum(len(item.get("spec", {}).get("devices", [])) for item in found.get("items", []))

    def status(self) -> dict[str, Any]:
        return {
            "dir": str(self.layout.base),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "processes": {p.name: ("running" if p.alive() else "exited") for p in self.procs},
            "node_ready": self.node_ready(),
            "allocatable_gpus": self.allocatable_gpus(),
            "dra_devices": self.slice_devices(),
            "allocator": self.state.options.get("allocator"),
        }

    def _ssl(self) -> ssl.SSLContext:
        pki = Pki(self.layout.pki)
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))
        return ctx

    def _get(self, path: str, timeout: float = 5) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=timeout) as res:
                data: dict[str, Any] = json.loads(res.read())
                return data
        except (OSError, ValueError) as exc:
            raise ClusterError(f"GET {path}: {exc}") from None

    def _request(self, method: str, path: str, body: Any, content_type: str) -> dict[str, Any]:
        req = urllib.request.Request(
            self.server + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as res:
                data: dict[str, Any] = json.loads(res.read())
                return data
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{method} {path}: {exc}") from None

    def label_node(self, labels: Mapping[str, str]) -> None:
        self._request(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}",
            {"metadata": {"labels": dict(labels)}},
            "application/merge-patch+json",
        )

    def wait(self, what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT) -> float:
        t0 = time.monotonic()
        while not check():
            dead = [p.name for p in self.procs if not p.alive() and p.name != "gfd"]
            if dead:
                raise ClusterError(f"waiting for {what}: {', '.join(dead)} exited; logs in {self.layout.logs}")
            if time.monotonic() - t0 > timeout:
                raise ClusterError(f"{what}: not within {timeout:g}s; logs in {self.layout.logs}")
            time.sleep(0.1)
        return time.monotonic() - t0

    # ------------------------------------------------------------------ up

    @classmethod
    def up(cls, options: Options, progress: Progress = _quiet) -> Cluster:
        """Bring a cluster up under ``options.base``; on failure everything made is torn down."""
        if os.geteuid() != 0:
            raise ClusterError("a local cluster needs root (kubelet, containerd, device nodes, mounts)")
        if options.allocator not in gpustack.ALLOCATORS:
            raise ClusterError(f"--allocator {options.allocator!r}: choose one of {', '.join(gpustack.ALLOCATORS)}")
        if options.mig_strategy not in gpustack.MIG_STRATEGIES:
            raise ClusterError(
                f"--mig-strategy {options.mig_strategy!r}: choose one of {', '.join(gpustack.MIG_STRATEGIES)}"
            )
        if options.device_list_strategy not in gpustack.DEVICE_LIST_STRATEGIES:
            raise ClusterError(
                f"--device-list-strategy {options.device_list_strategy!r}: "
                f"choose one of {', '.join(gpustack.DEVICE_LIST_STRATEGIES)}"
            )
        layout = Layout(options.base.absolute())
        if layout.base.exists() and any(layout.base.iterdir()):
            raise ClusterError(f"the directory is in use (a cluster? mokka cluster down --dir {layout.base})")
        try:
            prof = profiles.load(options.profile).with_count(options.gpus)
        except (profiles.ProfileError, ValueError) as exc:
            raise ClusterError(f"profile {options.profile}: {exc}") from None
        if len(str(layout.containerd_socket)) + len(".ttrpc") > 100:
            raise ClusterError("the path is too long for containerd's sockets; choose a shorter --dir")
        opts = {**asdict(options), "base": str(layout.base), "cache": str(options.cache) if options.cache else None}
        state = State(options=opts, ports={}, cgroup_root=layout.cgroup_root, bridge=layout.bridge)
        cluster = cls(layout, state)
        layout.base.mkdir(parents=True, exist_ok=True)
        try:
            cluster._up(prof, options, progress)
        except BaseException:
            if options.keep_on_failure:
                progress(f"failed; left for inspection (logs: {layout.logs}); mokka cluster down --dir {layout.base}")
            else:
                progress("failed; tearing down")
                with contextlib.suppress(Exception):
                    cluster.down()
            raise
        return cluster

    @contextlib.contextmanager
    def _step(self, progress: Progress, title: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        took = time.monotonic() - t0
        self.state.timings[title] = round(took, 2)
        progress(f"{title} ({took:.1f}s)")

    def _up(self, prof: profiles.Profile, options: Options, progress: Progress) -> None:
        layout, cache = self.layout, options.cache
        t_start = time.monotonic()
        self.state.ports = asdict(Ports.choose())
        self.state.gpus = prof.gpu_count
        self.save()
        with self._step(progress, "binaries: Kubernetes, device plugin, etcd, containerd, CNI"):
            # The first run builds and fetches them into the cache (a pip-installed mokka too).
            try:
                bins = binaries.ensure(cache, progress)
                ctrd = containerd_dist.fetch(config_version(), cache)
                runc = containerd_dist.runc(cache)
                smi = nvidia_smi.fetch("550", cache)
                if options.allocator == "dra":  # `mokka dra-plugin` speaks the kubelet's plugin APIs
                    kubelet_api.generate(cache=cache)
            except (BuildError, gotool.BuildError, debcache.FetchError, kubelet_api.GenerateError) as exc:
                where = cache or debcache.default_cache()
                raise ClusterError(
                    f"binaries: {exc} (the first `up` builds and fetches them into {where} from the Go module proxy "
                    "and Debian's archive; later runs need no network)"
                ) from None
            except OSError as exc:
                raise ClusterError(f"binaries: {exc}") from None
            cni_bin = bins.cni
        with self._step(progress, f"mock node: {prof.gpu_count}x {prof.gpu.name} staged under {layout.node_root}"):
            gpustack.stage_node(layout, prof, smi)
        with self._step(progress, "certificates and kubeconfigs"):
            pki = Pki(layout.pki)
            pki.generate()
            for name in ("admin", "controller-manager", "scheduler", "kubelet"):
                pki.kubeconfig(name, self.server, layout.kubeconfigs / f"{name}.conf")
            config.write_kubelet_config(layout, self.ports)
            config.write_containerd_config(layout, runc, cni_bin)
            config.write_cni_config(layout)
        with self._step(progress, "private mount namespace (kubelet's host paths, sysctls, the GPUs' sysfs)"):
            self._start_namespace()
        with self._step(progress, "etcd, kube-apiserver, containerd 2.1"):
            self.spawn("etcd", config.etcd_argv(bins.etcd, layout, self.ports))
            self.spawn("kube-apiserver", config.apiserver_argv(bins["kube-apiserver"], layout, self.ports))
            self.spawn(
                "containerd",
                [str(ctrd / "containerd"), "--config", str(layout.containerd / "config.toml")],
                env={"PATH": f"{ctrd}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
            )
            self.wait(
                "containerd",
                lambda: layout.containerd_socket.exists() and self.ctr("version", check=False).returncode == 0,
            )
            for tarball in images.build(layout.images, smi, cache):
                self.import_image(tarball)
            self.wait("kube-apiserver /readyz", self._apiserver_ready)
        # A device plugin or DRA driver allocates: the NRI plugin gives each container what it got.
        self.state.nri_external = options.allocator != "none" and options.nri_plugin
        if options.nri_plugin:
            with self._step(progress, f"NRI plugin (allocator {'external' if self.state.nri_external else 'nri'})"):
                self._start_nri(self.state.nri_external)
        with self._step(progress, "controller-manager, scheduler, kubelet: node Ready"):
            self.spawn(
                "kube-controller-manager", config.controller_manager_argv(bins["kube-controller-manager"], layout)
            )
            self.spawn("kube-scheduler", config.scheduler_argv(bins["kube-scheduler"], layout))
            cgroups.create(layout.cgroup_root)
            self.spawn("kubelet", config.kubelet_argv(bins["kubelet"], layout))
            self.wait("node Ready", self.node_ready)
            self.wait("default service account", self._default_service_account)
        self.state.timings["node Ready"] = round(time.monotonic() - t_start, 2)
        if options.allocator == "device-plugin":
            with self._step(
                progress, f"NVIDIA device plugin {versions.DEVICE_PLUGIN} ({options.device_list_strategy})"
            ):
                argv = gpustack.device_plugin_argv(
                    bins["nvidia-device-plugin"],
                    layout,
                    options.device_list_strategy,
                    bins["nvidia-cdi-hook"],
                    options.mig_strategy,
                )
                self.spawn("nvidia-device-plugin", argv, env=gpustack.nvml_env(layout))
                want = gpustack.expected_allocatable(prof, options.mig_strategy)
                self.wait(
                    "allocatable " + ", ".join(f"{k} = {v}" for k, v in sorted(want.items())),
                    lambda: all(self.allocatable(k) == v for k, v in want.items()),
                )
        elif options.allocator == "dra":
            with self._step(progress, f"DRA driver (mokka dra-plugin): a ResourceSlice of {prof.gpu_count} GPUs"):
                argv_dra = gpustack.dra_driver_argv(layout)
                if argv_dra is None:
                    progress("note: no DRA driver in this version; ResourceClaims stay unallocated")
                else:
                    self.spawn("dra-driver", argv_dra)
                    self.wait("the DRA driver's ResourceSlice", lambda: self.slice_devices() == prof.gpu_count)
        with self._step(progress, "GPU Feature Discovery (one-shot): node labels"):
            self.label_node(self.run_gfd(bins["gpu-feature-discovery"]))
        self.state.timings["up"] = round(time.monotonic() - t_start, 2)
        self.save()

    def run_gfd(self, binary: Path) -> dict[str, str]:
        """GFD one-shot in the namespace; its labels (applied to the node by the caller, NFD's job)."""
        self.layout.gfd.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **gpustack.nvml_env(self.layout)}
        mig_strategy = str(self.state.options.get("mig_strategy", "none"))
        res = self.run(gpustack.gfd_argv(binary, self.layout, mig_strategy), timeout=120, env=env)
        (self.layout.logs / "gfd.log").write_text(res.stdout + res.stderr)
        out = self.layout.gfd / "labels"
        if res.returncode != 0 or not out.exists():
            raise ClusterError(f"gpu-feature-discovery exited {res.returncode}: {res.stderr.strip()[-1500:]}")
        return gpustack.parse_labels(out.read_text())

    def _start_namespace(self) -> None:
        layout = self.layout
        binds: list[list[str]] = []
        for host, private in config.PRIVATE_PATHS.items():
            d = layout.ns / private
            d.mkdir(parents=True, exist_ok=True)
            binds.append([str(d), host])
        sysctl_dir = layout.ns / "sysctl"
        sysctl_dir.mkdir(parents=True, exist_ok=True)
        for key in config.SYSCTLS:
            f = sysctl_dir / key.replace("/", ".")
            value = Path("/proc/sys", key).read_text()
            f.write_text(value)
            self.state.host_sysctls[key] = value.strip()
            binds.append([str(f), f"/proc/sys/{key}"])
        sys_binds, links = gpustack.namespace_entries(layout)
        spec = layout.ns / "spec.json"
        spec.write_text(json.dumps({"binds": binds + sys_binds, "links": links}, indent=1))
        ready = layout.ns / "ready"
        argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", namespace.__name__]
        holder = process.spawn("namespace", [*argv, str(spec), str(ready)], layout.logs / "namespace.log", holder=None)
        self.state.procs.append(asdict(holder))
        self.save()
        self.wait("namespace", ready.exists, timeout=30)
        self.state.namespace_inode = os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino
        self.save()

    def _start_nri(self, external: bool) -> None:
        argv = gpustack.nri_plugin_argv(self.layout, self.ports.nri_health, external)
        self.spawn("nri-plugin", argv)

        def registered() -> bool:
            try:
                url = f"http://127.0.0.1:{self.ports.nri_health}/healthz"
                with urllib.request.urlopen(url, timeout=1) as res:
                    return int(json.loads(res.read()).get("registrations", 0)) > 0
            except (OSError, ValueError):
                return False

        self.wait("NRI plugin registered", registered, timeout=30)

    def _apiserver_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.server + "/readyz", context=self._ssl(), timeout=2) as res:
                return bool(res.status == 200)
        except OSError:
            return False

    def _default_service_account(self) -> bool:
        try:
            self._get("/api/v1/namespaces/default/serviceaccounts/default")
            self._get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
            return True
        except ClusterError:
            return False

    # ------------------------------------------------------------------ down

    def down(self, progress: Progress = _quiet) -> list[str]:
        """Stop everything, undo host setup, remove DIR; returns what could not be cleaned."""
        if os.geteuid() != 0:
            raise ClusterError("taking a cluster down needs root (its processes, cgroups and bridge are root's)")
        problems: list[str] = []
        layout = self.layout
        # Hold the namespace open: while this descriptor lives, its inode is not handed to a new
        # namespace, so "every process in it" never names another one's (nsfs reuses numbers).
        holder = self.proc("namespace")
        ns_fd = os.open(f"/proc/{holder.pid}/ns/mnt", os.O_RDONLY) if holder and holder.alive() else None
        order = [p.name for p in self.procs if p.name not in ("kubelet", "containerd", "namespace")]
        # Plugins first (they hold kubelet's and containerd's sockets), then kubelet, the pods,
        # containerd and its shims, the control plane, and the namespace last.
        for name in [n for n in order if n not in CONTROL_PLANE] + ["kubelet"]:
            if (p := self.proc(name)) is not None and p.stop():
                problems.append(f"{name} ignored SIGTERM")
        problems += cgroups.remove(layout.cgroup_root)
        if (p := self.proc("containerd")) is not None and p.stop():
            problems.append("containerd ignored SIGTERM")
        for name in CONTROL_PLANE:
            if (p := self.proc(name)) is not None and p.stop():
                problems.append(f"{name} ignored SIGTERM")
        if holder is not None:
            holder.stop()
        if ns_fd is not None:  # shims, and what they fork while dying (runc), until none is left
            try:
                problems += process.kill_mount_namespace(os.fstat(ns_fd).st_ino)
            finally:
                os.close(ns_fd)
        # Whatever names the cluster's directory (a shim's -address, when the namespace was gone).
        problems += process.kill_naming(str(layout.base) + "/")
        problems += cgroups.remove(layout.cgroup_root)
        if Path(f"/sys/class/net/{layout.bridge}").exists():
            res = subprocess.run(["ip", "link", "delete", layout.bridge], capture_output=True, text=True, check=False)
            if res.returncode != 0:
                problems.append(f"cannot delete bridge {layout.bridge}: {res.stderr.strip()}")
        problems += gpustack.unstage_node(layout)
        if not problems:
            shutil.rmtree(layout.base, ignore_errors=True)
            if layout.base.exists():
                problems.append(f"cannot remove {layout.base}")
        progress("cluster down" + (f" with problems: {'; '.join(problems)}" if problems else ""))
        return problems


CONTROL_PLANE = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def config_version() -> str:
    return versions.CONTAINERD


def leftovers(base: Path) -> list[str]:
    """What a cluster under ``base`` left outside its directory (and the directory itself):
    processes naming it, mounts under it, its cgroups (the pods' processes are in them), its
    bridge. (Not "processes in its mount namespace": once that is gone, its inode number may
    already name another namespace.)"""
    layout = Layout(base.absolute())
    found: list[str] = []
    marker = str(layout.base) + "/"  # a path under it (not a sibling whose name it prefixes)
    for pid in process.all_pids():
        if pid != os.getpid() and marker in (cmdline := process.cmdline(pid)) and not process.zombie(pid):
            found.append(f"process {pid}: {cmdline}")
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4]
            if point == str(layout.base) or point.startswith(marker):
                found.append(f"mount {point}")
    found += [f"cgroup {d}" for d in cgroups.existing(layout.cgroup_root)]
    if Path(f"/sys/class/net/{layout.bridge}").exists():
        found.append(f"network interface {layout.bridge}")
    if layout.base.exists():
        found.append(f"directory {layout.base}")
    return found
