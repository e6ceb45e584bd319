"""Where a node's PCI functions sit: a GPU on its own root bus, or behind a PCIe switch shared
with its InfiniBand adapter.

A GPU without an adapter sits directly on a root bus of its own (``pci0000:53/0000:53:00.0``),
as the captures' GPUs do. A GPU paired with an adapter (profile ``infiniband.gpus``) sits, as
on a DGX or HGX baseboard, behind a PCIe switch together with that adapter: root port, the
switch's upstream port and two downstream ports, one to the adapter and one to the GPU::

    pci0000:4f/0000:4f:01.0/0000:50:00.0/0000:51:00.0/0000:52:00.0    the adapter (bus G-1)
                                        /0000:51:01.0/0000:53:00.0    the GPU (bus G, unchanged)

The switch takes the four buses below the GPU's (G-4 .. G-1), so the GPU keeps the bus id the
profile gives it. Where those buses are not free (another GPU or NVSwitch uses one, the GPU's
bus is below 4, or the GPU is not function 0 of device 0), the adapter gets a root bus of its
own instead, on the GPU's NUMA node: ``nvidia-smi topo -m`` then says NODE instead of PIX.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profile import Device, Profile, normalize_bus_id, parse_bus_id

SWITCH_BUSES = 4  # root bus, the switch's internal bus, the adapter's bus, and the GPU's own


@dataclass(frozen=True)
class Switch:
    """The PCIe switch a GPU shares with its adapter; buses as numbers in ``domain``."""

    domain: int
    gpu_bus: int

    @property
    def root_bus(self) -> int:
        return self.gpu_bus - 4

    @property
    def root_port(self) -> str:
        return bus_id(self.domain, self.root_bus, 1)

    @property
    def upstream(self) -> str:
        return bus_id(self.domain, self.root_bus + 1, 0)

    @property
    def downstream(self) -> tuple[str, str]:
        """The ports toward the adapter and toward the GPU."""
        return bus_id(self.domain, self.root_bus + 2, 0), bus_id(self.domain, self.root_bus + 2, 1)

    @property
    def adapter(self) -> str:
        return bus_id(self.domain, self.gpu_bus - 1, 0)

    def bridges(self) -> list[tuple[str, int, int]]:
        """(bus id, secondary bus, subordinate bus) of each bridge, from the root port down."""
        to_adapter, to_gpu = self.downstream
        return [
            (self.root_port, self.root_bus + 1, self.gpu_bus),
            (self.upstream, self.root_bus + 2, self.gpu_bus),
            (to_adapter, self.gpu_bus - 1, self.gpu_bus - 1),
            (to_gpu, self.gpu_bus, self.gpu_bus),
        ]

    def path(self, bus_id_: str) -> list[str]:
        """The chain of functions from the root port down to ``bus_id_`` (the adapter or the GPU)."""
        to_adapter, to_gpu = self.downstream
        port = to_adapter if bus_id_ == self.adapter else to_gpu
        return [self.root_port, self.upstream, port, bus_id_]


def bus_id(domain: int, bus: int, device: int, function: int = 0) -> str:
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def paired_gpus(profile: Profile) -> list[int | None]:
    """The GPU each adapter is paired with: the profile's list, then adapter i with GPU i (an
    adapter whose GPU is beyond the node's count is not on the node: :func:`adapter_bus_ids`)."""
    ib = profile.infiniband
    if ib is None:
        return []
    listed = list(ib.gpus)
    return listed + list(range(len(listed), ib.count))


def switches(profile: Profile) -> dict[int, Switch]:
    """The GPUs (by index) that sit behind a switch with their adapter."""
    ib = profile.infiniband
    if ib is None:
        return {}
    devices = profile.devices()
    used: set[tuple[int, int]] = {parse_bus_id(d.bus_id)[:2] for d in devices}
    used |= {parse_bus_id(b)[:2] for b in profile.topology.nvswitches}
    used |= {parse_bus_id(b)[:2] for b in ib.bus_ids}
    out: dict[int, Switch] = {}
    for n, gpu in enumerate(paired_gpus(profile)):
        if gpu is None or gpu >= len(devices) or gpu in out or n < len(ib.bus_ids):
            continue
        domain, bus, dev, fn = parse_bus_id(devices[gpu].bus_id)
        below = {(domain, b) for b in range(bus - SWITCH_BUSES, bus)}
        if bus < SWITCH_BUSES or dev or fn or below & used:
            continue
        used |= below
        out[gpu] = Switch(domain, bus)
    return out


def adapter_bus_ids(profile: Profile, devices: list[Device]) -> list[str]:
    """Every adapter's PCI address: listed, behind its GPU's switch, or on a free root bus ("" for
    an adapter whose GPU is not on the node)."""
    ib = profile.infiniband
    if ib is None:
        return []
    behind = switches(profile)
    taken = {parse_bus_id(d.bus_id)[:2] for d in devices} | {parse_bus_id(b)[:2] for b in profile.topology.nvswitches}
    for s in behind.values():
        taken |= {(s.domain, b) for b in range(s.root_bus, s.gpu_bus + 1)}
    taken |= {parse_bus_id(b)[:2] for b in ib.bus_ids}
    out: list[str] = []
    for n, gpu in enumerate(paired_gpus(profile)):
        if n < len(ib.bus_ids):
            out.append(normalize_bus_id(ib.bus_ids[n]))
        elif gpu is not None and gpu >= len(devices):
            out.append("")  # not on this node
        elif gpu is not None and gpu in behind:
            out.append(behind[gpu].adapter)
        else:
            domain = parse_bus_id(devices[gpu].bus_id)[0] if gpu is not None else 0
            free = next(b for b in range(0x10, 0x100) if (domain, b) not in taken)
            taken.add((domain, free))
            out.append(bus_id(domain, free, 0))
    return out
