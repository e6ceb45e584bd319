"""The InfiniBand adapters' sysfs, as the mlx5 and ib_core drivers lay it out, staged beside the GPUs'.

For each adapter of the profile (:func:`gpumodel.infiniband.adapters`)::

    sys/devices/.../<slot>/                          the ConnectX PCI function (vendor 0x15b3), bound to mlx5_core
    sys/devices/.../<slot>/infiniband/mlx5_N/        node_guid, sys_image_guid, fw_ver, hca_type, board_id,
                                                     node_type, node_desc, hw_rev; ports/<p>/ with state,
                                                     phys_state, rate, lid, sm_lid, cap_mask, link_layer,
                                                     gids/, pkeys/, counters/, hw_counters/
    sys/devices/.../<slot>/infiniband_verbs/uverbsN  ibdev, abi_version, dev (231:192+N)
    sys/devices/.../<slot>/infiniband_mad/umadK      one per port: ibdev, port, dev (231:K); issmK (231:64+K)
    sys/class/infiniband{,_verbs,_mad}/              links to the above, and the ABI versions
    sys/bus/pci/drivers/mlx5_core/<slot>             the binding

libibumad (``ibstat``), the ``ibstatus`` script, libibverbs' device discovery and hwloc (the NIC
columns of ``nvidia-smi topo -m``) read exactly these. The sysfs shim shows them at their real
paths; hwloc places each adapter by the PCI path its class link resolves to.

Port faults (``mokka fault ib-port-down``, fault scenarios) are kept in the files themselves:
:func:`port_files` renders a port as staged, and :mod:`gpumodel.ib_ports` rewrites the files a
fault changes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

from gpumodel import fabric, pcie
from gpumodel.ib_ports import phys_state_text, port_up, ports, state_text, write_value
from gpumodel.infiniband import RDMA_CM, Hca, Port, adapters, gid0
from gpumodel.profile import MELLANOX_VENDOR, Profile, format_guid

from .sysfs import (
    LINK_SPEEDS,
    Link,
    PciName,
    cpu_count,
    cpulist,
    cpumask,
    function_dir,
    numa_cpus,
    rel_path,
    resource_file,
)

# The subnet around the node's adapters (gpumodel/fabric.py), where the sysfs shim's MAD responder
# reads it: a dot file, which no tool lists. Host setup writes the node alone on its rails; the
# local cluster writes the subnet of all its nodes (write_fabric).
FABRIC = fabric.FILE
UVERBS_MAJOR = 231  # ib_uverbs, ib_umad: the kernel's fixed InfiniBand major
UVERBS_BASE = 192
ISSM_BASE = 64
UVERBS_ABI = 6  # /sys/class/infiniband_verbs/abi_version
UMAD_ABI = 5  # /sys/class/infiniband_mad/abi_version (libibumad needs 5)
CAP_MASK = 0xA751E848  # PortInfo:CapabilityMask of a ConnectX-7 InfiniBand port, as ibstat shows it
# The IB port counters of ib_core's sysfs (counters/) and the mlx5 hardware counters (hw_counters/).
COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
)
BAR_SIZE = 64 << 20
MMIO_BASE = 0x2000_0000_0000
BAR_FLAGS = 0x14220C


def hca_dir(hca: Hca, behind: dict[int, pcie.Switch]) -> Path:
    """The adapter's PCI function directory, behind its GPU's switch when it shares one."""
    switch = behind.get(hca.gpu) if hca.gpu is not None else None
    return function_dir(hca.bus_id, switch if switch is not None and switch.adapter == hca.bus_id else None)


def ib_dir(hca: Hca, behind: dict[int, pcie.Switch]) -> Path:
    return hca_dir(hca, behind) / "infiniband" / hca.name


def port_files(hca: Hca, port: Port, lid: int) -> dict[str, str]:
    """A port's files as staged (link up with LID ``lid``, counters 0), relative to ``ports/<n>/``."""
    ib = hca.spec
    infiniband = ib.link_layer == "InfiniBand"
    out = {
        "state": state_text(True),
        "phys_state": phys_state_text(True),
        "rate": ib.rate_text,
        "lid": f"0x{lid:x}",
        "lid_mask_count": "0",
        "sm_lid": "0x1" if infiniband else "0x0",
        "sm_sl": "0",
        "cap_mask": f"0x{CAP_MASK:08x}",
        "link_layer": ib.link_layer,
        "gids/0": gid0(port),
        "pkeys/0": "0xffff",
    }
    for name in COUNTERS:
        out[f"counters/{name}"] = "0"
    for name in HW_COUNTERS:
        out[f"hw_counters/{name}"] = "0"
    return out


