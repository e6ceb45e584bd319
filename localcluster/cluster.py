"""A real Kubernetes with mock GPU nodes, on this machine, without Docker: one node, or a fleet.

``Cluster.up(Options(base=DIR, nodes=(NodeSpec("h100"), NodeSpec("t4", 2))))`` stages one mock
node per spec, then brings up, step by step, the control plane (:mod:`.controlplane`: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS; loopback, free ports,
a mount namespace of its own whose /etc/hosts names every node), every real node (:mod:`.node`:
its own private mount namespace, containerd 2.1 with CRI, CDI and NRI on, kubelet, the NRI
plugin) and the add-ons the options ask for (:mod:`.addons`: NVIDIA's device plugin or a DRA
driver, GFD's labels, dcgm-exporter, virtual pools, fake-gpu-operator), and waits until every node
is Ready with its GPUs allocatable. Without ``nodes`` the cluster has the one node ``localhost``
of ``profile``/``gpus``. ``Cluster.load(DIR).down()`` stops everything and leaves no process,
mount, cgroup, network interface or file outside DIR and the cache; DIR itself is removed.

A Cluster is the :class:`~.context.Context` its nodes and add-ons are given, with ``up``, ``down``
and ``status`` on top, and shorthands for tests and the command line: :meth:`api` (a
``kubernetes`` client), :meth:`kubectl`, :meth:`get`/:meth:`post`/..., :meth:`node` (a
:class:`~.node.Node`: ``run`` a command in its namespace, ``spawn`` a process there, its
allocatable GPUs), and :meth:`run`/:meth:`spawn`, which do that on the first node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fetch import containerd_dist, debcache, gotool, kubelet_api, nvidia_smi
from fetch.kube import binaries, versions
from fetch.kube.gobuild import BuildError
from virtualfleet.pool import VirtualSpec, check_total

from . import cgroups, config, controlplane, gpustack, images, process
from .addons import dcgm, fgo, gfd, virtualpools
from .addons.base import AddOn, Kit
from .addons.device_plugin import DevicePlugin
from .addons.dra import MokkaDra
from .addons.fgo import FgoSpec
from .addons.gpu_operator.install import GpuOperator
from .addons.karpenter import Karpenter
from .addons.nfd import Nfd
from .addons.nvidia_dra import GPU_DRIVER, NvidiaDraUnavailable
from .addons.nvidia_dra.install import NvidiaDra
from .addons.virtualpools import VirtualPools
from .context import Context, Progress
from .errors import ClusterError
from .layout import MAX_NODES, Layout, NodePorts, Ports
from .node import new_record
from .nodespec import NodeSpec, resolve
from .processes import READY_TIMEOUT
from .state import State

__all__ = ["DEFAULT_BASE", "READY_TIMEOUT", "Cluster", "ClusterError", "Options", "leftovers"]

DEFAULT_BASE = Path("/run/mokka-cluster")
SUN_PATH_MAX = 107  # a unix socket's path: sockaddr_un's 108 bytes with the terminating NUL


@dataclass(frozen=True)
class Options:
    base: Path = DEFAULT_BASE
    profile: str = "h100"
    gpus: int | None = None
    allocator: str = "device-plugin"  # device-plugin | dra | nvidia-dra | none
    device_list_strategy: str = "envvar"  # the device plugin's: envvar | cdi-cri | cdi-annotations
    cache: Path | None = None
    keep_on_failure: bool = False  # leave a failed cluster running for inspection (then `down`)
    nri_plugin: bool = True  # False: none is started (e.g. the Helm chart's DaemonSet brings its own)
    mig_strategy: str = "none"  # the device plugin's and GFD's --mig-strategy: none | single | mixed
    nodes: tuple[NodeSpec, ...] = ()  # a fleet (each node <profile>-<i>); () = one node "localhost" of profile/gpus
    fabric_delay: float = 0  # seconds until the racks' fabric manager is ready (In Progress until then)
    virtual: tuple[VirtualSpec, ...] = ()  # pools of KWOK nodes carrying a real node's surface (virtualfleet.pool)
    karpenter: bool = False  # Karpenter's KWOK provider autoscales the virtual pools (addons.karpenter)
    fgo: tuple[FgoSpec, ...] = ()  # pools of KWOK nodes run:ai's fake-gpu-operator serves (addons.fgo)
    dcgm_exporter: bool = False  # NVIDIA's dcgm-exporter as a DaemonSet on the mock libdcgm (addons.dcgm)
    nfd: bool = False  # Node Feature Discovery's master and workers label the nodes (addons.nfd)
    gpu_operator: bool = False  # NVIDIA's GPU Operator from its chart deploys the GPU stack (addons.gpu_operator)
    container_toolkit: bool = False  # with gpu_operator: its toolkit operand configures the nodes' containerd

    def specs(self) -> tuple[NodeSpec, ...]:
        return self.nodes or (NodeSpec(self.profile, self.gpus),)

    @property
    def runs_nfd(self) -> bool:
        """NFD labels the nodes: asked for, or NVIDIA's DRA chart places its plugins by its labels."""
        return self.nfd or self.allocator == "nvidia-dra"

    def addons(self) -> list[AddOn]:
        """The add-ons these options ask for, in the order they come up."""
        chosen: list[AddOn] = []
        if self.gpu_operator:  # its chart brings NFD, the device plugin, GFD, dcgm-exporter
            # virtual nodes first: NFD's labels on them make them GPU nodes the operator serves too
            if self.virtual:
                chosen.append(VirtualPools(self.virtual, self.mig_strategy, dra=False, nfd=True))
            return [*chosen, GpuOperator(self.mig_strategy, self.container_toolkit)]
        if self.runs_nfd:
            chosen.append(Nfd())
        if self.allocator == "device-plugin":
            chosen.append(DevicePlugin(self.device_list_strategy, self.mig_strategy))
        elif self.allocator == "dra":
            chosen.append(MokkaDra())
        elif self.allocator == "nvidia-dra":
            chosen.append(NvidiaDra())
        chosen.append(gfd.Gfd(self.mig_strategy))
        if self.dcgm_exporter:
            chosen.append(dcgm.DcgmExporter())
        if self.virtual or self.fgo:  # KWOK runs the nodes of both
            dra = self.allocator == "dra"
            chosen.append(VirtualPools(self.virtual, self.mig_strategy, dra=dra, nfd=self.runs_nfd))
        if self.karpenter:
            chosen.append(Karpenter())
        if self.fgo:
            chosen.append(fgo.Fgo(list(self.fgo), self.mig_strategy))
        return chosen


