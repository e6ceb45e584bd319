"""Faults on virtual nodes, as NVIDIA's device plugin shows them: the fault ConfigMap's entries (one
key per node name, its value a scenario, as the chart's real nodes read them) made into each node's
unhealthy GPUs and why. A virtual node has no NVML: only what the device plugin reports reaches its
API objects (allocatable, the ResourceSlice), through :mod:`.pool`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpumodel import fleet

__all__ = ["APPLICATION_XIDS", "fault_effect", "node_gpus", "read_entries", "unhealthy_of"]

Json = dict[str, Any]

# Xids NVIDIA's device plugin leaves healthy (application errors: its default skip list).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


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
    raise ValueError(
        f"a virtual node has no NVML: {kind} changes nothing its API objects show "
        "(virtual nodes take xid, lost, ecc --uncorrected and clear)"
    )


def node_gpus(profile: str, product: str, count: int, node: str) -> list[Any]:
    """The GPUs of virtual node ``node`` as a real node's state lists them (fault selection by
    index or UUID, as on a real node)."""
    from gpumodel import faults

    gpus = []
    for i in range(count):
        uuid, serial = fleet.gpu_identity(profile, node, i)
        gpus.append(faults.Gpu(slot=i, index=i, uuid=uuid, bus_id="", serial=serial, name=product))
    return gpus


def unhealthy_of(entry: str, gpus: Sequence[Any], source: str) -> dict[str, str]:
    """GPU index -> why unhealthy after fault entry ``entry`` (a scenario's text): its steps in
    order, as the device plugin shows them (:func:`fault_effect`; a timed entry's end state at
    once). Raises ``scenario.ScenarioError``, ``faults.FaultError`` or ValueError, naming ``source``."""
    from gpumodel import scenario

    steps = scenario.load_text(entry, source)
    bad: dict[str, str] = {}
    for event in steps.timeline(list(gpus)):
        effect, why = fault_effect(steps.steps[event.step][1], event.fault.model_dump())
        for gpu in event.gpus:
            if effect == "unhealthy":
                bad.setdefault(str(gpu.index), why)
            elif effect == "healthy":
                bad.pop(str(gpu.index), None)
    return bad


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
