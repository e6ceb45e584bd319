"""Where everything of one local cluster lives, and its loopback ports: the cluster-wide paths and
names under its ``--dir`` (:class:`Layout`) and each node's (:class:`NodeLayout`). Pure values."""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from hostsetup.node import DEFAULT_ROOT

__all__ = ["ADDRESSES_PER_NODE", "MAX_NODES", "MOKKA_ROOT", "Layout", "NodeLayout", "NodePorts", "Ports", "free_port"]

MOKKA_ROOT = str(DEFAULT_ROOT)  # host setup's default root, where Mokka's chart stages a node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one cluster's control plane, chosen free at ``up`` so clusters can coexist."""

    etcd_client: int
    etcd_peer: int
    apiserver: int

    @classmethod
    def choose(cls, taken: set[int] | None = None) -> Ports:
        return cls(*_free_ports(3, taken))


@dataclass(frozen=True)
class NodePorts:
    """Loopback ports of one node: its kubelet's API and health, its NRI plugin's health."""

    kubelet: int
    kubelet_healthz: int
    nri_health: int

    @classmethod
    def choose(cls, taken: set[int] | None = None) -> NodePorts:
        return cls(*_free_ports(3, taken))


def _free_ports(count: int, taken: set[int] | None) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        port = free_port()
        if port not in (taken or set()):
            ports.add(port)
    if taken is not None:
        taken |= ports
    return sorted(ports)


# How many real nodes one cluster holds: the pods' /24 is split into this many address ranges.
MAX_NODES = 8
ADDRESSES_PER_NODE = 30


@dataclass(frozen=True)
class Layout:
    """Every cluster-wide path and name of one cluster under ``base`` (its ``--dir``); each node's
    are its :class:`NodeLayout` (:meth:`node`)."""

    base: Path

    @property
    def tag(self) -> str:
        """A short id of this cluster (cgroup, bridge and subnet names derive from it)."""
        return hashlib.sha256(str(self.base).encode()).hexdigest()[:8]

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    @property
    def kubeconfigs(self) -> Path:
        return self.base / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.base / "etcd"

    @property
    def ns(self) -> Path:
        """The control plane's mount namespace: its hosts file (every node name is loopback)."""
        return self.base / "ns"

    @property
    def hosts_file(self) -> Path:
        return self.ns / "hosts"

    @property
    def state_file(self) -> Path:
        """What `down` and `status` read: pids, ports, nodes."""
        return self.base / "cluster.json"

    @property
    def images(self) -> Path:
        return self.base / "images"

    @property
    def ib_relay(self) -> Path:
        """The InfiniBand subnet's relay directory, which every node's ``node/ib-relay`` links to: a
        process serving a MAD class (``ibping -S``) on one node is reached from the others there."""
        return self.base / "ib-relay"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfigs / "admin.conf"

    @property
    def cgroup_prefix(self) -> str:
        return f"/mokka-kube-{self.tag}"

    @property
    def bridge(self) -> str:
        """The pods' bridge, shared by every node: pods of different nodes meet on it (one subnet)."""
        return f"mokka{self.tag[:6]}"

    @property
    def pod_subnet(self) -> str:
        return f"10.{200 + int(self.tag[:2], 16) % 50}.{int(self.tag[2:4], 16)}.0/24"

    @property
    def gateway(self) -> str:
        """The bridge's address in the cluster's network namespace: the pods' gateway, where the API
        server and the cluster DNS are reached from pods."""
        return str(ipaddress.ip_network(self.pod_subnet)[1])

    @property
    def corefile(self) -> Path:
        return self.base / "Corefile"

    def node(self, name: str, index: int) -> NodeLayout:
        return NodeLayout(self, name, index)


