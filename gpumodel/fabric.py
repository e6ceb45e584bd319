"""The InfiniBand subnet that nodes' adapters sit in, for the tools that walk it (ibnetdiscover,
iblinkinfo, sminfo, smpquery and perfquery towards another node).

The layout is a DGX SuperPOD scalable unit's compute fabric, rail-optimized: adapter *r* of
every node is cabled to leaf switch *r* (the rail), at the leaf's port *n* + 1 for the *n*-th
node; each leaf's port 33 goes up to the one spine, at the spine's port *r* + 1. Leaves and spine
are NVIDIA Quantum-2 switches (QM9700: 64 NDR ports, 32 down and 32 up, so a rail holds 32
nodes, as a scalable unit does). The spine holds LID 1 and runs the subnet manager, which is the
SM LID every adapter port names.

:func:`subnet` lays the fabric out for a list of nodes; :func:`render` writes it as the text the
sysfs shim's MAD responder reads (native/sysfs/umad.c). Host setup writes a node's own fabric
(the node alone on its rails); the local cluster writes one with every node of the cluster.

LIDs are the subnet manager's to give, one per port, never two alike: each adapter port gets the
LID its GUID hashes to (:func:`gpumodel.infiniband.lid_of`, stable across runs) unless the SM LID,
a switch or an earlier port of the subnet holds it; then the next free one up. The nodes' trees
carry the LIDs of the subnet they are in (host setup and ``hostsetup.infiniband.write_fabric``
write them; a port brought back up gets its LID from the fabric file, :func:`file_lids`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .infiniband import OUI, adapters
from .profile import Profile

__all__ = ["FILE", "FabricError", "Link", "Node", "Subnet", "file_lids", "port_lids", "render", "subnet"]

# Where the sysfs shim's MAD responder reads the fabric, under a staged root: a dot file, which no
# tool lists.
FILE = Path("sys/class/infiniband_mad/.mokka-fabric")

NODES_PER_RAIL = 32  # a leaf's down ports
LEAF_UPLINK = 33  # its first up port, to the spine
SWITCH_PORTS = 64  # QM9700
SWITCH_DEVICE_ID = 0xD2F2  # Quantum-2 (54002)
SWITCH_DESC = "Quantum-2 Mellanox Technologies"
SM_LID = 1  # the spine's LID; adapter ports name it as their SM LID
TOP_LID = 0xBFFF  # the unicast range's top: the switches take LIDs from here down


class FabricError(ValueError):
    """The nodes do not fit the fabric; the message says why."""


@dataclass(frozen=True)
class Node:
    guid: int
    kind: str  # CA or SW
    ports: int
    device_id: int
    desc: str
    port_lids: tuple[tuple[int, int, int], ...]  # (port, port GUID, LID); a switch: port 0 alone


@dataclass(frozen=True)
class Link:
    a: tuple[int, int]  # (node GUID, port)
    b: tuple[int, int]
    up: bool
    rate: str  # "4X NDR": width and speed


@dataclass(frozen=True)
class Subnet:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]


def switch_guid(role: str) -> int:
    """A switch's GUID (node, system image and every port's), fixed for its role in the fabric."""
    return (OUI << 40) | (uuid.uuid5(uuid.NAMESPACE_URL, f"mokka:fabric:{role}").int & ((1 << 40) - 1))


def _switch_lid(index: int) -> int:
    """Leaf ``index``'s LID: from the top of the unicast range down (the spine holds SM_LID)."""
    return TOP_LID - index


class _Lids:
    """The subnet manager's LID assignment: a port's preferred LID unless taken, else the next free."""

    def __init__(self, reserved: set[int]) -> None:
        self.taken = set(reserved)

    def give(self, preferred: int) -> int:
        lid = preferred
        while lid in self.taken:
            lid = lid % (TOP_LID - 1) + 1  # 1..0xbffe, wrapping
        self.taken.add(lid)
        return lid


def subnet(members: Sequence[tuple[str, Profile]]) -> Subnet:
    """The fabric of ``members`` (host name, the node's profile as staged), in order, every link
    up (the ports' state is the tree's: ``hostsetup.infiniband.sync_fabric``)."""
    if len(members) > NODES_PER_RAIL:
        raise FabricError(f"{len(members)} nodes: a rail's leaf switch holds {NODES_PER_RAIL}")
    nodes: list[Node] = []
    links: list[Link] = []
    rails: dict[int, str] = {}  # rail -> its links' rate
    hcas = [(n, host, hca) for n, (host, prof) in enumerate(members) for hca in adapters(prof)]
    rails_used = {hca.index for _, _, hca in hcas if hca.spec.link_layer == "InfiniBand"}
    lids = _Lids({SM_LID} | {_switch_lid(r) for r in rails_used})
    for n, host, hca in hcas:
        if hca.spec.link_layer != "InfiniBand":
            continue
        nodes.append(
            Node(
                hca.node_guid,
                "CA",
                len(hca.ports),
                hca.spec.device_id,
                f"{host} {hca.name}",
                tuple((p.number, p.guid, lids.give(p.lid)) for p in hca.ports),
            )
        )
        rate = f"{hca.spec.width} {hca.spec.speed}"
        rails.setdefault(hca.index, rate)
        leaf = switch_guid(f"leaf{hca.index}")
        links.append(Link((hca.node_guid, 1), (leaf, n + 1), True, rate))
    spine = switch_guid("spine")
    switches = [Node(spine, "SW", SWITCH_PORTS, SWITCH_DEVICE_ID, f"{SWITCH_DESC} spine", ((0, spine, SM_LID),))]
    for r, rate in sorted(rails.items()):
        leaf = switch_guid(f"leaf{r}")
        lid = _switch_lid(r)
        switches.append(Node(leaf, "SW", SWITCH_PORTS, SWITCH_DEVICE_ID, f"{SWITCH_DESC} leaf{r}", ((0, leaf, lid),)))
        links.append(Link((leaf, LEAF_UPLINK), (spine, r + 1), True, rate))
    return Subnet(tuple(switches + nodes), tuple(links))


def port_lids(fabric: Subnet) -> dict[int, int]:
    """Each adapter port's LID in ``fabric``, by port GUID."""
    return {guid: lid for node in fabric.nodes if node.kind == "CA" for _, guid, lid in node.port_lids}


def file_lids(text: str) -> dict[int, int]:
    """Each port's LID, by port GUID, as a fabric file (:func:`render`) says."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["port"] and len(words) == 5:
            out[int(words[3], 16)] = int(words[4])
    return out


def render(fabric: Subnet) -> str:
    """The fabric as the MAD responder reads it: one line per node, port and link."""
    lines = [
        "# mokka fabric 1: node GUID kind ports device-id description; port node port GUID LID; "
        "link node port node port up rate; counters node port name=value... (hostsetup.infiniband.sync_fabric)"
    ]
    for node in fabric.nodes:
        lines.append(f"node {node.guid:016x} {node.kind} {node.ports} {node.device_id} {node.desc}")
        for number, guid, lid in node.port_lids:
            lines.append(f"port {node.guid:016x} {number} {guid:016x} {lid}")
    for link in fabric.links:
        (ga, pa), (gb, pb) = link.a, link.b
        lines.append(f"link {ga:016x} {pa} {gb:016x} {pb} {int(link.up)} {link.rate}")
    return "\n".join(lines) + "\n"