class Cluster(Context):
    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, base: Path) -> Cluster:
        layout = Layout(base.absolute())
        return cls(layout, State.read(layout.state_file))

    # ------------------------------------------------------------------ shorthands

    @property
    def server(self) -> str:
        return self.apiserver.server

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def node_name(self) -> str:
        return self.node().name

    @property
    def pools(self) -> list[virtualpools.Made]:
        """The virtual pools (VirtualGPUPools the fleet controller makes into nodes), as ``up`` asked."""
        return virtualpools.pools(self)

    @property
    def fgo_pools(self) -> list[FgoSpec]:
        return [FgoSpec.parse(text) for text in self.state.fgo]

    @property
    def procs(self) -> list[process.Proc]:
        return self.processes.all()

    def proc(self, name: str) -> process.Proc | None:
        """Process ``name``: the control plane's, a node's (``<process>@<node>``), or else the first
        node's ``<process>`` (as :meth:`spawn` names it)."""
        return self.processes.get(name)

    @property
    def holder(self) -> int | None:
        """The control plane's namespace holder."""
        return self.processes.holder

    @property
    def net_holder(self) -> int | None:
        """The holder of the cluster's network namespace (:mod:`.netns`)."""
        return self.processes.net_holder

    def api(self) -> Any:
        """A ``kubernetes.client.ApiClient`` with the admin's credentials."""
        return self.apiserver.client()

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self.apiserver.kubectl(*args, input=input, check=check, timeout=timeout)

    def ssl_context(self) -> ssl.SSLContext:
        return self.apiserver.ssl_context()

    def get(self, path: str, timeout: float = 5) -> dict[str, Any]:
        return self.apiserver.get(path, timeout)

    def get_text(self, path: str, timeout: float = 5) -> str:
        return self.apiserver.get_text(path, timeout)

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        return self.apiserver.patch(path, body)

    def post(self, path: str, body: Any) -> dict[str, Any]:
        return self.apiserver.post(path, body)

    def delete(self, path: str) -> None:
        self.apiserver.delete(path)

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the first node's mount namespace (where its kubelet's sockets are)."""
        return self.node().run(argv, **kw)  # type: ignore[no-any-return]

    def run_in(self, holder: int | None, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.processes.run(holder, argv, **kw)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> process.Proc:
        """Start a long-running process in the first node's namespace; ``down`` stops it (before kubelet)."""
        return self.node().spawn(name, argv, env)

    def spawn_in(
        self, holder: int | None, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> process.Proc:
        return self.processes.spawn(holder, name, argv, log, env)

    def stop_process(self, name: str) -> None:
        """Stop process ``name`` (a node's own, ``<process>@<node>``, or the first node's ``<process>``)."""
        self.processes.stop(name)

    def start_holder(self, name: str, spec: dict[str, Any], ns_dir: Path, logs: Path) -> int:
        """A namespace holder (:mod:`.namespace`) with ``spec``'s mounts; the namespace's inode."""
        return self.processes.start_holder(name, spec, ns_dir, logs)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` on the first node's containerd."""
        return self.node().ctr(*args, check=check)

    # ------------------------------------------------------------------ status

    def node_ready(self) -> bool:
        """Every node Ready."""
        return all(n.ready() for n in self.nodes)

    def allocatable_gpus(self) -> int:
        return self.allocatable("nvidia.com/gpu")

    def allocatable(self, resource: str) -> int:
        """``resource`` allocatable over every node."""
        return sum(n.allocatable(resource) for n in self.nodes)

    def slice_devices(self) -> int:
        """Devices every node's ResourceSlices publish."""
        return sum(n.slice_devices() for n in self.nodes)

    def status(self) -> dict[str, Any]:
        nodes = []
        procs = self.procs
        for n in self.nodes:
            mine = {p.name.rsplit("@", 1)[0]: p for p in procs if p.name.endswith(f"@{n.name}")}
            nodes.append(
                {
                    "name": n.name,
                    "profile": n.record.get("spec") or n.record.get("profile"),
                    "product": n.record.get("product"),
                    "rack": n.record.get("rack"),
                    "gpus": n.gpus,
                    "ready": n.ready(),
                    "allocatable_gpus": n.allocatable(),
                    "dra_devices": n.slice_devices(GPU_DRIVER),  # GPUs (not IMEX channels)
                    "processes": {name: ("running" if p.alive() else "exited") for name, p in mine.items()},
                }
            )
        control = {p.name: ("running" if p.alive() else "exited") for p in procs if "@" not in p.name}
        return {
            "dir": str(self.layout.base),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "processes": control,
            "nodes": nodes,
            "node_ready": all(n["ready"] for n in nodes),
            "allocatable_gpus": sum(n["allocatable_gpus"] for n in nodes),
            "dra_devices": sum(n["dra_devices"] for n in nodes),
            "allocator": self.options.get("allocator"),
            "virtual": virtualpools.pool_status(self, self.pools) if self.state.virtual else [],
            "fgo": fgo.pool_status(self, self.fgo_pools) if self.state.fgo else [],
        }

    # ------------------------------------------------------------------ up

    @classmethod
    def up(cls, options: Options, progress: Progress = lambda _: None) -> Cluster:
        """Bring a cluster up under ``options.base``; on failure everything made is torn down."""
        if os.geteuid() != 0:
            raise ClusterError("a local cluster needs root (kubelet, containerd, device nodes, mounts)")
        _check_choices(options)
        layout = Layout(options.base.absolute())
        if layout.base.exists() and any(layout.base.iterdir()):
            raise ClusterError(f"the directory is in use (a cluster? mokka cluster down --dir {layout.base})")
        try:
            resolved = resolve(options.specs(), fleet_names=bool(options.nodes), fabric_delay=options.fabric_delay)
        except ValueError as exc:
            raise ClusterError(str(exc) if options.nodes else f"profile {options.profile}: {exc}") from None
        addons = options.addons()
        try:
            check_total(options.virtual, sum(f.count for f in options.fgo))
            for addon in addons:
                addon.check(options.cache or debcache.default_cache())
        except (ValueError, fgo.FgoError, NvidiaDraUnavailable) as exc:
            raise ClusterError(str(exc)) from None
        if options.fabric_delay and not any(r.rack for r in resolved):
            raise ClusterError("--fabric-delay: no node is in a rack (--node PROFILE@RACK)")
        longest = max(len(str(layout.node(r.name, i).containerd_socket)) for i, r in enumerate(resolved))
        if longest + len(".ttrpc") > SUN_PATH_MAX:
            raise ClusterError("the path is too long for containerd's sockets; choose a shorter --dir")
        opts = {**asdict(options), "base": str(layout.base), "cache": str(options.cache) if options.cache else None}
        state = State(options=opts, ports={}, cgroup_prefix=layout.cgroup_prefix, bridge=layout.bridge)
        taken: set[int] = set()
        state.ports = asdict(Ports.choose(taken))
        state.nodes = [new_record(r.name, r.profile, str(r.spec), r.rack, NodePorts.choose(taken)) for r in resolved]
        cluster = cls(layout, state)
        cluster.progress = progress
        cluster.profiles = {r.name: r.profile for r in resolved}
        layout.base.mkdir(parents=True, exist_ok=True)
        cluster.save()
        try:
            cluster._up(options, addons)
        except BaseException:
            if options.keep_on_failure:
                progress(f"failed; left for inspection (logs: {layout.logs}); mokka cluster down --dir {layout.base}")
            else:
                progress("failed; tearing down")
                with contextlib.suppress(Exception):
                    cluster.down()
            raise
        return cluster

    def _up(self, options: Options, addons: list[AddOn]) -> None:
        """The steps of ``up``: what every node needs, the control plane and the nodes side by side
        (each step on every node, so that their waits overlap), then each add-on."""
        cache, t_start, nodes = options.cache, time.monotonic(), self.nodes
        with self.step("binaries: Kubernetes, device plugin, etcd, containerd, CNI"):
            kit, ctrd, runc = _fetch(cache, addons, self.progress)
        staged = ", ".join(
            f"{n.name}: {self.profiles[n.name].gpu_count}x {self.profiles[n.name].gpu.name}" for n in nodes
        )
        with self.step(f"mock nodes staged ({staged})"):
            self.each("mock node", lambda n: n.stage(self.profiles[n.name], kit.nvidia_smi))
        if any(self.profiles[n.name].infiniband for n in nodes):
            with self.step("InfiniBand subnet: every node's adapters on their rail's leaf switch, one spine"):
                gpustack.stage_fabric([(n.name, self.profiles[n.name], n.layout) for n in nodes])
        with self.step("network namespace (the pods' bridge, Services' rules) and the host's way in"):
            controlplane.start_network(self)
        with self.step("certificates and kubeconfigs"):
            controlplane.write_certificates(self)
            for n in nodes:
                n.write_configs(runc, kit.bins.cni)
        with self.step("private mount namespaces (control plane; each node's host paths, sysctls, GPUs)"):
            controlplane.start_namespace(self)
            self.state.host_sysctls = {key: Path("/proc/sys", key).read_text().strip() for key in config.SYSCTLS}
            self.each("private mount namespace", lambda n: n.start_namespace(self.state.host_sysctls))
            self.save()
        with self.step(f"etcd, kube-apiserver; containerd 2.1 on {len(nodes)} node(s)"):
            controlplane.start_etcd_and_apiserver(self, kit.bins)
            self.each("containerd", lambda n: n.start_containerd(ctrd))
            self.wait_each("containerd", lambda n: n.containerd_up())
            for tarball in images.build(self.layout.images, kit.nvidia_smi, cache):
                self.import_image(tarball)
            self.wait("kube-apiserver /readyz", self.apiserver.ready)
        # A device plugin or DRA driver allocates: the NRI plugin gives each container what it got.
        self.state.nri_external = options.allocator != "none" and options.nri_plugin
        if options.nri_plugin:
            with self.step(f"NRI plugin (allocator {'external' if self.state.nri_external else 'nri'})"):
                self.each("NRI plugin", lambda n: n.start_nri(self.state.nri_external))
                self.wait_each("NRI plugin registered", lambda n: n.nri_registered(), timeout=30)
        ready_what = "node Ready" if len(nodes) == 1 else f"all {len(nodes)} nodes Ready"
        with self.step(f"controller-manager, scheduler, kubelet: {ready_what}"):
            controlplane.start_controllers(self, kit.bins, virtual_nodes=bool(options.virtual or options.fgo))
            self.each("kubelet", lambda n: n.start_kubelet(kit.bins["kubelet"]))
            self.wait_each("node Ready", lambda n: n.ready())
            self.wait("default service account", lambda: controlplane.default_service_account(self))
        with self.step("Services and DNS: kube-proxy, CoreDNS (kube-system/kube-dns)"):
            controlplane.start_services(self, kit.bins)
        self.state.timings["node Ready"] = round(time.monotonic() - t_start, 2)
        for addon in addons:
            addon.up(self, kit)
        self.state.timings["up"] = round(time.monotonic() - t_start, 2)
        self.save()

    # ------------------------------------------------------------------ down

    def down(self, progress: Progress = lambda _: None) -> list[str]:
        """Stop everything, undo host setup, remove DIR; returns what could not be cleaned."""
        if os.geteuid() != 0:
            raise ClusterError("taking a cluster down needs root (its processes, cgroups and bridge are root's)")
        problems: list[str] = []
        layout = self.layout
        spawned = [p.pid for p in self.procs]
        # Every node first (plugins, kubelet, pods, containerd and its shims), then the control plane,
        # last started first, then the namespaces' holders.
        for n in self.nodes:
            problems += n.stop()
        control = [p for p in self.procs if "@" not in p.name and p.name not in controlplane.HOLDERS]
        for p in reversed(control):
            if p.name in fgo.PROCESSES:  # FGO's status exporter takes ~20 s per 1000 nodes to stop
                if p.stop(timeout=30):
                    progress(f"{p.name} killed: not stopped 30 s after SIGTERM")
            elif p.stop():
                problems.append(f"{p.name} ignored SIGTERM")
        for name in controlplane.HOLDERS:  # the network namespace goes with its last process
            if (holder := self.proc(name)) is not None:
                holder.stop()
        # Whatever names the cluster's directory (a shim's -address, when a namespace was gone).
        problems += process.kill_naming(str(layout.base) + "/")
        for i in range(len(self.state.nodes)):
            problems += cgroups.remove(f"{layout.cgroup_prefix}-{i}")
        if Path(f"/sys/class/net/{layout.bridge}").exists():
            res = subprocess.run(["ip", "link", "delete", layout.bridge], capture_output=True, text=True, check=False)
            if res.returncode != 0:
                problems.append(f"cannot delete bridge {layout.bridge}: {res.stderr.strip()}")
        process.reap(spawned)
        if not problems:
            shutil.rmtree(layout.base, ignore_errors=True)
            if layout.base.exists():
                problems.append(f"cannot remove {layout.base}")
        progress("cluster down" + (f" with problems: {'; '.join(problems)}" if problems else ""))
        return problems


def _check_choices(options: Options) -> None:
    if options.container_toolkit and not options.gpu_operator:
        raise ClusterError("--container-toolkit is the GPU Operator's toolkit operand: add --gpu-operator")
    if options.gpu_operator:
        clash = {
            "--allocator " + options.allocator: options.allocator != "device-plugin",
            "--nfd": options.nfd,
            "--dcgm-exporter": options.dcgm_exporter,
            "--fgo": bool(options.fgo),
            "--device-list-strategy " + options.device_list_strategy: options.device_list_strategy != "envvar",
            "--no-nri-plugin": not options.nri_plugin,
        }
        if named := [flag for flag, on in clash.items() if on]:
            raise ClusterError(
                "--gpu-operator deploys NFD, NVIDIA's device plugin, GFD and dcgm-exporter itself: "
                f"drop {', '.join(named)}"
            )
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


def _fetch(cache: Path | None, addons: list[AddOn], progress: Progress) -> tuple[Kit, Path, Path]:
    """What the nodes and the add-ons run, fetched and built into the cache by the first run (a
    pip-installed mokka too): the kit, containerd's directory and runc."""
    try:
        bins = binaries.ensure(cache, progress)
        ctrd = containerd_dist.fetch(versions.CONTAINERD, cache)
        runc = containerd_dist.runc(cache)
        smi = nvidia_smi.fetch("550", cache)
        for addon in addons:
            addon.fetch(cache)
    except (BuildError, gotool.BuildError, debcache.FetchError, kubelet_api.GenerateError) as exc:
        where = cache or debcache.default_cache()
        raise ClusterError(
            f"binaries: {exc} (the first `up` builds and fetches them into {where} from the Go module proxy "
            "and Debian's archive; later runs need no network)"
        ) from None
    except OSError as exc:
        raise ClusterError(f"binaries: {exc}") from None
    return Kit(bins, smi), ctrd, runc


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
    for i in range(MAX_NODES):
        found += [f"cgroup {d}" for d in cgroups.existing(f"{layout.cgroup_prefix}-{i}")]
    if Path(f"/sys/class/net/{layout.bridge}").exists():
        found.append(f"network interface {layout.bridge}")
    if layout.base.exists():
        found.append(f"directory {layout.base}")
    return found