def config_space(hca: Hca, index: int) -> bytes:
    """The adapter's config space: header, PCI Express endpoint capability with its link."""
    ib = hca.spec
    cfg = bytearray(4096)
    bar = MMIO_BASE + index * BAR_SIZE
    struct.pack_into("<HHHH", cfg, 0x00, MELLANOX_VENDOR, ib.device_id, 0x0546, 0x0010)
    struct.pack_into("<I", cfg, 0x08, (ib.pci_class << 8) | ib.revision)
    struct.pack_into("<II", cfg, 0x10, (bar & 0xFFFFFFF0) | 0xC, bar >> 32)
    struct.pack_into("<HH", cfg, 0x2C, MELLANOX_VENDOR, ib.subsystem_device_id)
    struct.pack_into("<B", cfg, 0x34, 0x60)
    struct.pack_into("<BBH", cfg, 0x60, 0x10, 0x00, 0x0002)  # PCI Express v2, endpoint
    struct.pack_into("<I", cfg, 0x6C, (ib.pcie_width << 4) | ib.pcie_gen)
    struct.pack_into("<HH", cfg, 0x70, 0x0000, 0x1000 | (ib.pcie_width << 4) | ib.pcie_gen)
    return bytes(cfg)


def modalias(hca: Hca) -> str:
    ib = hca.spec
    cls = ib.pci_class
    return (
        f"pci:v{MELLANOX_VENDOR:08X}d{ib.device_id:08X}sv{MELLANOX_VENDOR:08X}sd{ib.subsystem_device_id:08X}"
        f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
    )


def files(profile: Profile, behind: dict[int, pcie.Switch]) -> dict[Path, bytes | Link]:
    """Every adapter's PCI function and InfiniBand class files (see the module's docstring)."""
    out: dict[Path, bytes | Link] = {}
    hcas = adapters(profile)
    if not hcas:
        return out

    def text(path: Path, value: str) -> None:
        out[path] = (value + "\n").encode()

    def link(path: Path, target: Path) -> None:
        out[path] = Link(rel_path(target, path))

    driver = Path("sys/bus/pci/drivers/mlx5_core")
    subnet = fabric.subnet([(profile.name, profile)])  # the node alone on its rails
    lids = fabric.port_lids(subnet)
    nodes = profile.topology.numa_nodes
    ncpus = cpu_count(profile)
    umad = 0
    for hca in hcas:
        ib = hca.spec
        base = hca_dir(hca, behind)
        slot = PciName.of(hca.bus_id).slot
        node = hca.numa_node
        cpus = numa_cpus(node, profile)
        for key, value in (
            ("vendor", f"0x{MELLANOX_VENDOR:04x}"),
            ("device", f"0x{ib.device_id:04x}"),
            ("class", f"0x{ib.pci_class:06x}"),
            ("revision", f"0x{ib.revision:02x}"),
            ("subsystem_vendor", f"0x{MELLANOX_VENDOR:04x}"),
            ("subsystem_device", f"0x{ib.subsystem_device_id:04x}"),
            ("numa_node", str(node if nodes > 1 else -1)),
            ("local_cpulist", cpulist(cpus)),
            ("local_cpus", cpumask(cpus, ncpus)),
            ("enable", "1"),
            ("power_state", "D0"),
            ("current_link_speed", LINK_SPEEDS[ib.pcie_gen]),
            ("current_link_width", str(ib.pcie_width)),
            ("max_link_speed", LINK_SPEEDS[ib.pcie_gen]),
            ("max_link_width", str(ib.pcie_width)),
            ("modalias", modalias(hca)),
        ):
            text(base / key, value)
        out[base / "config"] = config_space(hca, hca.index)
        bar = MMIO_BASE + hca.index * BAR_SIZE
        out[base / "resource"] = resource_file([(bar, BAR_SIZE), *[(0, 0)] * 6], BAR_FLAGS).encode()
        text(base / "uevent", f"DRIVER=mlx5_core\nPCI_SLOT_NAME={slot}\nMODALIAS={modalias(hca)}")
        link(base / "driver", driver)
        link(base / "subsystem", Path("sys/bus/pci"))
        link(Path("sys/bus/pci/devices") / slot, base)
        link(driver / slot, base)

        dev = base / "infiniband" / hca.name
        for key, value in (
            ("node_guid", format_guid(hca.node_guid)),
            ("sys_image_guid", format_guid(hca.node_guid)),
            ("node_type", "1: CA"),
            ("node_desc", f"{profile.name} {hca.name}"),
            ("fw_ver", ib.fw_version),
            ("hca_type", ib.hca_type),
            ("board_id", ib.board_id),
            ("hw_rev", ib.hw_rev),
        ):
            text(dev / key, value)
        link(dev / "device", base)
        link(Path("sys/class/infiniband") / hca.name, dev)
        for port in hca.ports:
            for rel, value in port_files(hca, port, lids.get(port.guid, port.lid)).items():
                text(dev / "ports" / str(port.number) / rel, value)
            for kind, minor in (("umad", umad), ("issm", ISSM_BASE + umad)):
                mad = base / "infiniband_mad" / f"{kind}{umad}"
                text(mad / "ibdev", hca.name)
                text(mad / "port", str(port.number))
                text(mad / "dev", f"{UVERBS_MAJOR}:{minor}")
                link(Path("sys/class/infiniband_mad") / f"{kind}{umad}", mad)
            umad += 1
        verbs = base / "infiniband_verbs" / f"uverbs{hca.index}"
        text(verbs / "ibdev", hca.name)
        text(verbs / "abi_version", "1")
        text(verbs / "dev", f"{UVERBS_MAJOR}:{UVERBS_BASE + hca.index}")
        link(verbs / "device", base)
        link(Path("sys/class/infiniband_verbs") / f"uverbs{hca.index}", verbs)
    text(Path("sys/class/infiniband_verbs/abi_version"), str(UVERBS_ABI))
    text(Path("sys/class/infiniband_mad/abi_version"), str(UMAD_ABI))
    out[FABRIC] = fabric.render(subnet).encode()
    for key in ("bind", "unbind", "new_id", "remove_id", "uevent"):
        out[driver / key] = b""
    return out


