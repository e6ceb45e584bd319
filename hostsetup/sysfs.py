"""The driver's procfs and sysfs footprint, staged as plain files under a root.

``write_tree(profile, root)`` writes, as a pure function of the profile::

    root/sys/devices/pci<DDDD>:<BB>/<DDDD>:<BB>:<DD>.<F>/   one PCI function per GPU (vendor, device,
                                                           class, config space, numa_node, local_cpus...)
    root/sys/bus/pci/devices/<bus id>  -> ../../../devices/pci<DDDD>:<BB>/<bus id>
    root/sys/bus/pci/drivers/nvidia/   bound devices, bind/unbind, module link
    root/sys/module/nvidia{,_uvm,_modeset,_drm}/           version, initstate, taint, refcnt
    root/proc/driver/nvidia/           version, params, registry, capabilities/ (MIG: config, monitor,
                                       the access files of declared instances), gpus/<bus id>/information
                                       and fabric-imex-mgmt (the IMEX daemons' capability)
    root/proc/driver/nvidia-caps/mig-minors   every MIG capability minor, as the driver lists them
    root/proc/modules                  the four nvidia modules as /proc/modules lines
    root/sys/class/dmi/id/             the machine's DMI names (GFD's ``nvidia.com/gpu.machine``)

Every GPU sits directly on its own root bus (``pci0000:53/0000:53:00.0``), as the real
capture's pass-through GPU does: hwloc (inside nvidia-smi) and lspci need no bridge to
place it. Names follow the kernel: 4-digit lowercase domain (more digits only when the
domain needs them), lowercase hex. Contents follow the real H200 capture in
``tests/captures/h200/`` with the profile's ids, link speeds, NUMA layout and driver version.

A C program sees these files at their real paths through ``native/sysfs`` (LD_PRELOAD,
``MOKKA_SYSFS_ROOT=root``); Go programs need them bind-mounted.

One file, though long: it is the one writer of the driver's procfs and sysfs trees; the trees
refer to each other (PCI functions, bus links, driver bindings, MIG capabilities), so their
names are made in one place.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gpumodel import mig, mig_state, pcie, state
from gpumodel.profile import Device, Profile, parse_bus_id
from gpumodel.state import _cpu_mask

# Kernel strings for PCIe link speeds (drivers/pci/pci-sysfs.c, pci_speed_string()).
LINK_SPEEDS = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
    6: "64.0 GT/s PCIe",
    7: "128.0 GT/s PCIe",
}
# IORESOURCE_MEM | PREFETCH | MEM_64 | SIZEALIGN | the BAR's low flag bits (64-bit prefetchable), as captured.
BAR_FLAGS = 0x14220C
BAR0_SIZE = 16 << 20
BAR4_SIZE = 32 << 20
MMIO_BASE = 0x1000_0000_0000
MODULES = (  # name, size, users, used by -- as /proc/modules prints them
    ("nvidia_drm", 135168, 0, ""),
    ("nvidia_modeset", 1638400, 1, "nvidia_drm,"),
    ("nvidia_uvm", 1830912, 0, ""),
    ("nvidia", 14299136, 2, "nvidia_uvm,nvidia_modeset,"),
)
MODULE_ADDRESSES = {
    "nvidia_drm": 0xFFFFFFFFC1A00000,
    "nvidia_modeset": 0xFFFFFFFFC1800000,
    "nvidia_uvm": 0xFFFFFFFFC080C000,
    "nvidia": 0xFFFFFFFFC0400000,
}
# /proc/driver/nvidia/params of the capture (580.159.04); NvLinkDisable follows the profile.
PARAMS = """\
ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: {nvlink_disable}
RmProfilingAdminOnly: 0
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
CoherentGPUMemoryMode: ""
RegistryDwords: ""
RegistryDwordsPerDevice: ""
RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
"""
POWER = """\
Runtime D3 status:          Disabled by default
Video Memory:               Active

