"""A real Kubernetes with mock GPU nodes, on this machine, without Docker: one node, or a fleet.

``Cluster.up(Options(base=DIR, nodes=(NodeSpec("h100"), NodeSpec("t4", 2))))`` stages one mock
node per spec, generates a CA and certificates, starts one control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler: loopback, free ports, a mount namespace of its own whose
/etc/hosts names every node) and, for every node, its own private mount namespace, containerd 2.1
(CRI, CDI and NRI on), kubelet, NRI plugin, NVIDIA's device plugin (or a DRA driver) and GPU
Feature Discovery (:mod:`.node`), and waits until every node is Ready with its GPUs allocatable.
Without ``nodes`` the cluster has the one node ``localhost`` of ``profile``/``gpus``.
``Cluster.load(DIR).down()`` stops everything and leaves no process, mount, cgroup, network
interface or file outside DIR and the cache; DIR itself is removed.

For tests and later plugins: :meth:`Cluster.api` (a ``kubernetes`` client), :meth:`Cluster.kubectl`,
:meth:`Cluster.node` (a :class:`~.node.Node`: ``run`` a command in its namespace, ``spawn`` a
process there, its allocatable GPUs), and :meth:`Cluster.run`/:meth:`Cluster.spawn`, which do
that on the first node.
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

from fetch import containerd_dist, debcache, gotool, kubelet_api, nvidia_smi
from fetch import versions as tools
from fetch.kube import binaries, versions
from fetch.kube.gobuild import BuildError
from gpumodel import profile as profiles

from . import (
    cgroups,
    config,
    fgo,
    forward,
    gpustack,
    images,
    namespace,
    netns,
    nodewatch,
    nvidia_dra,
    process,
    virtualpools,
)
from .config import Layout, NodePorts, Ports
from .fgo import FgoSpec
from .node import Node, new_record
from .nodespec import NodeSpec, resolve
from .pki import Pki
from .virtual import Pool, VirtualSpec, check_total

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
    allocator: str = "device-plugin"  # device-plugin | dra | nvidia-dra | none
    device_list_strategy: str = "envvar"  # the device plugin's: envvar | cdi-cri | cdi-annotations
    cache: Path | None = None
    keep_on_failure: bool = False  # leave a failed cluster running for inspection (then `down`)
    nri_plugin: bool = True  # False: none is started (e.g. the Helm chart's DaemonSet brings its own)
    mig_strategy: str = "none"  # the device plugin's and GFD's --mig-strategy: none | single | mixed
    nodes: tuple[NodeSpec, ...] = ()  # a fleet (each node <profile>-<i>); () = one node "localhost" of profile/gpus
    fabric_delay: float = 0  # seconds until the racks' fabric manager is ready (In Progress until then)
    virtual: tuple[VirtualSpec, ...] = ()  # pools of KWOK nodes carrying a real node's surface (:mod:`.virtual`)
    fgo: tuple[FgoSpec, ...] = ()  # pools of KWOK nodes run:ai's fake-gpu-operator serves (:mod:`.fgo`)
    dcgm_exporter: bool = False  # NVIDIA's dcgm-exporter as a DaemonSet on the mock libdcgm (:mod:`.dcgm`)

    def specs(self) -> tuple[NodeSpec, ...]:
        return self.nodes or (NodeSpec(self.profile, self.gpus),)


@dataclass
class State:
    """What ``down``/``status`` of another process need: written to ``DIR/cluster.json``."""

    options: dict[str, Any]
    ports: dict[str, int]
    namespace_inode: int = 0  # the control plane's mount namespace
    procs: list[dict[str, Any]] = field(default_factory=list)
    cgroup_prefix: str = ""
    bridge: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)  # node.new_record()s, in order
    timings: dict[str, float] = field(default_factory=dict)
    nri_external: bool = False
    host_sysctls: dict[str, str] = field(default_factory=dict)  # the host's values when the cluster came up
    virtual: list[dict[str, Any]] = field(default_factory=list)  # virtual.Pool.to_json()s
    fgo: list[str] = field(default_factory=list)  # the FgoSpecs, as given


def _quiet(_: str) -> None:
    pass


class Cluster:
    def __init__(self, layout: Layout, state: State) -> None:
        self.layout = layout
        self.state = state
        self._ssl_context: ssl.SSLContext | None = None

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
    def nodes(self) -> list[Node]:
        return [Node(self, i) for i in range(len(self.state.nodes))]

    def node(self, name: str | None = None) -> Node:
        """Node ``name`` (default: the first node)."""
        nodes = self.nodes
        if not nodes:
            raise ClusterError("the cluster has no node")
        if name is None:
            return nodes[0]
        for n in nodes:
            if n.name == name:
                return n
        raise ClusterError(f"no node {name!r} in this cluster (its nodes: {', '.join(n.name for n in nodes)})")

    @property
    def pools(self) -> list[Pool]:
        """The virtual pools (:mod:`.virtual`), as made at ``up`` (faults applied since)."""
        return [Pool(**p) for p in self.state.virtual]

    @property
    def fgo_pools(self) -> list[FgoSpec]:
        return [FgoSpec.parse(text) for text in self.state.fgo]

    def virtual_fault(self, node: str, gpus: Sequence[int], reason: str | None) -> list[str]:
        """GPUs of virtual node ``node`` unhealthy for ``reason`` (None: healthy again); a note per GPU."""
        pools = self.pools
        pool = virtualpools.find(pools, node)
        if pool is None:
            raise ClusterError(f"no virtual node {node!r} in this cluster")
        if bad := [i for i in gpus if not 0 <= i < pool.gpus]:
            raise ClusterError(f"node {node} has GPUs 0-{pool.gpus - 1}, not {bad[0]}")
        with _api_errors(f"node {node}"):
            notes = virtualpools.apply_fault(self, pool, node, gpus, reason)
        self.state.virtual = [pool.to_json() if p.name == pool.name else p.to_json() for p in pools]
        self.save()
        return notes

    @property
    def node_name(self) -> str:
        return self.node().name

    @property
    def procs(self) -> list[process.Proc]:
        return [process.Proc(**p) for p in self.state.procs]

    def proc(self, name: str) -> process.Proc | None:
        """Process ``name``: the control plane's, a node's (``<process>@<node>``), or else the first
        node's ``<process>`` (as :meth:`spawn` names it)."""
        procs = self.procs
        found = next((p for p in procs if p.name == name), None)
        if found is None and "@" not in name and self.state.nodes:
            first = f"{name}@{self.state.nodes[0]['name']}"
            found = next((p for p in procs if p.name == first), None)
        return found

    @property
    def holder(self) -> int | None:
        """The control plane's namespace holder."""
        p = self.proc("namespace")
        return p.pid if p and p.alive() else None

    @property
    def net_holder(self) -> int | None:
        """The holder of the cluster's network namespace (:mod:`.netns`)."""
        p = self.proc("netns")
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
        """Run ``argv`` inside the first node's mount namespace (where its kubelet's sockets are)."""
        return self.node().run(argv, **kw)  # type: ignore[no-any-return]

    def run_in(self, holder: int | None, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if holder is None:
            raise ClusterError("the namespace is gone (is the cluster down?)")
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(process.in_namespace(holder, argv, self.net_holder), check=False, **kw)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> process.Proc:
        """Start a long-running process in the first node's namespace; ``down`` stops it (before kubelet)."""
        return self.node().spawn(name, argv, env)

    def stop_process(self, name: str) -> None:
        """Stop process ``name`` (a node's own, ``<process>@<node>``, or the first node's ``<process>``)."""
        p = self.proc(name)
        if p is not None:
            p.stop()
            self.state.procs = [q for q in self.state.procs if q["name"] != p.name]
            self.save()

    def spawn_in(
        self, holder: int | None, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> process.Proc:
        if self.proc(name) is not None and self.proc(name).alive():  # type: ignore[union-attr]
            raise ClusterError(f"a process named {name!r} runs already")
        proc = process.spawn(name, argv, log, holder=holder, env=env, net=self.net_holder)
        self.state.procs = [p for p in self.state.procs if p["name"] != name] + [asdict(proc)]
        self.save()
        return proc

    def start_holder(self, name: str, spec: dict[str, Any], ns_dir: Path, logs: Path) -> int:
        """A namespace holder (:mod:`.namespace`) with ``spec``'s mounts; the namespace's inode."""
        ns_dir.mkdir(parents=True, exist_ok=True)
        spec_file = ns_dir / "spec.json"
        spec_file.write_text(json.dumps(spec, indent=1))
        ready = ns_dir / "ready"
        argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", namespace.__name__]
        log = logs / "namespace.log"
        holder = process.spawn(name, [*argv, str(spec_file), str(ready)], log, holder=None, net=self.net_holder)
        self.state.procs.append(asdict(holder))
        self.save()
        self.wait(name, ready.exists, timeout=30)
        inode = os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino
        self.save()
        return inode

    def ctr_at(self, socket: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        bindir = containerd_dist.fetch(config_version(), self._cache)
        argv = [str(bindir / "ctr"), "-a", str(socket), "-n", "k8s.io", *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and res.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` on the first node's containerd."""
        return self.ctr_at(self.node().layout.containerd_socket, *args, check=check)

    def import_image(self, tarball: Path) -> None:
        """Import an image archive into every node's containerd."""
        for n in self.nodes:
            n.ctr("images", "import", str(tarball.absolute()))

    @property
    def _cache(self) -> Path | None:
        cache = self.state.options.get("cache")
        return Path(cache) if cache else None

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
        for n in self.nodes:
            procs = {p.name.rsplit("@", 1)[0]: p for p in self.procs if p.name.endswith(f"@{n.name}")}
            nodes.append(
                {
                    "name": n.name,
                    "profile": n.record.get("spec") or n.record.get("profile"),
                    "product": n.record.get("product"),
                    "rack": n.record.get("rack"),
                    "gpus": n.gpus,
                    "ready": n.ready(),
                    "allocatable_gpus": n.allocatable(),
                    "dra_devices": n.slice_devices(nvidia_dra.GPU_DRIVER),  # GPUs (not IMEX channels)
                    "processes": {name: ("running" if p.alive() else "exited") for name, p in procs.items()},
                }
            )
        control = {p.name: ("running" if p.alive() else "exited") for p in self.procs if "@" not in p.name}
        return {
            "dir": str(self.layout.base),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "processes": control,
            "nodes": nodes,
            "node_ready": all(n["ready"] for n in nodes),
            "allocatable_gpus": sum(n["allocatable_gpus"] for n in nodes),
            "dra_devices": sum(n["dra_devices"] for n in nodes),
            "allocator": self.state.options.get("allocator"),
            "virtual": virtualpools.pool_status(self, self.pools) if self.state.virtual else [],
            "fgo": fgo.pool_status(self, self.fgo_pools) if self.state.fgo else [],
        }

    def ssl_context(self) -> ssl.SSLContext:
        """TLS with the admin's credentials, for the API server (made once)."""
        if self._ssl_context is None:
            pki = Pki(self.layout.pki)
            self._ssl_context = ssl.create_default_context(cafile=str(pki.ca))
            self._ssl_context.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))
        return self._ssl_context

    def get(self, path: str, timeout: float = 5) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.get_text(path, timeout))
            return data
        except ValueError as exc:
            raise ClusterError(f"GET {path}: {exc}") from None

    def get_text(self, path: str, timeout: float = 5) -> str:
        """The body at ``path`` as text (e.g. a pod's /metrics through the API server's proxy)."""
        try:
            with urllib.request.urlopen(self.server + path, context=self.ssl_context(), timeout=timeout) as res:
                return str(res.read().decode())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"GET {path}: {exc}") from None

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        """A JSON merge patch of the object at ``path``."""
        return self._send("PATCH", path, body, "application/merge-patch+json")

    def post(self, path: str, body: Any) -> dict[str, Any]:
        """Create ``body`` in the collection at ``path``."""
        return self._send("POST", path, body, "application/json")

    def delete(self, path: str) -> None:
        """Delete the object at ``path`` at once (no grace period); one already gone is fine."""
        try:
            self._send("DELETE", path, {"gracePeriodSeconds": 0}, "application/json")
        except ClusterError as exc:
            if "404" not in str(exc):
                raise

    def _send(self, method: str, path: str, body: Any, content_type: str) -> dict[str, Any]:
        req = urllib.request.Request(
            self.server + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as res:
                data: dict[str, Any] = json.loads(res.read())
                return data
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{method} {path}: {exc}") from None

    def label_node(self, labels: Mapping[str, str], node: str | None = None) -> None:
        self.node(node).label(labels)

    def wait(self, what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT, poll: float = 0.1) -> float:
        """Seconds until ``check`` holds, asked every ``poll`` seconds; a ClusterError when a cluster
        process exits or ``timeout`` passes first."""
        t0 = time.monotonic()
        while not check():
            dead = [p.name for p in self.procs if not p.alive() and not p.name.startswith("gfd")]
            if dead:
                raise ClusterError(f"waiting for {what}: {', '.join(dead)} exited; logs in {self.layout.logs}")
            if time.monotonic() - t0 > timeout:
                raise ClusterError(f"{what}: not within {timeout:g}s; logs in {self.layout.logs}")
            time.sleep(poll)
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
            resolved = resolve(options.specs(), fleet_names=bool(options.nodes), fabric_delay=options.fabric_delay)
        except ValueError as exc:
            raise ClusterError(str(exc) if options.nodes else f"profile {options.profile}: {exc}") from None
        try:
            check_total(options.virtual, sum(f.count for f in options.fgo))
            if options.fgo:
                fgo.find_binaries(options.cache or debcache.default_cache())
            if options.allocator == "nvidia-dra":
                nvidia_dra.find(options.cache or debcache.default_cache())
        except (ValueError, fgo.FgoError, nvidia_dra.NvidiaDraUnavailable) as exc:
            raise ClusterError(str(exc)) from None
        if options.fabric_delay and not any(r.rack for r in resolved):
            raise ClusterError("--fabric-delay: no node is in a rack (--node PROFILE@RACK)")
        longest = max(len(str(layout.node(r.name, i).containerd_socket)) for i, r in enumerate(resolved))
        if longest + len(".ttrpc") > 100:
            raise ClusterError("the path is too long for containerd's sockets; choose a shorter --dir")
        opts = {**asdict(options), "base": str(layout.base), "cache": str(options.cache) if options.cache else None}
        state = State(options=opts, ports={}, cgroup_prefix=layout.cgroup_prefix, bridge=layout.bridge)
        taken: set[int] = set()
        state.ports = asdict(Ports.choose(taken))
        state.nodes = [new_record(r.name, r.profile, str(r.spec), r.rack, NodePorts.choose(taken)) for r in resolved]
        cluster = cls(layout, state)
        layout.base.mkdir(parents=True, exist_ok=True)
        cluster.save()
        try:
            cluster._up([r.profile for r in resolved], options, progress)
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

    def _each(self, what: str, fn: Callable[[Node], object]) -> None:
        """``fn`` on every node; a failure names the node and the step."""
        for n in self.nodes:
            try:
                fn(n)
            except ClusterError as exc:
                raise ClusterError(f"node {n.name}: {what}: {exc}") from None
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                raise ClusterError(f"node {n.name}: {what}: {exc}") from None

    def _wait_each(self, what: str, check: Callable[[Node], bool], timeout: float = READY_TIMEOUT) -> None:
        """Wait until ``check`` holds for every node; a failure names the node: the one whose process
        exited, else those still waiting when time ran out."""
        try:
            self.wait(what, lambda: all(check(n) for n in self.nodes), timeout)
        except ClusterError as exc:
            dead = [p.name for p in self.procs if "@" in p.name and not p.alive()]
            if dead:
                named = sorted({d.split("@", 1)[1] for d in dead})
                raise ClusterError(
                    f"node {', '.join(named)}: {what}: {', '.join(dead)} exited; logs in {self.layout.logs}"
                ) from None
            waiting = [n.name for n in self.nodes if not check(n)]
            raise ClusterError(f"node {', '.join(waiting) or '?'}: {exc}") from None

    def _up(self, profs: list[profiles.Profile], options: Options, progress: Progress) -> None:
        layout, cache = self.layout, options.cache
        t_start = time.monotonic()
        nodes = self.nodes
        with self._step(progress, "binaries: Kubernetes, device plugin, etcd, containerd, CNI"):
            # The first run builds and fetches them into the cache (a pip-installed mokka too).
            try:
                bins = binaries.ensure(cache, progress)
                ctrd = containerd_dist.fetch(config_version(), cache)
                runc = containerd_dist.runc(cache)
                smi = nvidia_smi.fetch("550", cache)
                if options.allocator == "dra":  # `mokka dra-plugin` speaks the kubelet's plugin APIs
                    kubelet_api.generate(cache=cache)
                helm = gotool.build(tools.HELM, cache) / "helm" if options.allocator == "nvidia-dra" else None
            except (BuildError, gotool.BuildError, debcache.FetchError, kubelet_api.GenerateError) as exc:
                where = cache or debcache.default_cache()
                raise ClusterError(
                    f"binaries: {exc} (the first `up` builds and fetches them into {where} from the Go module proxy "
                    "and Debian's archive; later runs need no network)"
                ) from None
            except OSError as exc:
                raise ClusterError(f"binaries: {exc}") from None
            cni_bin = bins.cni
        staged = ", ".join(f"{n.name}: {p.gpu_count}x {p.gpu.name}" for n, p in zip(nodes, profs, strict=True))
        with self._step(progress, f"mock nodes staged ({staged})"):
            by_name = {n.name: prof for n, prof in zip(nodes, profs, strict=True)}
            self._each("mock node", lambda n: n.stage(by_name[n.name], smi))
        with self._step(progress, "network namespace (the pods' bridge, Services' rules) and the host's way in"):
            self._start_netns()
        with self._step(progress, "certificates and kubeconfigs"):
            pki = Pki(layout.pki)
            pki.generate([n.name for n in nodes], addresses=[layout.gateway])
            for name in ("admin", "controller-manager", "scheduler", "kube-proxy"):
                pki.kubeconfig(name, self.server, layout.kubeconfigs / f"{name}.conf")
            for n in nodes:
                pki.kubeconfig(f"kubelet-{n.name}", self.server, n.layout.kubeconfig)
                n.write_configs(runc, cni_bin)
        with self._step(progress, "private mount namespaces (control plane; each node's host paths, sysctls, GPUs)"):
            layout.ns.mkdir(parents=True, exist_ok=True)
            layout.hosts_file.write_text(config.hosts([n.name for n in nodes]))
            xtables = layout.ns / "xtables.lock"  # iptables' lock (kube-proxy): the cluster's own
            xtables.touch()
            binds = [[str(layout.hosts_file), "/etc/hosts"], [str(xtables), "/run/xtables.lock"]]
            self.state.namespace_inode = self.start_holder("namespace", {"binds": binds}, layout.ns, layout.logs)
            self.state.host_sysctls = {key: Path("/proc/sys", key).read_text().strip() for key in config.SYSCTLS}
            self._each("private mount namespace", lambda n: n.start_namespace(self.state.host_sysctls))
            self.save()
        with self._step(progress, f"etcd, kube-apiserver; containerd 2.1 on {len(nodes)} node(s)"):
            etcd = config.etcd_argv(bins.etcd, layout, self.ports)
            self.spawn_in(self.holder, "etcd", etcd, layout.logs / "etcd.log")
            apiserver = config.apiserver_argv(bins["kube-apiserver"], layout, self.ports)
            self.spawn_in(self.holder, "kube-apiserver", apiserver, layout.logs / "kube-apiserver.log")
            self._each("containerd", lambda n: n.start_containerd(ctrd))
            self._wait_each("containerd", lambda n: n.containerd_up())
            tarballs = images.build(layout.images, smi, cache)
            self._each("images", lambda n: [n.ctr("images", "import", str(t.absolute())) for t in tarballs])
            self.wait("kube-apiserver /readyz", self._apiserver_ready)
        # A device plugin or DRA driver allocates: the NRI plugin gives each container what it got.
        self.state.nri_external = options.allocator != "none" and options.nri_plugin
        if options.nri_plugin:
            with self._step(progress, f"NRI plugin (allocator {'external' if self.state.nri_external else 'nri'})"):
                self._each("NRI plugin", lambda n: n.start_nri(self.state.nri_external))
                self._wait_each("NRI plugin registered", lambda n: n.nri_registered(), timeout=30)
        ready_what = "node Ready" if len(nodes) == 1 else f"all {len(nodes)} nodes Ready"
        with self._step(progress, f"controller-manager, scheduler, kubelet: {ready_what}"):
            cm = config.controller_manager_argv(
                bins["kube-controller-manager"], layout, virtual_nodes=bool(options.virtual or options.fgo)
            )
            self.spawn_in(self.holder, "kube-controller-manager", cm, layout.logs / "kube-controller-manager.log")
            scheduler = config.scheduler_argv(bins["kube-scheduler"], layout)
            self.spawn_in(self.holder, "kube-scheduler", scheduler, layout.logs / "kube-scheduler.log")
            self._each("kubelet", lambda n: n.start_kubelet(bins["kubelet"]))
            self._wait_each("node Ready", lambda n: n.ready())
            self.wait("default service account", self._default_service_account)
        with self._step(progress, "Services and DNS: kube-proxy, CoreDNS (kube-system/kube-dns)"):
            proxy = config.kube_proxy_argv(bins["kube-proxy"], layout, nodes[0].name, 10256, 10249)
            self.spawn_in(self.holder, "kube-proxy", proxy, layout.logs / "kube-proxy.log", env=_SBIN)
            layout.corefile.write_text(config.corefile(layout))
            dns = [str(bins["coredns"]), "-conf", str(layout.corefile)]
            self.spawn_in(self.holder, "coredns", dns, layout.logs / "coredns.log")
            service, endpoints = config.dns_service(layout)
            self.post("/api/v1/namespaces/kube-system/services", service)
            self.post("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", endpoints)
        self.state.timings["node Ready"] = round(time.monotonic() - t_start, 2)
        if options.allocator == "device-plugin":
            with self._step(
                progress, f"NVIDIA device plugin {versions.DEVICE_PLUGIN} ({options.device_list_strategy})"
            ):
                self._each(
                    "device plugin",
                    lambda n: n.start_device_plugin(
                        bins["nvidia-device-plugin"], bins["nvidia-cdi-hook"], options.device_list_strategy,
                        options.mig_strategy,
                    ),
                )  # fmt: skip
                wants = {
                    n.name: gpustack.expected_allocatable(p, options.mig_strategy)
                    for n, p in zip(nodes, profs, strict=True)
                }
                self._wait_each(
                    "allocatable GPUs", lambda n: all(n.allocatable(k) == v for k, v in wants[n.name].items())
                )
        elif options.allocator == "dra":
            with self._step(progress, "DRA driver (mokka dra-plugin): a ResourceSlice per node"):
                self._each("DRA driver", lambda n: n.spawn("dra-driver", gpustack.dra_driver_argv(n.layout) or []))
                self._wait_each("the DRA driver's ResourceSlice", lambda n: n.slice_devices() == n.gpus)
        elif options.allocator == "nvidia-dra" and helm is not None:
            with self._step(
                progress, "NVIDIA's DRA driver: its chart, the kubelet plugins on every node, the controller"
            ):
                self._up_nvidia_dra(bins["nvidia-cdi-hook"], helm, profs, cache or debcache.default_cache())
        with self._step(progress, "GPU Feature Discovery (one-shot): node labels"):
            mig_strategy = options.mig_strategy
            self._each("GFD", lambda n: n.label(n.run_gfd(bins["gpu-feature-discovery"], mig_strategy)))
        if options.dcgm_exporter:
            with self._step(progress, "dcgm-exporter DaemonSet (NVIDIA's exporter on the mock libdcgm, --kubernetes)"):
                self._up_dcgm_exporter(cache)
        if options.virtual or options.fgo:
            self._up_virtual(options, bins, smi, progress)
        self.state.timings["up"] = round(time.monotonic() - t_start, 2)
        self.save()

    def _up_nvidia_dra(self, hook: Path, helm: Path, profs: list[profiles.Profile], cache: Path) -> None:
        """NFD's PCI labels on the nodes (its kubelet plugins' node affinity; Mokka's chart sets
        ``nvidia.com/gpu.present`` instead), then NVIDIA's driver."""
        for n, prof in zip(self.nodes, profs, strict=True):
            n.label(nvidia_dra.nfd_labels(prof))
        self.install_nvidia_dra(hook, helm, cache)

    def install_nvidia_dra(self, hook: Path, helm: Path, cache: Path) -> None:
        """NVIDIA's DRA driver on nodes staged at /var/lib/mokka (by ``up``, or by Mokka's chart):
        its image built and imported into every node, its chart rendered with
        :func:`nvidia_dra.values` and applied; returns when every node's GPUs and IMEX channels are
        in ResourceSlices and its pods are Ready. ``hook``: nvidia-cdi-hook; ``helm``: helm."""
        from concurrent.futures import ThreadPoolExecutor

        from .nvidia_dra import image

        try:
            brought = nvidia_dra.find(cache)
            values = self.layout.base / "nvidia-dra-values.yaml"
            manifests = nvidia_dra.render(helm, brought.chart, versions.KUBERNETES, values)
            tarball = image.build(self.layout.images, brought.programs, hook, brought.chart, cache)
        except (nvidia_dra.NvidiaDraUnavailable, image.ImageError) as exc:
            raise ClusterError(str(exc)) from None
        nodes = self.nodes
        with ThreadPoolExecutor(len(nodes)) as pool:  # each node's containerd unpacks it
            list(pool.map(lambda n: n.ctr("images", "import", str(tarball.absolute())), nodes))
        tarball.unlink()
        self.post("/api/v1/namespaces", nvidia_dra.namespace())
        self.kubectl("apply", "--server-side", "-f", "-", input=manifests)
        self._wait_each(
            "NVIDIA's GPU ResourceSlices", lambda n: n.slice_devices(nvidia_dra.GPU_DRIVER) >= n.gpus, timeout=120
        )
        self._wait_each(
            "NVIDIA's IMEX channel ResourceSlices", lambda n: n.slice_devices(nvidia_dra.COMPUTE_DOMAIN_DRIVER) > 0
        )
        self.wait("NVIDIA's DRA driver pods Ready (the controller, a kubelet plugin per node)", self._nvidia_dra_ready)

    def _nvidia_dra_ready(self) -> bool:
        pods = self.get(f"/api/v1/namespaces/{nvidia_dra.NAMESPACE}/pods").get("items", [])
        ready = [p for p in pods if nodewatch.ready(p)]
        components = [p["metadata"].get("labels", {}).get(nvidia_dra.COMPONENT) for p in ready]
        return components.count("kubelet-plugin") == len(self.nodes) and "controller" in components

    def _up_dcgm_exporter(self, cache: Path | None) -> None:
        from . import dcgm

        try:
            tarball = dcgm.build_image(self.layout.images, cache or debcache.default_cache())
        except dcgm.ExporterUnavailable as exc:
            raise ClusterError(f"--dcgm-exporter: {exc}") from None
        self._each("dcgm-exporter image", lambda n: n.ctr("images", "import", str(tarball.absolute())))
        self.post("/api/v1/namespaces", dcgm.namespace())
        self.post(f"/apis/apps/v1/namespaces/{dcgm.NAMESPACE}/daemonsets", dcgm.daemonset())
        self.wait("dcgm-exporter pods Ready on every node", lambda: len(self.dcgm_exporter_pods()) == len(self.nodes))

    def dcgm_exporter_pods(self) -> dict[str, str]:
        """The Ready dcgm-exporter pods, by node name."""
        from . import dcgm

        pods = self.get(f"/api/v1/namespaces/{dcgm.NAMESPACE}/pods?labelSelector=app.kubernetes.io/name={dcgm.NAME}")
        ready = {}
        for pod in pods.get("items", []):
            if nodewatch.ready(pod):
                ready[pod["spec"]["nodeName"]] = pod["metadata"]["name"]
        return ready

    def dcgm_metrics(self, node: str | None = None) -> str:
        """The /metrics of the dcgm-exporter on ``node`` (the first node by default)."""
        from . import dcgm

        pod = self.dcgm_exporter_pods().get(node or self.nodes[0].name)
        if pod is None:
            raise ClusterError(f"no Ready dcgm-exporter pod on {node or self.nodes[0].name}")
        return self.get_text(dcgm.metrics_path(pod), timeout=10)

    def _up_virtual(self, options: Options, bins: binaries.Binaries, smi: Path, progress: Progress) -> None:
        """The virtual pools: each computed from its staged profile, then KWOK and the nodes."""
        specs = options.virtual
        pools: list[Pool] = []
        if specs:
            with self._step(progress, f"virtual pools computed ({', '.join(map(str, specs))}): GFD's labels, GPUs"):
                gfd = bins["gpu-feature-discovery"]
                pools = [virtualpools.build(self, s, gfd, smi, options.mig_strategy) for s in specs]
                self.state.virtual = [p.to_json() for p in pools]
                self.save()
        total = sum(p.count for p in pools)
        with self._step(progress, f"KWOK {versions.KWOK}: {total} virtual node(s) Ready with their GPUs"):
            config.write_kwok_configuration(self.layout)
            argv = config.kwok_argv(bins.kwok, self.layout, binaries.KWOK_STAGES)
            self.spawn_in(self.holder, "kwok", argv, self.layout.logs / "kwok.log")
            t0 = time.monotonic()
            with _api_errors("virtual nodes"):
                virtualpools.create(self, pools, dra=options.allocator == "dra")
            self.state.timings["virtual nodes created"] = round(time.monotonic() - t0, 2)
            watch = virtualpools.watch(self, pools)
            self.wait(f"{total} virtual nodes Ready", watch.poll, timeout=max(READY_TIMEOUT, total * 0.1))
        if options.fgo:
            fgo_total = sum(f.count for f in options.fgo)
            with self._step(
                progress, f"fake-gpu-operator: {fgo_total} node(s) in pool(s) {', '.join(map(str, options.fgo))}"
            ):
                bindir = fgo.find_binaries(options.cache or debcache.default_cache())
                self.state.fgo = [str(f) for f in options.fgo]
                self.save()
                with _api_errors("fake-gpu-operator"):
                    fgo.up(self, list(options.fgo), bindir, options.mig_strategy)

                watch = fgo.watch(self, list(options.fgo))
                self.wait(
                    f"{fgo_total} FGO nodes Ready with GPUs", watch.poll, timeout=max(READY_TIMEOUT, fgo_total * 0.1)
                )

    def relabel(self) -> dict[str, dict[str, str]]:
        """GFD one-shot again on every node, its labels applied (what GFD's daemon does every
        minute); each node's labels."""
        bins = binaries.cached(self._cache)
        if bins is None:
            raise ClusterError("GFD is not in the cache (mokka cluster up builds it)")
        out = {}
        for n in self.nodes:
            labels = self.run_gfd(bins["gpu-feature-discovery"], n.name)
            n.label(labels)
            out[n.name] = labels
        return out

    def run_gfd(self, binary: Path, node: str | None = None) -> dict[str, str]:
        """GFD one-shot on node ``node`` (default: the first); its labels (applied by the caller)."""
        return self.node(node).run_gfd(binary, str(self.state.options.get("mig_strategy", "none")))

    def _start_netns(self) -> None:
        """The cluster's network namespace (:mod:`.netns`), and the forwarder that lets the host reach
        the API server and the NRI plugins' health ports in it (:mod:`.forward`)."""
        layout = self.layout
        layout.ns.mkdir(parents=True, exist_ok=True)
        ready = layout.ns / "netns-ready"
        prefix = layout.pod_subnet.split("/")[1]
        ports = sorted({*self.state.ports.values(), *(p for n in self.nodes for p in n.record["ports"].values())})
        argv = ["unshare", "--net", "--", sys.executable, "-m", netns.__name__, layout.bridge, prefix, str(ready)]
        argv += [",".join(map(str, ports)), layout.gateway, *(n.layout.node_ip for n in self.nodes)]
        holder = process.spawn("netns", argv, layout.logs / "netns.log", holder=None)
        self.state.procs.append(asdict(holder))
        self.save()
        self.wait("network namespace", ready.exists, timeout=30)
        ports = [self.ports.apiserver, *(n.ports.nri_health for n in self.nodes)]
        argv = [sys.executable, "-m", forward.__name__, f"/proc/{holder.pid}/ns/net", *map(str, ports)]
        fwd = process.spawn("forward", argv, layout.logs / "forward.log", holder=None)
        self.state.procs.append(asdict(fwd))
        self.save()
        self.wait("the host's forwarder", lambda: "forwarding" in Path(fwd.log).read_text(), timeout=30)

    def _apiserver_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.server + "/readyz", context=self.ssl_context(), timeout=2) as res:
                return bool(res.status == 200)
        except OSError:
            return False

    def _default_service_account(self) -> bool:
        try:
            self.get("/api/v1/namespaces/default/serviceaccounts/default")
            self.get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
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
        # Every node first (plugins, kubelet, pods, containerd and its shims), then the control plane.
        for n in self.nodes:
            problems += n.stop()
        for name in CONTROL_PLANE:
            if name in FGO_PROCESSES:  # FGO's status exporter takes ~20 s per 1000 nodes to stop
                if (p := self.proc(name)) is not None and p.stop(timeout=30):
                    progress(f"{name} killed: not stopped 30 s after SIGTERM")
            elif (p := self.proc(name)) is not None and p.stop():
                problems.append(f"{name} ignored SIGTERM")
        for name in ("namespace", "forward", "netns"):  # the network namespace goes with its last process
            if (p := self.proc(name)) is not None:
                p.stop()
        # Whatever names the cluster's directory (a shim's -address, when a namespace was gone).
        problems += process.kill_naming(str(layout.base) + "/")
        for i in range(len(self.state.nodes)):
            problems += cgroups.remove(f"{layout.cgroup_prefix}-{i}")
        if Path(f"/sys/class/net/{layout.bridge}").exists():
            res = subprocess.run(["ip", "link", "delete", layout.bridge], capture_output=True, text=True, check=False)
            if res.returncode != 0:
                problems.append(f"cannot delete bridge {layout.bridge}: {res.stderr.strip()}")
        if not problems:
            shutil.rmtree(layout.base, ignore_errors=True)
            if layout.base.exists():
                problems.append(f"cannot remove {layout.base}")
        progress("cluster down" + (f" with problems: {'; '.join(problems)}" if problems else ""))
        return problems


@contextlib.contextmanager
def _api_errors(what: str) -> Iterator[None]:
    """The ``kubernetes`` client's errors (a refused call, a lost connection) as one ClusterError line."""
    from k8snode.dra.cluster import api_reason

    try:
        yield
    except ClusterError:
        raise
    except Exception as exc:
        raise ClusterError(f"{what}: {api_reason(exc)}") from None


FGO_PROCESSES = tuple(f"fgo-{name}" for name in fgo.BINARIES)
CONTROL_PLANE = (
    *FGO_PROCESSES,
    "kwok",
    "coredns",
    "kube-proxy",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)
_SBIN = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # kube-proxy runs iptables


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
    for i in range(config.MAX_NODES):
        found += [f"cgroup {d}" for d in cgroups.existing(f"{layout.cgroup_prefix}-{i}")]
    if Path(f"/sys/class/net/{layout.bridge}").exists():
        found.append(f"network interface {layout.bridge}")
    if layout.base.exists():
        found.append(f"directory {layout.base}")
    return found