def device_nodes(profile: Profile) -> list[tuple[str, int, int]]:
    """The node's ``/dev/infiniband`` character devices (name, major, minor), as ib_uverbs, ib_umad
    and rdma_ucm make them: ``uverbsN`` per adapter, ``umadK`` and ``issmK`` per port, one
    ``rdma_cm``. libibverbs lists an adapter only when its uverbs node exists (``ibv_devices``)."""
    out: list[tuple[str, int, int]] = []
    umad = 0
    for hca in adapters(profile):
        out.append((f"uverbs{hca.index}", UVERBS_MAJOR, UVERBS_BASE + hca.index))
        for _port in hca.ports:
            out += [(f"umad{umad}", UVERBS_MAJOR, umad), (f"issm{umad}", UVERBS_MAJOR, ISSM_BASE + umad)]
            umad += 1
    return [*out, RDMA_CM] if out else out


# ---- the subnet around the nodes ---------------------------------------------------------


def write_fabric(nodes: Sequence[tuple[str, Profile, Path]]) -> None:
    """The subnet of every node of a cluster (host name, profile as staged, staged root), written
    into each node's tree, with each adapter's node description ``<host> mlx5_N`` as rdma-ndd sets
    it on a real host and each port's LID as the subnet manager gives it; links as the ports are
    now (see :func:`sync_fabric`)."""
    subnet = fabric.subnet([(host, prof) for host, prof, _ in nodes])
    text = fabric.render(subnet)
    lids = fabric.port_lids(subnet)  # the subnet manager's: two ports whose GUIDs hash alike get two
    for host, prof, root in nodes:
        if (root / FABRIC).parent.is_dir():
            write_value(root / FABRIC, text.rstrip("\n"))
        for hca in adapters(prof):
            dev = root / "sys/class/infiniband" / hca.name
            if (dev / "node_desc").exists():
                write_value(dev / "node_desc", f"{host} {hca.name}")
            for port in hca.ports:
                pdir = dev / "ports" / str(port.number)
                lid = lids.get(port.guid)
                if lid is not None and pdir.is_dir() and port_up(pdir):
                    write_value(pdir / "lid", f"0x{lid:x}")
    sync_fabric([root for _, _, root in nodes])


def sync_fabric(roots: Sequence[Path]) -> None:
    """Each node's fabric file with every link's state and every adapter port's counters as the
    ports under ``roots`` show them now: a port taken down on one node is a link down in every
    node's view, and ``perfquery <LID>`` from another node reads the port's counters as they are."""
    states: dict[tuple[str, str], bool] = {}
    counters: list[str] = []
    for root in roots:
        for hca, port in ports(root):
            dev = root / "sys/class/infiniband" / f"mlx5_{hca}"
            guid = dev.joinpath("node_guid").read_text().strip().replace(":", "")
            pdir = dev / "ports" / str(port)
            states[(guid, str(port))] = port_up(pdir)
            values = sorted((c.name, c.read_text().strip()) for c in (pdir / "counters").iterdir() if c.is_file())
            counters.append(f"counters {guid} {port} " + " ".join(f"{name}={value}" for name, value in values))
    for root in roots:
        path = root / FABRIC
        if not path.exists():
            continue
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("counters ")]
        for i, line in enumerate(lines):
            words = line.split()
            if words[:1] != ["link"]:
                continue
            ends = [(words[1], words[2]), (words[3], words[4])]
            known = [states[e] for e in ends if e in states]
            if known:
                words[5] = str(int(all(known)))
                lines[i] = " ".join(words)
        write_value(path, "\n".join(lines + counters))