GPU Hardware Support:
 Video Memory Self Refresh: Not Supported
 Video Memory Off:          Not Supported

S0ix Power Management:
 Platform Support:          Not Supported
 Status:                    Disabled

Notebook Dynamic Boost:     Not Supported
"""
# Architectures the open kernel module (and GSP firmware) drives; older ones get the proprietary wording.
OPEN_MODULE_ARCHS = {"Turing", "Ampere", "Ada", "Hopper", "Blackwell"}
DRIVER_DATE = "Tue Apr  8 12:00:00 UTC 2025"


@dataclass(frozen=True)
class PciName:
    """A PCI function's address as the kernel spells it in sysfs."""

    domain: int
    bus: int
    device: int
    function: int

    @classmethod
    def of(cls, bus_id: str) -> PciName:
        return cls(*parse_bus_id(bus_id))

    @property
    def slot(self) -> str:
        """``0000:53:00.0`` (the kernel prints the domain with at least 4 digits)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @property
    def root_bus(self) -> str:
        """``pci0000:53``: the host bridge directory under /sys/devices."""
        return f"pci{self.domain:04x}:{self.bus:02x}"


def sysfs_name(device: Device) -> str:
    """The GPU's directory name under /sys/bus/pci/devices and /proc/driver/nvidia/gpus."""
    return PciName.of(device.bus_id).slot


def device_dir(device: Device, switch: pcie.Switch | None = None) -> Path:
    """The GPU's PCI function directory, relative to the root: on its own root bus, or behind
    ``switch`` (the PCIe switch it shares with its InfiniBand adapter, :mod:`gpumodel.pcie`)."""
    return function_dir(device.bus_id, switch)


def function_dir(bus_id: str, switch: pcie.Switch | None = None) -> Path:
    """The directory of the PCI function ``bus_id``: under its root bus, through ``switch``'s
    bridges when it sits behind one."""
    if switch is None:
        name = PciName.of(bus_id)
        return Path("sys/devices") / name.root_bus / name.slot
    chain = [PciName.of(b) for b in switch.path(bus_id)]
    return Path("sys/devices", chain[0].root_bus, *(c.slot for c in chain))


def irq(device: Device) -> int:
    return state.irq(device)


def numa_node(device: Device, profile: Profile) -> int:
    """-1 (no NUMA information, as the capture's single-node machine shows) unless the profile has several."""
    return device.numa_node if profile.topology.numa_nodes > 1 else -1


