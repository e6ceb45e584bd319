"""A node's InfiniBand HCAs: the profile's ``infiniband`` section and the concrete adapters it makes.

A profile names one adapter model (NVIDIA ConnectX, driven by mlx5) and how many the node
has; each adapter is paired with a GPU (``gpus``: HCA i with GPU i by default, as on DGX and
GB200/GB300 compute trays, where every GPU shares a PCIe switch with its own NIC). From that
:func:`adapters` makes the concrete HCAs: kernel names (``mlx5_0``...), PCI addresses, NUMA
nodes, GUIDs and their ports. Everything the node shows of them (sysfs, device nodes, tools)
is derived from these values alone.

GUIDs: unless the profile lists them, each adapter's node GUID is derived from the node's
identity (the profile's name, or the fleet node's name: :func:`gpumodel.fleet.as_node`) under
an NVIDIA networking OUI, so no two adapters of a fleet share one. On mlx5 the system image
GUID and port 1's GUID equal the node GUID.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from . import pcie
from .profile import InfiniBand, Profile, format_guid, parse_guid

OUI = 0xA088C2  # an NVIDIA (Mellanox) networking OUI, as ConnectX-7 node GUIDs carry it
# /dev/infiniband/rdma_cm, the RDMA connection manager's one device for every adapter (librdmacm opens
# it): a misc device (rdma_ucm registers major 10 with a dynamic minor; udev names it infiniband/rdma_cm),
# here at the minor it commonly gets.
RDMA_CM = ("rdma_cm", 10, 58)


@dataclass(frozen=True)
class Port:
    number: int  # from 1
    guid: int
    lid: int  # 0 on Ethernet


@dataclass(frozen=True)
class Hca:
    """One concrete adapter of a node."""

    index: int
    name: str  # mlx5_<index>
    spec: InfiniBand
    gpu: int | None  # the paired GPU's index
    bus_id: str  # DDDDDDDD:BB:DD.F
    numa_node: int
    node_guid: int
    ports: tuple[Port, ...]


def derived_guid(identity: str, index: int) -> int:
    """The node GUID of adapter ``index`` of the node ``identity``: the OUI, then 40 bits of a
    name-based UUID (a fleet of 100,000 nodes of 8 adapters has ~0.04% odds of one collision)."""
    low = uuid.uuid5(uuid.NAMESPACE_URL, f"mokka:{identity}:hca:{index}").int & ((1 << 40) - 1)
    return (OUI << 40) | low


def lid_of(node_guid: int) -> int:
    """A unicast LID (1..0xbfff) for a port, stable for its GUID, as a subnet manager would hand out."""
    return 1 + node_guid % 0xBFFE


def gid0(port: Port) -> str:
    """The port's GID 0: the link-local subnet prefix and the port GUID, as sysfs spells it."""
    return "fe80:0000:0000:0000:" + format_guid(port.guid)


def adapters(profile: Profile) -> list[Hca]:
    """The node's adapters: those of the profile's ``infiniband`` whose paired GPU is on the node
    (an adapter paired with GPU 5 is not on a node of 4 GPUs), named ``mlx5_0``... in order."""
    ib = profile.infiniband
    if ib is None:
        return []
    devices = profile.devices()
    bus_ids = pcie.adapter_bus_ids(profile, devices)
    out: list[Hca] = []
    for n, gpu in enumerate(pcie.paired_gpus(profile)):
        if gpu is not None and gpu >= len(devices):
            continue
        index = len(out)
        guid = parse_guid(ib.guids[n]) if n < len(ib.guids) else derived_guid(profile.name, n)
        ports = tuple(
            Port(number=p, guid=guid + p - 1, lid=lid_of(guid + p - 1) if ib.link_layer == "InfiniBand" else 0)
            for p in range(1, ib.ports + 1)
        )
        numa = devices[gpu].numa_node if gpu is not None else 0
        out.append(Hca(index, f"mlx5_{index}", ib, gpu, bus_ids[n], numa, guid, ports))
    return out
