"""Virtual GPU nodes: Node objects that KWOK keeps alive against the cluster's API server, each
carrying what a real Mokka node of its profile shows the API — without a kubelet or a process of
its own.

A *pool* is COUNT such nodes of one profile, ``virtual-<pool>-<i>`` (``mokka cluster up --virtual
PROFILE[:GPUS]=COUNT`` makes them). What each carries is its pool's template
(:mod:`virtualfleet.template`), computed once by the code and the programs that model a real node:
NVIDIA's GFD on the profile staged as a mock node, the device plugin's resources
(:mod:`k8snode.deviceplugin`), the DRA devices read through NVML as the project's DRA plugin reads
them. Every node of the pool then gets

- GFD's labels (``nvidia.com/gpu.clique`` with its own rack's cluster UUID where the board is
  built into racks), ``type=kwok``, ``mokka.io/virtual=true`` and ``mokka.io/virtual-pool``: the
  chart's DaemonSet (a kubelet's) keeps off them; KWOK manages nodes annotated
  ``kwok.x-k8s.io/node=fake`` only, so it never touches a real kubelet's node;
- ``nvidia.com/gpu`` (and MIG resources) as capacity and allocatable with ``--allocator
  device-plugin``, or a ResourceSlice of driver ``gpu.nvidia.com`` with the DRA plugin's devices
  (its own GPU UUIDs) with ``--allocator dra``, and one of driver ``nic.mokka.io`` with its
  InfiniBand adapters (its own GUIDs) where the profile has any;
- faults as a real node's watchers show them (:class:`virtualfleet.faults.Health`): an unhealthy
  GPU leaves allocatable (capacity stays) or the ResourceSlice, the ``AcceleratedHardwareReady``
  condition says what a node health agent finds, a fabric probe In Progress on every GPU takes the
  clique label away.

KWOK's stages make the nodes Ready (with leases) and every pod bound to them Running; the
scheduler accounts their GPUs as on a real node.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpumodel import fleet
from gpumodel import profile as profiles

from .faults import Health

__all__ = [
    "KWOK_ANNOTATION",
    "POOL_LABEL",
    "RACK_LABEL",
    "UNHEALTHY_ANNOTATION",
    "VIRTUAL_LABEL",
    "Pool",
    "VirtualSpec",
    "kept_by_kwok",
    "node_body",
    "ready",
    "real_nodes_affinity",
    "shows",
    "split",
]

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
VIRTUAL_LABEL = "mokka.io/virtual"
POOL_LABEL = "mokka.io/virtual-pool"
RACK_LABEL = "mokka.io/rack"  # a racked node's rack: the key of the rack's fault entry
# On a node with faults: its unhealthy GPUs and why ({"3": "Xid 79"}), as the node was made.
UNHEALTHY_ANNOTATION = "mokka.io/unhealthy-gpus"
MAX_VIRTUAL = 10000  # nodes over every pool of one cluster
CLIQUE_LABEL = "nvidia.com/gpu.clique"
# What a virtual node has besides its GPUs (KWOK's own default node size; the kubelet's pod limit).
NODE_RESOURCES = {"cpu": "1k", "memory": "1Ti", "pods": "110"}

Json = dict[str, Any]


@dataclass(frozen=True)
class VirtualSpec:
    """``PROFILE[:GPUS]=COUNT``: COUNT virtual nodes of a profile."""

    profile: str
    gpus: int | None
    count: int

    @classmethod
    def parse(cls, text: str) -> VirtualSpec:
        """A ValueError names what is wrong."""
        head, sep, count = text.rpartition("=")
        if not sep or not head:
            raise ValueError(f"{text!r}: expected PROFILE[:GPUS]=COUNT, e.g. h100=1000 or t4:4=200")
        if not count.isdigit():
            raise ValueError(f"{text!r}: the node count after '=' must be a whole number from 0")
        name, colon, gpus = head.partition(":")
        if not name:
            raise ValueError(f"{text!r}: no profile before '='")
        if colon and (not gpus.isdigit() or int(gpus) < 1):
            raise ValueError(f"{text!r}: the GPU count after ':' must be a whole number from 1")
        return cls(name, int(gpus) if colon else None, int(count))

    @property
    def pool(self) -> str:
        stem = Path(self.profile).stem if self.profile.endswith((".yaml", ".yml")) else self.profile
        label = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:30] or "pool"
        return label + (f"-{self.gpus}" if self.gpus else "")

    def __str__(self) -> str:
        return f"{self.profile}{f':{self.gpus}' if self.gpus else ''}={self.count}"


@dataclass
class Pool:
    """One pool as the cluster's state keeps it: what every node of it carries (computed once)."""

    name: str
    spec: str
    profile: str  # the profile's name
    product: str
    gpus: int
    count: int
    labels: dict[str, str]  # GFD's on the staged profile
    per_gpu: list[dict[str, int]]  # the device plugin's resources, GPU by GPU
    devices: list[Json]  # the DRA plugin's ResourceSlice devices of the staged profile
    nic_devices: list[Json] = field(default_factory=list)  # its InfiniBand adapters' (driver nic.mokka.io)
    racked: bool = False  # the board is built into racks: each node's clique is its rack's
    health: dict[str, Health] = field(default_factory=dict)  # node -> what its faults show (none: healthy)
    rack_gpus: int = fleet.NVL_DOMAIN_GPUS  # GPUs in one NVLink domain (rack), where racked
    taints: list[Json] = field(default_factory=list)  # on every node
    owner: Json | None = None  # the ownerReference every node carries (a VirtualGPUPool's)
    dra: bool = False  # the GPUs are a ResourceSlice's devices (a DRA driver's), not node resources

    @property
    def nodes(self) -> list[str]:
        return self.node_names(self.name, self.count)

    @staticmethod
    def node_names(pool: str, count: int) -> list[str]:
        return [f"virtual-{pool}-{i}" for i in range(count)]

    def rack(self, i: int) -> str | None:
        per_rack = max(1, self.rack_gpus // self.gpus)
        return f"virtual-{self.name}-nvl{self.rack_gpus}-{i // per_rack}" if self.racked else None

    def health_of(self, node: str) -> Health:
        return self.health.get(node) or Health()

    def healthy(self, node: str) -> list[int]:
        bad = self.health_of(node).unhealthy
        return [i for i in range(self.gpus) if str(i) not in bad]

    def resources(self, node: str, allocatable: bool) -> dict[str, str]:
        """The node's GPU resources: capacity (every GPU) or allocatable (healthy GPUs only); none
        where a DRA driver publishes the GPUs (a real node with only the DRA driver has none)."""
        if self.dra:
            return {}
        out: dict[str, int] = {}
        gpus = self.healthy(node) if allocatable else range(self.gpus)
        for i in gpus:
            for name, n in self.per_gpu[i].items():
                out[name] = out.get(name, 0) + n
        for name in {k for r in self.per_gpu for k in r}:
            out.setdefault(name, 0)
        return {k: str(v) for k, v in sorted(out.items())}

    def node_labels(self, i: int, node: str | None = None) -> dict[str, str]:
        """Place ``i``'s labels: the template's with its rack's clique (none while no GPU of
        ``node``'s has a fabric probe Completed, as GFD gives none) and the rack's name."""
        labels = dict(self.labels)
        rack = self.rack(i)
        if rack:
            labels[RACK_LABEL] = rack
        if rack and CLIQUE_LABEL in labels:
            clique = labels[CLIQUE_LABEL].rsplit(".", 1)[-1]
            labels[CLIQUE_LABEL] = f"{fleet.rack_cluster_uuid(rack)}.{clique}"
        if CLIQUE_LABEL in labels and not self.health_of(node or f"virtual-{self.name}-{i}").clique(self.gpus):
            del labels[CLIQUE_LABEL]
        return labels

    def owns(self, node: str) -> bool:
        return self.named(self.name, node)

    @staticmethod
    def named(pool: str, node: str) -> bool:
        """Whether ``node`` is one of the names pool ``pool`` makes (``virtual-<pool>-<i>``), not a
        node someone else made and labelled with the pool."""
        head, _, index = node.rpartition("-")
        return head == f"virtual-{pool}" and index.isdigit()

    def slice_devices(self, node: str) -> list[Json]:
        """The DRA devices of ``node``: the pool's, with this node's own GPU UUIDs, healthy ones only."""
        out = []
        for i in self.healthy(node):
            dev = json.loads(json.dumps(self.devices[i]))
            dev["attributes"]["uuid"] = {"string": fleet.gpu_identity(self.profile, node, i)[0]}
            out.append(dev)
        return out

    def nic_slice_devices(self, node: str) -> list[Json]:
        """The adapters of ``node`` as DRA devices: the pool's, with this node's own GUIDs (derived
        from the node's name as on a fleet node, :func:`gpumodel.fleet.adapter_guid`)."""
        out = []
        for n, template in enumerate(self.nic_devices):
            dev = json.loads(json.dumps(template))
            guid = fleet.adapter_guid(self.profile, node, n)
            dev["attributes"]["nodeGUID"] = {"string": profiles.format_guid(guid)}
            out.append(dev)
        return out

    def to_json(self) -> Json:
        return asdict(self)


def node_body(pool: Pool, i: int, name: str | None = None) -> Json:
    """Node ``i`` of ``pool`` as it is created (KWOK keeps its status from then on); ``name``: a
    node someone else made that the pool decorates at place ``i`` (its rack)."""
    name = name or pool.nodes[i]
    labels = {
        **pool.node_labels(i, name),
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        VIRTUAL_LABEL: "true",
        POOL_LABEL: pool.name,
    }
    metadata: Json = {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}}
    health = pool.health_of(name)
    if health.unhealthy:
        metadata["annotations"][UNHEALTHY_ANNOTATION] = json.dumps(health.unhealthy, sort_keys=True)
    if pool.owner is not None:
        metadata["ownerReferences"] = [pool.owner]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {"taints": pool.taints} if pool.taints else {},
        "status": {
            "capacity": {**NODE_RESOURCES, **pool.resources(name, allocatable=False)},
            "allocatable": {**NODE_RESOURCES, **pool.resources(name, allocatable=True)},
            "conditions": [condition(health)],
        },
    }