def node_cpus(device: Device, profile: Profile) -> list[int]:
    """The CPUs local to the GPU: its NUMA node's share, the same split the state file's affinity uses."""
    words = _cpu_mask(device, profile)
    return [i for i in range(64 * len(words)) if words[i // 64] >> (i % 64) & 1]


def cpu_count(profile: Profile) -> int:
    return profile.topology.cpus or (os.cpu_count() or 1)


def numa_cpus(node: int, profile: Profile) -> list[int]:
    """The CPUs of NUMA node ``node``: an even split of the node's CPUs, the last node taking the rest."""
    total, nodes = cpu_count(profile), profile.topology.numa_nodes
    per_node = max(1, total // nodes)
    return list(range(node * per_node, total if node == nodes - 1 else (node + 1) * per_node))


def cpulist(cpus: list[int]) -> str:
    """``0-55,112-167``: the kernel's %*pbl format."""
    ranges: list[str] = []
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        ranges.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(ranges)


def cpumask(cpus: list[int], nbits: int) -> str:
    """``ffff`` / ``00000000,ffffffff``: the kernel's %*pb format, 32-bit words, nbits wide."""
    nbits = max(nbits, max(cpus, default=-1) + 1, 1)
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    words = -(-nbits // 32)
    chunks = [f"{(value >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words))]
    first_bits = nbits - 32 * (words - 1)
    chunks[0] = chunks[0][8 - -(-first_bits // 4) :]
    return ",".join(chunks)


@dataclass(frozen=True)
class Bars:
    bar0: int  # registers
    bar1: int  # framebuffer aperture (resource2)
    bar3: int  # resource4
    bar1_size: int

    @classmethod
    def of(cls, device: Device) -> Bars:
        bar1_size = _pow2(device.spec.memory.bar1_total_mib << 20)
        stride = _pow2(bar1_size + BAR4_SIZE + BAR0_SIZE)
        base = MMIO_BASE + device.index * stride
        return cls(bar0=base + bar1_size + BAR4_SIZE, bar1=base, bar3=base + bar1_size, bar1_size=bar1_size)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def resource_file(rows: list[tuple[int, int]], flags: int) -> str:
    """A PCI function's ``resource`` file: one ``start end flags`` line per (start, size) row, a
    row of zeros where the size is 0 (BARs 0-5, then the expansion ROM)."""
    lines = []
    for start, size in rows:
        if size:
            lines.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}")
        else:
            lines.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
    return "\n".join(lines) + "\n"


def resource(device: Device) -> str:
    b = Bars.of(device)
    rows = [(b.bar0, BAR0_SIZE), (0, 0), (b.bar1, b.bar1_size), (0, 0), (b.bar3, BAR4_SIZE), (0, 0), (0, 0)]
    return resource_file(rows, BAR_FLAGS)


def config_space(device: Device) -> bytes:
    """4 KiB of PCIe config space: the capture's header and capability chain with the profile's ids.

    Standard header (ids, command/status, class, 64-bit prefetchable BARs 0/1/3, subsystem,
    INTA), then PM (0x40) -> MSI (0x48) -> PCI Express endpoint (0x60) -> MSI-X (0xb0), and
    the extended capabilities AER (0x100) -> Device Serial Number (0x148).
    """
    p = device.spec.pci
    b = Bars.of(device)
    cfg = bytearray(4096)

    def put(fmt: str, off: int, *values: int) -> None:
        struct.pack_into("<" + fmt, cfg, off, *values)

    put("HH", 0x00, p.vendor_id, p.device_id)
    put("HH", 0x04, 0x0546, 0x0010)  # memory space, bus master, parity, SERR, INTx off; capability list
    put("I", 0x08, (p.class_code << 8) | p.revision)
    put("I", 0x0C, 0)  # cache line, latency, header type 0 (endpoint), BIST
    for off, addr in ((0x10, b.bar0), (0x18, b.bar1), (0x20, b.bar3)):
        put("II", off, (addr & 0xFFFFFFF0) | 0xC, addr >> 32)
    put("HH", 0x2C, p.subsystem_vendor_id, p.subsystem_device_id)
    put("B", 0x34, 0x40)
    put("BB", 0x3C, 0xFF, 0x01)  # interrupt line (MSI in use), pin INTA
    # Power management
    put("BBHI", 0x40, 0x01, 0x48, 0x0013, 0x00000008)
    # MSI: 64-bit, per-vector masking, 16 vectors capable
    put("BBH", 0x48, 0x05, 0x60, 0x0388)
    # PCI Express capability (version 2, endpoint)
    cur_gen = p.current_link_gen or p.max_link_gen
    cur_width = p.current_link_width or p.max_link_width
    dev_gen = p.device_max_link_gen or p.max_link_gen
    put("BBH", 0x60, 0x10, 0xB0, 0x0002)
    put("I", 0x64, 0x112C8021)  # DevCap
    put("HH", 0x68, 0x5134, 0x0000)  # DevCtl, DevSta
    put("I", 0x6C, 0x00457800 | (p.max_link_width << 4) | dev_gen)  # LnkCap: ASPM L1, max width/speed
    put("HH", 0x70, 0x0000, 0x1000 | (cur_width << 4) | cur_gen)  # LnkCtl, LnkSta (slot clock)
    put("I", 0x84, 0x00070813)  # DevCap2
    put("HH", 0x88, 0x1040, 0x0000)  # DevCtl2
    put("I", 0x8C, 0x01800000 | (((1 << dev_gen) - 1) << 1))  # LnkCap2: supported speeds vector
    put("HH", 0x90, p.max_link_gen, 0x005E)  # LnkCtl2 (target speed), LnkSta2
    # MSI-X (in use): 9 vectors, table and PBA in BAR0
    put("BBHII", 0xB0, 0x11, 0x00, 0x8008, 0x00B90000, 0x00BA0000)  # enabled
    # Extended: AER v2 -> Device Serial Number v1 -> end
    put("I", 0x100, 0x0001 | (2 << 16) | (0x148 << 20))
    put("III", 0x104, 0, 0, 0x00462030)  # uncorrectable status/mask/severity
    put("I", 0x110, 0)
    put("I", 0x114, 0x0000E000)  # correctable mask
    put("I", 0x148, 0x0003 | (1 << 16) | (0 << 20))
    put("Q", 0x14C, _serial_number(device))
    return bytes(cfg)


def _serial_number(device: Device) -> int:
    digits = "".join(c for c in device.uuid if c in "0123456789abcdefABCDEF")
    return int(digits[-16:], 16) if digits else device.index


def modalias(device: Device) -> str:
    p = device.spec.pci
    cls = p.class_code
    return (
        f"pci:v{p.vendor_id:08X}d{p.device_id:08X}sv{p.subsystem_vendor_id:08X}sd{p.subsystem_device_id:08X}"
        f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
    )


def uevent(device: Device) -> str:
    p = device.spec.pci
    return (
        "DRIVER=nvidia\n"
        f"PCI_CLASS={p.class_code:X}\n"
        f"PCI_ID={p.vendor_id:04X}:{p.device_id:04X}\n"
        f"PCI_SUBSYS_ID={p.subsystem_vendor_id:04X}:{p.subsystem_device_id:04X}\n"
        f"PCI_SLOT_NAME={sysfs_name(device)}\n"
        f"MODALIAS={modalias(device)}\n"
    )


def dma_bits(device: Device) -> int:
    return 52 if device.spec.architecture in ("Hopper", "Blackwell") else 47


def version_text(profile: Profile) -> str:
    """/proc/driver/nvidia/version with the profile's driver version, worded like the real module."""
    version = profile.driver.version
    archs = {d.spec.architecture for d in profile.devices()}
    if archs <= OPEN_MODULE_ARCHS:
        first = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (mokka@)  "
    else:
        first = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {DRIVER_DATE}"
    return f"{first}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"


def information(device: Device, profile: Profile) -> str:
    """/proc/driver/nvidia/gpus/<bus id>/information, laid out (tabs included) like the capture."""
    bits = dma_bits(device)
    lines = [
        f"Model: \t\t {device.spec.name}",
        f"IRQ:   \t\t {irq(device)}",
        f"GPU UUID: \t {device.uuid}",
        f"Video BIOS: \t {device.spec.vbios_version.lower()}",
        "Bus Type: \t PCIe",
        f"DMA Size: \t {bits} bits",
        f"DMA Mask: \t 0x{(1 << bits) - 1:x}",
        f"Bus Location: \t {sysfs_name(device)}",
        f"Device Minor: \t {device.index}",
    ]
    if device.spec.architecture in OPEN_MODULE_ARCHS:
        lines.append(f"GPU Firmware: \t {profile.driver.version}")
    lines.append("GPU Excluded:\t No")
    return "\n".join(lines) + "\n"


def machine_name(profile: Profile) -> str:
    """DMI ``product_name``: says what the node is, a Mokka node with the profile's GPUs."""
    return f"Mokka {profile.gpu_count}x {profile.devices()[0].spec.name}"


def proc_modules() -> str:
    """/proc/modules lines of the four nvidia modules (the same for every profile)."""
    out = []
    for name, size, users, used_by in MODULES:
        out.append(f"{name} {size} {users} {used_by or '-'} Live 0x{MODULE_ADDRESSES[name]:016x} (O)")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Link:
    """A symlink of the tree and its (relative) target."""

    target: str


def files(profile: Profile) -> dict[Path, bytes | Link]:
    """Every file of the tree: relative path -> content, or a ``Link`` for a symlink."""
    out: dict[Path, bytes | Link] = {}

    def text(path: str | Path, value: str) -> None:
        out[Path(path)] = value.encode()

    def link(path: str | Path, target: str) -> None:
        out[Path(path)] = Link(target)

    devices = profile.devices()
    nbits = cpu_count(profile)
    drivers = Path("sys/bus/pci/drivers/nvidia")
    behind = pcie.switches(profile)
    for d in devices:
        p = d.spec.pci
        base = device_dir(d, behind.get(d.index))
        name = sysfs_name(d)
        cpus = node_cpus(d, profile)

        for key, value in (
            ("vendor", f"0x{p.vendor_id:04x}"),
            ("device", f"0x{p.device_id:04x}"),
            ("class", f"0x{p.class_code:06x}"),
            ("revision", f"0x{p.revision:02x}"),
            ("subsystem_vendor", f"0x{p.subsystem_vendor_id:04x}"),
            ("subsystem_device", f"0x{p.subsystem_device_id:04x}"),
            ("numa_node", str(numa_node(d, profile))),
            ("local_cpulist", cpulist(cpus)),
            ("local_cpus", cpumask(cpus, nbits)),
            ("irq", str(irq(d))),
            ("enable", "1"),
            ("current_link_speed", LINK_SPEEDS[p.current_link_gen or p.max_link_gen]),
            ("current_link_width", str(p.current_link_width or p.max_link_width)),
            ("max_link_speed", LINK_SPEEDS[p.device_max_link_gen or p.max_link_gen]),
            ("max_link_width", str(p.max_link_width)),
            ("dma_mask_bits", str(dma_bits(d))),
            ("consistent_dma_mask_bits", str(dma_bits(d))),
            ("ari_enabled", "0"),
            ("broken_parity_status", "0"),
            ("d3cold_allowed", "1"),
            ("msi_bus", "1"),
            ("power_state", "D0"),
            ("driver_override", "(null)"),
            ("reset_method", "flr bus"),
            ("modalias", modalias(d)),
        ):
            text(base / key, value + "\n")
        text(base / "resource", resource(d))
        text(base / "uevent", uevent(d))
        out[base / "config"] = config_space(d)
        link(base / "driver", rel_path(drivers, base / "driver"))
        link(base / "subsystem", rel_path(Path("sys/bus/pci"), base / "subsystem"))
        bus_link = Path("sys/bus/pci/devices") / name
        link(bus_link, rel_path(base, bus_link))
        link(drivers / name, rel_path(base, drivers / name))

        gpu = Path("proc/driver/nvidia/gpus") / name
        text(gpu / "information", information(d, profile))
        text(gpu / "power", POWER)
        text(gpu / "registry", 'Binary: ""\n')

    for key in ("bind", "unbind", "new_id", "remove_id"):
        text(drivers / key, "")
    text(drivers / "uevent", "")
    link(drivers / "module", rel_path(Path("sys/module/nvidia"), drivers / "module"))
    for name, _size, users, _used in MODULES:
        mod = Path("sys/module") / name
        text(mod / "version", profile.driver.version + "\n")
        text(mod / "initstate", "live\n")
        text(mod / "taint", "O\n")
        text(mod / "refcnt", f"{users}\n")

    dmi = Path("sys/class/dmi/id")
    text(dmi / "sys_vendor", "Mokka\n")
    text(dmi / "product_name", machine_name(profile) + "\n")
    text(dmi / "board_vendor", "Mokka\n")
    text(dmi / "board_name", machine_name(profile) + "\n")

    nvlink = any(d.spec.nvlink.links > 0 for d in devices)
    proc = Path("proc/driver/nvidia")
    text(proc / "version", version_text(profile))
    text(proc / "params", PARAMS.replace("{nvlink_disable}", "0" if nvlink else "1"))
    text(proc / "registry", 'Binary: ""\n')
    text(proc / "capabilities/mig/config", "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    text(proc / "capabilities/mig/monitor", "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    # IMEX daemons' capability (NVIDIA's DRA driver reads it for a ComputeDomain daemon's claim)
    imex_mgmt = f"DeviceFileMinor: {mig.FABRIC_IMEX_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    text(proc / "capabilities/fabric-imex-mgmt", imex_mgmt)
    # MIG: every capability the driver could hand out (what the device plugin and the container
    # toolkit read), and the access files of the GPU and compute instances the profile declares
    text("proc/driver/nvidia-caps/mig-minors", mig.mig_minors_text())
    for d in devices:
        caps = proc / "capabilities" / f"gpu{d.index}" / "mig"
        for gi in mig_state.initial_layout(d.spec):
            text(caps / f"gi{gi.id}" / "access", cap_file(mig.cap_minor(d.index, gi.id)))
            for ci in gi.compute:
                text(caps / f"gi{gi.id}" / f"ci{ci.id}" / "access", cap_file(mig.cap_minor(d.index, gi.id, ci.id)))
    text("proc/modules", proc_modules())
    out.update(nvswitch_files(profile))
    for index, switch in behind.items():
        out.update(bridge_files(switch, devices[index], profile))
    from . import infiniband  # the adapters' trees hang under their PCI functions: built with this module's names

    out.update(infiniband.files(profile, behind))
    return out


# A PCIe switch's bridges (gpumodel/pcie.py): the CPU's root port, then the switch's upstream and
# downstream ports (a Broadcom PEX89000-class Gen5 switch, as HGX boards carry). lspci and hwloc
# read a bridge's bus range from its config space (primary, secondary, subordinate at 0x18).
BRIDGE_CLASS = 0x060400
ROOT_PORT = (0x8086, 0x352A, 4)  # vendor, device, PCIe port type (4: root port)
SWITCH_PORTS = ((0x1000, 0xC030, 5), (0x1000, 0xC030, 6))  # upstream (5), downstream (6)


def bridge_config_space(ids: tuple[int, int, int], primary: int, secondary: int, subordinate: int, gen: int) -> bytes:
    vendor, device, port_type = ids
    cfg = bytearray(4096)
    struct.pack_into("<HHHH", cfg, 0x00, vendor, device, 0x0547, 0x0010)
    struct.pack_into("<I", cfg, 0x08, (BRIDGE_CLASS << 8) | 0x00)
    struct.pack_into("<I", cfg, 0x0C, 0x00010000)  # header type 1 (bridge)
    struct.pack_into("<BBBB", cfg, 0x18, primary, secondary, subordinate, 0)
    struct.pack_into("<B", cfg, 0x34, 0x40)
    struct.pack_into("<BBH", cfg, 0x40, 0x10, 0x00, 0x0002 | (port_type << 4))  # PCI Express v2, port type
    struct.pack_into("<I", cfg, 0x4C, 0x00400000 | (16 << 4) | gen)  # LnkCap: x16
    struct.pack_into("<HH", cfg, 0x50, 0x0000, 0x2000 | (16 << 4) | gen)  # LnkSta: x16, DLL active
    return bytes(cfg)


def bridge_files(switch: pcie.Switch, gpu: Device, profile: Profile) -> dict[Path, bytes | Link]:
    """The root port and the switch's ports above ``gpu`` and its adapter."""
    out: dict[Path, bytes | Link] = {}
    cpus = node_cpus(gpu, profile)
    gen = gpu.spec.pci.max_link_gen
    kinds = [ROOT_PORT, *SWITCH_PORTS, SWITCH_PORTS[1]]
    for n, (bus_id, secondary, subordinate) in enumerate(switch.bridges()):
        path = switch.path(switch.adapter)[: n + 1] if n < 3 else switch.path(gpu.bus_id)[:3]
        base = Path("sys/devices", PciName.of(path[0]).root_bus, *(PciName.of(b).slot for b in path))
        vendor, device, _ = kinds[n]
        primary = PciName.of(bus_id).bus
        for key, value in (
            ("vendor", f"0x{vendor:04x}"),
            ("device", f"0x{device:04x}"),
            ("class", f"0x{BRIDGE_CLASS:06x}"),
            ("revision", "0x00"),
            ("subsystem_vendor", f"0x{vendor:04x}"),
            ("subsystem_device", "0x0000"),
            ("numa_node", str(numa_node(gpu, profile))),
            ("local_cpulist", cpulist(cpus)),
            ("local_cpus", cpumask(cpus, cpu_count(profile))),
            ("enable", "1"),
            ("power_state", "D0"),
            ("current_link_speed", LINK_SPEEDS[gen]),
            ("current_link_width", "16"),
            ("max_link_speed", LINK_SPEEDS[gen]),
            ("max_link_width", "16"),
            ("secondary_bus_number", str(secondary)),
            ("subordinate_bus_number", str(subordinate)),
            ("modalias", f"pci:v{vendor:08X}d{device:08X}sv{vendor:08X}sd00000000bc06sc04i00"),
        ):
            out[base / key] = (value + "\n").encode()
        out[base / "config"] = bridge_config_space(kinds[n], primary, secondary, subordinate, gen)
        out[base / "resource"] = resource_file([(0, 0)] * 7, 0).encode()
        out[base / "subsystem"] = Link(rel_path(Path("sys/bus/pci"), base / "subsystem"))
        bus_link = Path("sys/bus/pci/devices") / PciName.of(bus_id).slot
        out[bus_link] = Link(rel_path(base, bus_link))
    return out


# NVSwitch PCI functions of HGX baseboards (profile topology.nvswitches): lspci shows them as
# "Bridge [0680]: NVIDIA Corporation ... NVSwitch" (a real HGX H100: four at cf..d2:00.0);
# hwloc's NVML plugin looks up each NVLink's far end (nvmlDeviceGetNvLinkRemotePciInfo) by
# bus id and accepts a bridge (class 0x06) of vendor 0x10de as a switch. Class 0x0680 with
# prog-if 01, as hwloc's plugin notes for NVSwitches.
NVSWITCH_CLASS = 0x068001
# Its one BAR: 32 MiB of 64-bit registers, in a window below the GPUs' (NVIDIA's PCI tools, e.g.
# go-nvlib behind the MIG manager, read every NVIDIA function's resource file and fail without it).
NVSWITCH_BAR0_SIZE = 32 << 20
NVSWITCH_MMIO_BASE = MMIO_BASE - (1 << 32)
NVSWITCH_BAR_FLAGS = 0x140200  # memory, 64-bit, not prefetchable


def nvswitch_resource(index: int) -> str:
    start = NVSWITCH_MMIO_BASE + index * NVSWITCH_BAR0_SIZE
    return resource_file([(start, NVSWITCH_BAR0_SIZE), *[(0, 0)] * 6], NVSWITCH_BAR_FLAGS)


def nvswitch_config_space(device_id: int) -> bytes:
    cfg = bytearray(4096)
    struct.pack_into("<HHHH", cfg, 0x00, 0x10DE, device_id, 0x0146, 0x0010)
    struct.pack_into("<I", cfg, 0x08, (NVSWITCH_CLASS << 8) | 0xA1)
    struct.pack_into("<HH", cfg, 0x2C, 0x10DE, 0x0000)
    return bytes(cfg)


def nvswitch_files(profile: Profile) -> dict[Path, bytes | Link]:
    """The profile's NVSwitches as PCI functions of their own root buses (no driver bound)."""
    out: dict[Path, bytes | Link] = {}
    switches = profile.topology.nvswitches
    nodes = profile.topology.numa_nodes
    cpus_total = cpu_count(profile)
    for i, bus_id in enumerate(switches):
        name = PciName.of(bus_id)
        base = Path("sys/devices") / name.root_bus / name.slot
        node = min(nodes - 1, i * nodes // len(switches))
        cpus = numa_cpus(node, profile)
        device_id = profile.topology.nvswitch_device_id
        for key, value in (
            ("vendor", "0x10de"),
            ("device", f"0x{device_id:04x}"),
            ("class", f"0x{NVSWITCH_CLASS:06x}"),
            ("revision", "0xa1"),
            ("subsystem_vendor", "0x10de"),
            ("subsystem_device", "0x0000"),
            ("numa_node", str(node if nodes > 1 else -1)),
            ("local_cpulist", cpulist(cpus)),
            ("local_cpus", cpumask(cpus, cpus_total)),
            ("enable", "1"),
            ("power_state", "D0"),
            ("modalias", f"pci:v000010DEd0000{device_id:04X}sv000010DEsd00000000bc06sc80i01"),
        ):
            out[base / key] = (value + "\n").encode()
        out[base / "config"] = nvswitch_config_space(device_id)
        out[base / "resource"] = nvswitch_resource(i).encode()
        out[base / "subsystem"] = Link(rel_path(Path("sys/bus/pci"), base / "subsystem"))
        bus_link = Path("sys/bus/pci/devices") / name.slot
        out[bus_link] = Link(rel_path(base, bus_link))
    return out


def cap_file(minor: int) -> str:
    """A capability's procfs file: the device minor and the mode of its /dev/nvidia-caps node."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def rel_path(target: Path, link: Path) -> str:
    return os.path.relpath(target, link.parent)


def directories(profile: Profile) -> list[Path]:
    """Directories the tree holds beyond the parents of its files: empty ones. ``sys/bus/pci/slots``
    is there (and empty) so that, through the redirect, the host's slots do not name the mock's functions."""
    caps = [Path("proc/driver/nvidia/capabilities") / f"gpu{d.index}" / "mig" for d in profile.devices()]
    return [Path("sys/bus/pci/slots"), *caps]


TOPS = ("sys", "proc")


def write_tree(profile: Profile, root: Path) -> None:
    """Write the procfs/sysfs tree of ``profile`` into ``root``: ``root/sys`` and ``root/proc``."""
    tree, empty = files(profile), directories(profile)
    for top in TOPS:
        write_part(tree, empty, top, root / top)


def write_part(tree: dict[Path, bytes | Link], empty: list[Path], top: str, dest: Path) -> None:
    """Write the part of ``tree`` (``files()``) and ``empty`` (``directories()``) under ``top`` ("sys"
    or "proc") into ``dest``, a new or empty directory (directories 0755, files 0644 whatever the umask).

    Nothing is synced or written atomically: host setup builds each part under a temporary name
    and moves it into place whole, through its journal (``Journal.install_tree``).
    """
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(errno.EEXIST, "not an empty directory", str(dest))
    made = {dest}

    def mkdirs(path: Path) -> None:
        missing = []
        while path not in made:
            missing.append(path)
            path = path.parent
        for d in reversed(missing):
            d.mkdir()
            d.chmod(0o755)
            made.add(d)

    for rel in empty:
        if rel.parts[0] == top:
            mkdirs(dest / rel.relative_to(top))
    for rel, content in tree.items():
        if rel.parts[0] != top:
            continue
        path = dest / rel.relative_to(top)
        mkdirs(path.parent)
        if isinstance(content, Link):
            os.symlink(content.target, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
                os.fchmod(fh.fileno(), 0o644)
