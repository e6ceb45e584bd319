"""The node's InfiniBand adapters as a NIC DRA driver sees them: read from sysfs, as real drivers do.

A NIC driver (Google's DRANET, NVIDIA's SR-IOV DRA driver) finds the RDMA devices in
``/sys/class/infiniband``, their PCI function through the ``device`` link and their character
devices in ``/sys/class/infiniband_verbs`` (``uverbsN``) and ``/sys/class/infiniband_mad``
(``umadN``, ``issmN``: each names its adapter in ``ibdev`` and its device number in ``dev``).
This module reads the same files of the node's tree (the staged one on a mock node), so what
the plugin publishes and the device nodes it hands a container are the node's own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .gpus import pcie_root

__all__ = ["Nic", "read"]

_DEV = re.compile(r"^(\d+):(\d+)$")
_RATE = re.compile(r"^(\d+)")


@dataclass(frozen=True)
class Nic:
    """One adapter, with the facts the ResourceSlice publishes and the device nodes it takes."""

    name: str  # "mlx5_3", the kernel's RDMA device name
    hca_type: str  # "MT4129" (ConnectX-7), as ibstat's "CA type"
    firmware: str  # "28.39.1002"
    node_guid: str  # "a088:c2f7:4dfb:822d", as sysfs writes it
    pcie_bus_id: str  # "0000:52:00.0"
    pcie_root: str | None  # "pci0000:4f"; None when sysfs does not say
    numa_node: int | None  # None where sysfs says -1
    link_layer: str  # port 1's: "InfiniBand" or "Ethernet"
    rate_gbps: int  # port 1's rate in Gb/s (400 for 4X NDR)
    ports: int
    device_nodes: tuple[tuple[str, int, int], ...]  # ("uverbs3", 231, 195), ("umad3", 231, 3), ...

    @property
    def device_name(self) -> str:
        """The device's name in the ResourceSlice: a DNS label (``mlx5-3``)."""
        return self.name.replace("_", "-").lower()


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _char_devices(sysfs: Path) -> dict[str, list[tuple[str, int, int]]]:
    """Adapter name -> its character devices (name, major, minor), uverbs first, in number order."""
    out: dict[str, list[tuple[str, int, int]]] = {}
    found: list[tuple[int, int, str, str, int, int]] = []
    for klass, rank in (("infiniband_verbs", 0), ("infiniband_mad", 1)):
        base = sysfs / "class" / klass
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            m = _DEV.match(_text(base / name / "dev"))
            owner = _text(base / name / "ibdev")
            if m and owner:
                number = int(re.sub(r"\D", "", name) or 0)
                found.append((rank, number, name, owner, int(m[1]), int(m[2])))
    for _rank, _number, name, owner, major, minor in sorted(found):
        out.setdefault(owner, []).append((name, major, minor))
    return out


def read(sysfs: Path = Path("/sys")) -> tuple[Nic, ...]:
    """Every adapter under ``sysfs/class/infiniband``, in name order (none when there is no such class)."""
    base = sysfs / "class" / "infiniband"
    try:
        names = sorted(os.listdir(base), key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])
    except OSError:
        return ()
    nodes = _char_devices(sysfs)
    nics = []
    for name in names:
        ca = base / name
        function = Path(os.path.realpath(ca / "device"))
        bus = function.name
        ports = sorted(int(p) for p in os.listdir(ca / "ports") if p.isdigit()) if (ca / "ports").is_dir() else []
        first = ca / "ports" / str(ports[0]) if ports else ca
        numa = _text(function / "numa_node")
        rate = _RATE.match(_text(first / "rate"))
        nics.append(
            Nic(
                name=name,
                hca_type=_text(ca / "hca_type"),
                firmware=_text(ca / "fw_ver"),
                node_guid=_text(ca / "node_guid"),
                pcie_bus_id=bus,
                pcie_root=pcie_root(bus, sysfs),
                numa_node=int(numa) if numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
                link_layer=_text(first / "link_layer"),
                rate_gbps=int(rate[1]) if rate else 0,
                ports=len(ports),
                device_nodes=tuple(nodes.get(name, ())),
            )
        )
    return tuple(nics)
