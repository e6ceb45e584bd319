"""A profile as one node of a fleet: GPUs of its own, and the NVLink domain (rack) it is in.

- :func:`as_node`: the same board with this node's own GPU identities (UUIDs and serial numbers
  derived from the node's name), so that two nodes of one profile never share a GPU UUID, as no
  two real GPUs do.
- :func:`in_rack`: every GPU of the node in NVLink domain ``rack``: the fabric probe completed
  with success, the domain's cluster UUID (derived from the rack's name, so every node of the
  rack reports the same one) and its clique id. Through NVML this is ``nvmlGpuFabricInfo``;
  NVIDIA's GFD turns it into the ``nvidia.com/gpu.clique`` label ``<cluster UUID>.<clique>``.
- :func:`with_fabric_delay`: the fabric manager of the node's domain becomes ready only
  ``seconds`` from now: until then the probe reads In Progress (status Not Ready), as while a
  real fabric is trained, and GFD gives no clique label.
- :func:`default_rack`: where a board built into racks (a profile whose fabric names a cluster,
  as GB200 and GB300 NVL72 do) goes when no rack is given: 72 GPUs per domain (NVL72: 18 nodes of
  4), filled in order; a smaller fleet is a partial rack of one domain.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .infiniband import derived_guid
from .profile import Profile, ProfileError, format_guid

__all__ = [
    "NVL_DOMAIN_GPUS",
    "as_node",
    "default_rack",
    "gpu_identity",
    "in_rack",
    "rack_cluster_uuid",
    "with_fabric_delay",
]

NVL_DOMAIN_GPUS = 72  # GPUs in one NVL72 domain
_RACKS = uuid.UUID("6d6f6b6b-612d-7261-636b-000000000000")  # the namespace of rack cluster UUIDs
_ZERO = "00000000-0000-0000-0000-000000000000"


def _with_gpu_fields(profile: Profile, fields: dict[int, dict[str, Any]]) -> Profile:
    data = profile.model_dump()
    for index, extra in fields.items():
        data["gpus"][index] = {**data["gpus"].get(index, {}), **extra}
    return Profile.model_validate(data)


def gpu_identity(profile: str, node: str, index: int) -> tuple[str, str]:
    """The UUID and serial number of GPU ``index`` of a node ``node`` of profile ``profile``."""
    key = uuid.uuid5(uuid.NAMESPACE_URL, f"mokka:{profile}:{node}:{index}")
    return "GPU-" + str(key), str(1650000000000 + key.int % 10**12)


def adapter_guid(profile: str, node: str, index: int) -> int:
    """The node GUID of InfiniBand adapter ``index`` of a node ``node`` of profile ``profile``."""
    return derived_guid(f"{profile}:{node}", index)


def as_node(profile: Profile, node: str) -> Profile:
    """``profile`` on node ``node`` of a fleet: its GPUs' UUIDs and serials, and its InfiniBand
    adapters' GUIDs, are this node's own."""
    fields = {}
    for device in profile.devices():
        gpu_uuid, serial = gpu_identity(profile.name, node, device.index)
        fields[device.index] = {"uuid": gpu_uuid, "serial": serial}
    out = _with_gpu_fields(profile, fields)
    ib = profile.infiniband
    if ib is None or ib.guids:  # GUIDs the profile lists are the user's: kept
        return out
    guids = [format_guid(adapter_guid(profile.name, node, n)) for n in range(ib.count)]
    return out.model_copy(update={"infiniband": ib.model_copy(update={"guids": guids})})


def rack_cluster_uuid(rack: str) -> str:
    """The NVLink domain's cluster UUID every GPU of rack ``rack`` reports."""
    return str(uuid.uuid5(_RACKS, rack))


def in_rack(profile: Profile, rack: str, clique_id: int | None = None) -> Profile:
    """``profile`` with every GPU in NVLink domain ``rack`` (fabric Completed, Success)."""
    if not rack or len(rack) > 63:
        raise ProfileError(f"rack {rack!r}: a rack name has 1 to 63 characters")
    devices = profile.devices()
    unsupported = [d.index for d in devices if d.spec.fabric.state == "Not Supported"]
    if unsupported:
        raise ProfileError(
            f"profile {profile.name}: {profile.gpu.name} has no NVLink fabric (fabric state Not Supported), "
            f"so it cannot be in rack {rack!r}"
        )
    fields = {}
    for d in devices:
        fabric = d.spec.fabric.model_dump()
        fabric.update(
            state="Completed",
            status="Success",
            cluster_uuid=rack_cluster_uuid(rack),
            clique_id=clique_id if clique_id is not None else (d.spec.fabric.clique_id or 1),
        )
        fields[d.index] = {"fabric": fabric}
    return _with_gpu_fields(profile, fields)


def default_rack(profile: Profile, nth: int) -> str | None:
    """The rack of the ``nth`` node (from 0) of ``profile`` in a fleet when none is given: for a
    board built into racks (its fabric names a cluster), ``<profile>-nvl<N>`` domains filled in
    order; None for every other board."""
    if profile.gpu.fabric.state == "Not Supported" or profile.gpu.fabric.cluster_uuid == _ZERO:
        return None
    per_rack = max(1, NVL_DOMAIN_GPUS // profile.gpu_count)
    return f"{profile.name}-nvl{NVL_DOMAIN_GPUS}-{nth // per_rack}"


def with_fabric_delay(profile: Profile, seconds: float, now: float | None = None) -> Profile:
    """``profile`` whose fabric manager is ready ``seconds`` after ``now`` (default: this moment)."""
    if seconds < 0:
        raise ProfileError(f"fabric delay {seconds:g} s: must be 0 or more")
    if seconds == 0:
        return profile
    ready = int((time.time() if now is None else now) + seconds + 0.999)
    fields = {}
    for d in profile.devices():
        if d.spec.fabric.state == "Not Supported":
            raise ProfileError(f"profile {profile.name}: {profile.gpu.name} has no NVLink fabric: no fabric delay")
        fields[d.index] = {"fabric": {**d.spec.fabric.model_dump(), "manager_ready_at": ready}}
    return _with_gpu_fields(profile, fields)
