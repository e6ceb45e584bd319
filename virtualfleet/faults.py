"""Faults on virtual nodes, as a real node's watchers show them: the fault ConfigMap's entries (one
key per node name, its value a scenario, as the chart's real nodes read them; a key naming a rack
applies to each node of it first) made into each node's :class:`Health`. A virtual node has no
NVML: only what reaches the API from a real node does, through :mod:`.pool`:

- NVIDIA's device plugin: an unhealthy GPU leaves allocatable or the ResourceSlice
  (:func:`fault_effect`);
- a node health agent: the ``AcceleratedHardwareReady`` condition with the reasons the EKS node
  monitoring agent gives (Karpenter's and EKS's node repair act on it), also for what the device
  plugin does not watch: NVLink and the fabric (:func:`finding`);
- GFD: no ``nvidia.com/gpu.clique`` label once no GPU's fabric probe reads Completed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumodel import fleet

__all__ = [
    "APPLICATION_XIDS",
    "CONDITION",
    "Health",
    "by_node",
    "fault_effect",
    "finding",
    "health_of",
    "node_gpus",
    "read_entries",
]

Json = dict[str, Any]

# Xids NVIDIA's device plugin leaves healthy (application errors: its default skip list).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# The EKS node monitoring agent's condition for accelerators, and its reason while all is well.
CONDITION = "AcceleratedHardwareReady"
READY = ("NvidiaAcceleratedHardwareIsReady", "Monitoring for the Nvidia AcceleratedHardware system is active")
TAKES = "virtual nodes take xid, lost, ecc --uncorrected, nvlink, fabric and clear"


def fault_effect(kind: str, fields: Json) -> tuple[str, str]:
    """What the device plugin makes of fault ``kind`` on a GPU: ``("unhealthy", why)``,
    ``("healthy", "")`` (``clear``) or ``("unchanged", why)``. A ValueError: the fault shows nowhere
    a virtual node has (it has no NVML)."""
    if kind == "xid":
        code = int(fields["code"])
        if code in APPLICATION_XIDS:
            return "unchanged", f"Xid {code} is an application error: the device plugin keeps the GPU healthy"
        return "unhealthy", f"Xid {code}"
    if kind == "lost":
        return "unhealthy", "Xid 79 (GPU lost)"
    if kind == "ecc" and int(fields.get("uncorrected") or 0) > 0:
        return "unhealthy", "Xid 48 (double-bit ECC error)"
    if kind == "clear":
        return "healthy", ""
    if kind in ("nvlink", "nvlink-errors", "fabric"):
        return "unchanged", f"the device plugin does not watch {'the fabric' if kind == 'fabric' else 'NVLink'}"
    raise ValueError(f"a virtual node has no NVML: {kind} changes nothing its API objects show ({TAKES})")


def finding(kind: str, fields: Json) -> tuple[str, str] | None:
    """The node health agent's finding for fault ``kind`` on a GPU: (reason, message) as the EKS node
    monitoring agent names it, or None (nothing it reports; ``clear``, ``nvlink up`` and ``fabric
    healthy`` undo findings, :func:`health_of`)."""
    if kind == "xid":
        code = int(fields["code"])
        return None if code in APPLICATION_XIDS else (f"NvidiaXID{code}Error", f"Xid {code}")
    if kind == "lost":
        return "NvidiaXID79Error", "Xid 79 (GPU lost)"
    if kind == "ecc" and int(fields.get("uncorrected") or 0) > 0:
        return "NvidiaDoubleBitError", "double-bit ECC error"
    if kind == "nvlink" and fields.get("state") == "down":
        return "NvidiaNVLinkError", f"NVLink {fields['link']} down"
    if kind == "nvlink-errors":
        return "NvidiaNVLinkError", f"NVLink {fields['link']} errors"
    if kind == "fabric" and fields.get("state") == "degraded":
        return "NvidiaFabricError", "fabric bandwidth degraded"
    if kind == "fabric" and fields.get("state") == "in-progress":
        return "FabricManagerNotRunning", "fabric probe In Progress"
    return None


@dataclass
class Health:
    """What a virtual node's faults show: GPU index -> why unhealthy (the device plugin's view),
    GPU index -> [[reason, message], ...] (the health agent's findings), the GPUs whose fabric probe
    reads In Progress."""

    unhealthy: dict[str, str] = field(default_factory=dict)
    findings: dict[str, list[list[str]]] = field(default_factory=dict)
    probing: list[str] = field(default_factory=list)

    def clique(self, gpus: int) -> bool:
        """Whether GFD gives the node its clique label (a GPU's probe still reads Completed)."""
        return len(self.probing) < gpus

    def condition(self) -> dict[str, str]:
        """The node's ``AcceleratedHardwareReady`` condition (without its times)."""
        found = [(int(i), f) for i, fs in self.findings.items() for f in fs]
        if not found:
            return {"type": CONDITION, "status": "True", "reason": READY[0], "message": READY[1]}
        found.sort(key=lambda x: x[0])
        message = "; ".join(f"GPU {i}: {f[1]}" for i, f in found)
        return {"type": CONDITION, "status": "False", "reason": found[0][1][0], "message": message}

    def __bool__(self) -> bool:
        return bool(self.unhealthy or self.findings or self.probing)


def node_gpus(profile: str, product: str, count: int, node: str) -> list[Any]:
    """The GPUs of virtual node ``node`` as a real node's state lists them (fault selection by
    index or UUID, as on a real node)."""
    from gpumodel import faults

    gpus = []
    for i in range(count):
        uuid, serial = fleet.gpu_identity(profile, node, i)
        gpus.append(faults.Gpu(slot=i, index=i, uuid=uuid, bus_id="", serial=serial, name=product))
    return gpus


def health_of(entries: Sequence[tuple[str, str]], gpus: Sequence[Any]) -> Health:
    """What fault entries ``entries`` ((source, scenario text), in order: the rack's, then the
    node's) show on a node with ``gpus``: each entry's steps in order (a timed entry's end state at
    once). Raises ``scenario.ScenarioError``, ``faults.FaultError`` or ValueError, naming the source."""
    from gpumodel import scenario

    health = Health()
    for source, text in entries:
        steps = scenario.load_text(text, source)
        for event in steps.timeline(list(gpus)):
            kind = steps.steps[event.step][1]
            fields = event.fault.model_dump()
            effect, why = fault_effect(kind, fields)
            found = finding(kind, fields)
            for gpu in event.gpus:
                _apply(health, str(gpu.index), kind, fields, effect, why, found)
    return health


def by_node(
    entries: dict[str, str],
    places: Sequence[tuple[str, str | None]],
    gpus_of: Callable[[str], Sequence[Any]],
    warn: Callable[[str], None],
) -> dict[str, Health]:
    """Node -> what its faults show, for the fault ConfigMap's ``entries`` and the nodes at
    ``places`` ((node, its rack or None), in order): the rack's entry (a key naming the rack), then
    the node's own (:func:`health_of`). A bad entry is told to ``warn`` once and left out."""
    from gpumodel import faults as gpufaults
    from gpumodel import scenario

    out: dict[str, Health] = {}
    bad: set[str] = set()
    for node, rack in places:
        keys = [k for k in (rack, node) if k is not None and k in entries and k not in bad]
        if not keys:
            continue
        gpus = gpus_of(node)
        try:
            health = health_of([(f"fault entry {k}", entries[k]) for k in keys], gpus)
        except (scenario.ScenarioError, gpufaults.FaultError, ValueError):
            # which entry: each alone, told once and left out from then on
            for key in keys:
                try:
                    health_of([(f"fault entry {key}", entries[key])], gpus)
                except (scenario.ScenarioError, gpufaults.FaultError, ValueError) as exc:
                    warn(str(exc).splitlines()[0])
                    bad.add(key)
            health = health_of([(f"fault entry {k}", entries[k]) for k in keys if k not in bad], gpus)
        if health:
            out[node] = health
    return out


def _apply(
    health: Health, i: str, kind: str, fields: Json, effect: str, why: str, found: tuple[str, str] | None
) -> None:
    """One fault on GPU ``i``, as a real GPU takes it: ``nvlink up`` undoes that link's ``down``, a
    fabric fault replaces the fabric's last one, ``clear`` undoes everything."""
    if effect == "unhealthy":
        health.unhealthy.setdefault(i, why)
    elif effect == "healthy":
        health.unhealthy.pop(i, None)
    state = fields.get("state")
    kept = health.findings.pop(i, [])
    if kind == "clear":
        kept = []
    elif kind == "nvlink" and state == "up":
        kept = [f for f in kept if f != ["NvidiaNVLinkError", f"NVLink {fields['link']} down"]]
    elif kind == "fabric":
        kept = [f for f in kept if f[0] not in ("NvidiaFabricError", "FabricManagerNotRunning")]
    if found is not None and list(found) not in kept:
        kept.append(list(found))
    if kept:
        health.findings[i] = kept
    probing = set(health.probing) - ({i} if kind in ("clear", "fabric") else set())
    if kind == "fabric" and state == "in-progress":
        probing.add(i)
    health.probing = sorted(probing, key=int)


def read_entries(core: Any, namespace: str, name: str) -> dict[str, str]:
    """The fault ConfigMap's entries (node name -> scenario text); none while it does not exist."""
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    try:
        cm = core.read_namespaced_config_map(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return dict(cm.data or {})
