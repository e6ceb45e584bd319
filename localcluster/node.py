"""One real node of the local cluster: a complete mock GPU node of its own.

Each node has its staged mock node (driver root, ``/dev``, ``/proc/driver/nvidia``, PCI sysfs),
its private mount namespace (kubelet's and containerd's fixed host paths, its sysctls, its GPUs
at the real ``/sys`` paths: nothing of another node is visible there), its containerd 2.1 (CRI,
CDI and NRI on), kubelet, NRI plugin, and NVIDIA's device plugin and GFD (or the DRA driver).
Its processes are named ``<process>@<node>`` in the cluster's state, its logs are under
``logs/<node>/``. The cluster (:mod:`.cluster`) runs the control plane and brings its nodes up
step by step, every node at each step, so that the nodes' waits overlap. A node reaches the rest
of the cluster through the :class:`~.context.Context` it is given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fetch import containerd_dist
from fetch.kube import versions
from gpumodel import profile as profiles
from k8snode import gfd

from . import cgroups, config, gpustack, process, supervise
from .errors import ClusterError
from .layout import MOKKA_ROOT, PRIVATE_PATHS, NodeLayout, NodePorts
from .nodewatch import ready
from .processes import Processes

if TYPE_CHECKING:
    from .context import Context

__all__ = ["Node", "new_record", "run_gfd"]


class Node:
    """Node ``index`` of the cluster of ``ctx``, as its state records it (``ctx.state.nodes[index]``)."""

    def __init__(self, ctx: Context, index: int) -> None:
        self.ctx = ctx
        self.index = index

    @property
    def record(self) -> dict[str, Any]:
        return self.ctx.state.nodes[self.index]

    @property
    def name(self) -> str:
        return str(self.record["name"])

    @property
    def layout(self) -> NodeLayout:
        return self.ctx.layout.node(self.name, self.index)

    @property
    def ports(self) -> NodePorts:
        return NodePorts(**self.record["ports"])

    @property
    def gpus(self) -> int:
        return int(self.record["gpus"])

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.record.get('profile')}, {self.gpus} GPUs)"

    # ------------------------------------------------------------------ processes

    def proc_name(self, name: str) -> str:
        return f"{name}@{self.name}"

    def proc(self, name: str) -> process.Proc | None:
        return self.ctx.processes.get(self.proc_name(name))

    @property
    def holder(self) -> int | None:
        p = self.proc("namespace")
        return p.pid if p and p.alive() else None

    def run(self, argv: Sequence[str], **kw: Any) -> Any:
        """Run ``argv`` inside this node's mount namespace (where its kubelet's sockets are)."""
        return self.ctx.processes.run(self.holder, argv, **kw)

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> process.Proc:
        """A long-running process in this node's namespace, stopped by ``down``."""
        return self.ctx.processes.spawn(self.holder, self.proc_name(name), argv, self.layout.logs / f"{name}.log", env)

    def stop_process(self, name: str) -> None:
        self.ctx.processes.stop(self.proc_name(name))

    # ------------------------------------------------------------------ facts

    def api_node(self) -> dict[str, Any] | None:
        """The Node object as the API server has it (None while it is unreachable or absent)."""
        try:
            return self.ctx.apiserver.get(f"/api/v1/nodes/{self.name}")
        except ClusterError:
            return None

    def ready(self) -> bool:
        return ready(self.api_node() or {})

    def allocatable(self, resource: str = "nvidia.com/gpu") -> int:
        return int((self.api_node() or {}).get("status", {}).get("allocatable", {}).get(resource, "0"))

    def slice_devices(self, driver: str | None = None) -> int:
        """Devices this node's ResourceSlices publish (of one driver when given; 0 while none, or the
        API is unreachable)."""
        try:
            found = self.ctx.apiserver.get(
                f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={self.name}"
            )
        except ClusterError:
            return 0
        items = [i for i in found.get("items", []) if driver is None or i.get("spec", {}).get("driver") == driver]
        return sum(len(item.get("spec", {}).get("devices", [])) for item in items)

    def labels(self) -> dict[str, str]:
        """The node's labels as the API server has them (none while it is unreachable)."""
        return dict((self.api_node() or {}).get("metadata", {}).get("labels") or {})

    def label(self, labels: Mapping[str, str]) -> None:
        self.ctx.apiserver.patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": dict(labels)}})

    # ------------------------------------------------------------------ up, step by step

    def stage(self, prof: profiles.Profile, nvidia_smi: Path) -> None:
        gpustack.stage_node(self.layout, prof, nvidia_smi)

    def write_configs(self, runc: Path, cni_bin: Path) -> None:
        config.write_kubelet_config(self.layout, self.ports)
        config.write_containerd_config(self.layout, runc, cni_bin)
        config.write_cni_config(self.layout)

    def start_namespace(self, host_sysctls: dict[str, str]) -> None:
        """The node's private mount namespace: its directories over kubelet's and containerd's host
        paths, private sysctl files, its GPUs' sysfs at the real /sys paths. With NVIDIA's DRA driver
        or the GPU Operator the staged node is at /var/lib/mokka, where Mokka's chart stages it, so
        that NVIDIA's charts take the values they take on a real cluster. Every mount of the
        namespace is shared (with its own peers, never the host's), as systemd makes a host's:
        pods may mount the kubelet's directory, /var/lib/mokka or / itself Bidirectional or
        HostToContainer (NVIDIA's kubelet plugins and the GPU Operator's validator do), which
        containerd allows from shared mounts only."""
        layout = self.layout
        staged_at_root = self.ctx.options.get("allocator") == "nvidia-dra" or bool(self.ctx.options.get("gpu_operator"))
        binds: list[list[str]] = []
        for host in PRIVATE_PATHS:
            d = layout.node_root if staged_at_root and host == MOKKA_ROOT else layout.private(host)
            d.mkdir(parents=True, exist_ok=True)
            binds.append([str(d), host])
        sysctl_dir = layout.ns / "sysctl"
        sysctl_dir.mkdir(parents=True, exist_ok=True)
        for key in config.SYSCTLS:
            f = sysctl_dir / key.replace("/", ".")
            f.write_text(host_sysctls[key] + "\n")
            binds.append([str(f), f"/proc/sys/{key}"])
        sys_binds, links = gpustack.namespace_entries(layout)
        view = {"binds": binds + sys_binds, "links": links, "shared": ["/"]}
        self.record["namespace_inode"] = self.ctx.processes.start_holder(
            self.proc_name("namespace"), view, layout.ns, layout.logs
        )

    def start_containerd(self, ctrd: Path) -> None:
        """containerd under :mod:`.supervise` (started again when it exits, as systemd does on a
        node: NVIDIA's toolkit operand restarts it with SIGHUP), with the node's driver footprint
        shown to the C programs it runs (:func:`gpustack.runtime_env`: NVIDIA's runtime wrappers
        look for the nvidia module in /proc/modules)."""
        containerd = [str(ctrd / "containerd"), "--config", str(self.layout.containerd_config)]
        env = {"PATH": f"{ctrd}:{os.environ.get('PATH', '/usr/bin:/bin')}", **gpustack.runtime_env(self.layout)}
        self.spawn("containerd", [sys.executable, "-m", supervise.__name__, *containerd], env=env)

    def containerd_up(self) -> bool:
        return self.layout.containerd_socket.exists() and self.ctr("version", check=False).returncode == 0

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr`` on this node's containerd (namespace k8s.io)."""
        bindir = containerd_dist.fetch(versions.CONTAINERD, self.ctx.cache)
        argv = [str(bindir / "ctr"), "-a", str(self.layout.containerd_socket), "-n", "k8s.io", *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and res.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res

    def start_nri(self, external: bool) -> None:
        self.spawn("nri-plugin", gpustack.nri_plugin_argv(self.layout, self.ports.nri_health, external))

    def nri_registered(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.ports.nri_health}/healthz"
            with urllib.request.urlopen(url, timeout=1) as res:
                return int(json.loads(res.read()).get("registrations", 0)) > 0
        except (OSError, ValueError):
            return False

    def start_kubelet(self, kubelet: Path) -> None:
        cgroups.create(self.layout.cgroup_root)
        self.spawn("kubelet", config.kubelet_argv(kubelet, self.layout))

    def start_device_plugin(self, binary: Path, hook: Path, strategy: str, mig_strategy: str) -> None:
        argv = gpustack.device_plugin_argv(binary, self.layout, strategy, hook, mig_strategy)
        self.spawn("nvidia-device-plugin", argv, env=gpustack.nvml_env(self.layout))

    def run_gfd(self, binary: Path, mig_strategy: str) -> dict[str, str]:
        """GFD one-shot in the node's namespace; its labels (applied by the caller: NFD's job)."""
        return run_gfd(self.ctx.processes, self.holder, self.layout, binary, mig_strategy)

    # ------------------------------------------------------------------ down

    def stop(self) -> list[str]:
        """Stop this node: its plugins, kubelet, pods (its cgroups), containerd and shims, and
        the processes left in its namespace; returns the problems."""
        problems: list[str] = []
        holder = self.proc("namespace")
        # Hold the namespace open: while this descriptor lives, its inode is not handed to a new
        # namespace, so "every process in it" never names another one's (nsfs reuses numbers).
        ns_fd = os.open(f"/proc/{holder.pid}/ns/mnt", os.O_RDONLY) if holder and holder.alive() else None
        mine = [p.name for p in self.ctx.processes.all() if p.name.endswith(f"@{self.name}")]
        last = {self.proc_name(n) for n in ("kubelet", "containerd", "namespace")}
        for name in [n for n in mine if n not in last] + [self.proc_name("kubelet")]:
            if (p := self.ctx.processes.get(name)) is not None and p.stop():
                problems.append(f"{name} ignored SIGTERM")
        problems += cgroups.remove(self.layout.cgroup_root)
        if (p := self.proc("containerd")) is not None and p.stop():
            problems.append(f"{self.proc_name('containerd')} ignored SIGTERM")
        if holder is not None:
            holder.stop()
        if ns_fd is not None:  # shims, and what they fork while dying (runc), until none is left
            try:
                problems += process.kill_mount_namespace(os.fstat(ns_fd).st_ino)
            finally:
                os.close(ns_fd)
        problems += process.kill_naming(str(self.layout.base) + "/")
        problems += cgroups.remove(self.layout.cgroup_root)
        problems += gpustack.unstage_node(self.layout)
        return problems


def run_gfd(
    processes: Processes, holder: int | None, layout: NodeLayout, binary: Path, mig_strategy: str
) -> dict[str, str]:
    """GFD one-shot on the mock node of ``layout`` in the mount namespace of ``holder``; its labels
    (its output in ``logs/<node>/gfd.log``)."""
    layout.gfd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **gpustack.nvml_env(layout)}
    res = processes.run(holder, gpustack.gfd_argv(binary, layout, mig_strategy), timeout=120, env=env)
    layout.logs.mkdir(parents=True, exist_ok=True)
    (layout.logs / "gfd.log").write_text(res.stdout + res.stderr)
    out = layout.gfd / "labels"
    if res.returncode != 0 or not out.exists():
        raise ClusterError(f"node {layout.name}: gpu-feature-discovery exited {res.returncode}: {res.stderr[-1500:]}")
    return gfd.parse_labels(out.read_text())


def new_record(name: str, prof: profiles.Profile, spec: str, rack: str | None, ports: NodePorts) -> dict[str, Any]:
    """What the cluster's state keeps of a node."""
    return {
        "name": name,
        "profile": prof.name,
        "spec": spec,
        "product": prof.gpu.name,
        "gpus": prof.gpu_count,
        "rack": rack,
        "ports": asdict(ports),
        "namespace_inode": 0,
    }