# Host paths kubelet, containerd and the plugins use, each backed by a private directory of the
# node (relative to its base; NodeLayout.private), bound over the host path in its namespace.
PRIVATE_PATHS = {
    "/var/lib/kubelet": "ns/kubelet",
    "/var/log/pods": "ns/pods-logs",
    "/var/log/containers": "ns/containers-logs",
    "/run/containerd": "run",  # the socket's directory: short, a unix socket path holds 108 bytes
    "/etc/containerd": "ns/etc-containerd",  # the config (NVIDIA's toolkit edits it)
    "/var/lib/cni": "ns/cni-state",
    "/etc/cdi": "ns/etc-cdi",
    "/var/run/cdi": "ns/run-cdi",
    "/var/run/nri": "ns/run-nri",
    "/etc/kubernetes": "ns/etc-kubernetes",
    # What the chart's DaemonSet stages through hostPath (its default root, GPU Operator's link):
    # each node's own.
    "/var/lib/mokka": "ns/mokka-root",
    "/run/nvidia": "ns/run-nvidia",
    # What NVIDIA's container toolkit operand installs on a node: its programs, and the CRI-O hook
    # directory its DaemonSet mounts (created by containerd when missing).
    "/usr/local/nvidia": "ns/usr-local-nvidia",
    "/run/containers": "ns/run-containers",
    # run:ai fake-gpu-operator's hostPaths: its device plugin's /var/lib/runai, and the driver root
    # its mock backend's DaemonSet stages (FGO's nvml-mock contract).
    "/var/lib/runai": "ns/runai",
    "/var/lib/nvml-mock": "ns/nvml-mock",
}


@dataclass(frozen=True)
class NodeLayout:
    """Every path and name of node ``name`` (the ``index``-th) of the cluster ``cluster``."""

    cluster: Layout
    name: str
    index: int

    @property
    def base(self) -> Path:
        return self.cluster.base / "nodes" / self.name

    @property
    def containerd(self) -> Path:
        return self.base / "containerd"

    @property
    def cni(self) -> Path:
        return self.base / "cni"

    @property
    def node_root(self) -> Path:
        """`mokka host setup --root`: the staged mock node."""
        return self.base / "node"

    @property
    def driver_root(self) -> Path:
        """The driver root NVIDIA's tools are pointed at: the staged node's ``driver`` (``usr``,
        ``dev``, ``proc``), as a driver container's root."""
        return self.node_root / "driver"

    @property
    def ns(self) -> Path:
        """Private directories bound over host paths in the node's mount namespace."""
        return self.base / "ns"

    @property
    def gfd(self) -> Path:
        return self.base / "gfd"

    @property
    def logs(self) -> Path:
        return self.cluster.logs / self.name

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        """The kubelet's credentials (user ``system:node:<name>``)."""
        return self.cluster.kubeconfigs / f"kubelet-{self.name}.conf"

    def private(self, host: str) -> Path:
        """The node's directory its namespace binds over ``host`` (one of :data:`PRIVATE_PATHS`)."""
        return self.base / PRIVATE_PATHS[host]

    @property
    def containerd_socket(self) -> Path:
        """The node's /run/containerd/containerd.sock, where NVIDIA's toolkit finds it."""
        return self.private("/run/containerd") / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        """The node's /etc/containerd/config.toml, which NVIDIA's toolkit edits."""
        return self.private("/etc/containerd") / "config.toml"

    @property
    def cgroup_root(self) -> str:
        return f"{self.cluster.cgroup_prefix}-{self.index}"

    @property
    def node_ip(self) -> str:
        """The node's address on the pods' bridge (kubelet needs one that is not loopback), above
        every node's pod range."""
        return str(ipaddress.ip_network(self.cluster.pod_subnet)[254 - self.index])

    @property
    def pod_range(self) -> tuple[str, str]:
        """This node's addresses in the cluster's pod subnet (every node's pods share it)."""
        net = ipaddress.ip_network(self.cluster.pod_subnet)
        first = 2 + self.index * ADDRESSES_PER_NODE
        return str(net[first]), str(net[first + ADDRESSES_PER_NODE - 1])