def condition(health: Health) -> Json:
    """The node's ``AcceleratedHardwareReady`` condition as written now."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {**health.condition(), "lastHeartbeatTime": now, "lastTransitionTime": now}


def shows(node: Json, health: Health) -> bool:
    """Whether Node object ``node`` shows ``health``: its unhealthy GPUs and its condition."""
    meta = node["metadata"]
    unhealthy = json.dumps(health.unhealthy, sort_keys=True) if health.unhealthy else None
    if meta.get("annotations", {}).get(UNHEALTHY_ANNOTATION) != unhealthy:
        return False
    want = health.condition()
    got = {c.get("type"): c for c in node.get("status", {}).get("conditions") or []}.get(want["type"]) or {}
    return all(got.get(k) == v for k, v in want.items())


def ready(node: Json) -> bool:
    """Whether Node object ``node`` is Ready."""
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def kept_by_kwok(node: Json) -> bool:
    """Whether KWOK keeps Node object ``node`` (no kubelet reports its status)."""
    return bool(node["metadata"].get("annotations", {}).get(KWOK_ANNOTATION[0]) == KWOK_ANNOTATION[1])


def split(pool: str, nodes: dict[str, Json]) -> tuple[dict[str, Json], list[str]]:
    """Pool ``pool``'s ``nodes`` (its label's): those it made, by name, and the names of the KWOK
    nodes someone else made that it decorates, sorted (a kubelet's node keeps what its kubelet
    reports)."""
    own = {n: o for n, o in nodes.items() if Pool.named(pool, n)}
    return own, sorted(n for n, o in nodes.items() if n not in own and kept_by_kwok(o))


def real_nodes_affinity() -> Json:
    """A pod's affinity keeping it off KWOK's nodes (``type=kwok``, :func:`node_body`), where it
    would only seem to run."""
    term = {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def profile_for(spec: VirtualSpec) -> profiles.Profile:
    return profiles.load(spec.profile).with_count(spec.gpus)


def parallel(fn: Any, items: Iterable[Any], workers: int = 8) -> list[Any]:
    """``fn`` over ``items`` on a few threads (API calls: the server's work, not ours)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def check_total(specs: Sequence[VirtualSpec], extra: int = 0) -> None:
    total = sum(s.count for s in specs) + extra
    if total > MAX_VIRTUAL:
        raise ValueError(f"{total} virtual nodes: a cluster holds at most {MAX_VIRTUAL}")
    pools = [s.pool for s in specs]
    if dup := sorted({p for p in pools if pools.count(p) > 1}):
        raise ValueError(f"--virtual: pool {dup[0]} given twice (one --virtual per PROFILE[:GPUS])")
