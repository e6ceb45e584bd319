"""Compile a validated profile into the binary state the native libraries map, and write
it: into a library file (how Mokka stages it) or a state file of its own.

The layout comes from ``native/mokka_state.h`` through cffi (ABI mode: cffi computes the
same offsets the C compiler does), so the state has one definition. Live changes go
through one writer path: the file's flock, then native/writer/'s latch publish, in place
(never by rename: a bind mount pins the inode).

One file, though long: it is the one writer of the state's binary layout (compile, embed,
locate, check, update under the lock); a second file would be a second writer.
"""

from __future__ import annotations

import fcntl
import functools
import mmap
import os
import re
import uuid as uuidlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cffi

from . import atomic, dynamic, infiniband, mig_state, pcie
from .native import STATE_WRITER, header_path, library_path
from .profile import ATOMIC_CAPS, BRANDS, MIB, Architecture, Device, Profile, parse_bus_id

COMPUTE_MODES = {"Default": 0, "Exclusive_Thread": 1, "Prohibited": 2, "Exclusive_Process": 3}
VIRT_MODES = {"None": 0, "Pass-Through": 1, "vGPU": 2, "Host vGPU": 3, "Host vSGA": 4}
FABRIC_STATES = {"Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}
# nvmlTemperatureThresholds_t
TH_SHUTDOWN, TH_SLOWDOWN, TH_MEM_MAX, TH_GPU_MAX = 0, 1, 2, 3
TH_ACOUSTIC_MIN, TH_ACOUSTIC_CURR, TH_ACOUSTIC_MAX = 4, 5, 6  # target temperature and its range


class StateError(Exception):
    """A state file is missing, truncated or of another layout."""


@functools.cache
def ffi() -> cffi.FFI:
    """A cffi FFI that knows the state structs, parsed from the C header."""
    text = header_path().read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = []
    for line in text.splitlines():
        if line.startswith("#"):
            if re.match(r"#define\s+MOKKA_\w+\s+(0x[0-9a-fA-F]+|\d+)\s*$", line):
                lines.append(line)
            continue
        lines.append(line)
    out = cffi.FFI()
    out.cdef("\n".join(lines))
    return out


@functools.cache
def _lib() -> Any:
    return ffi().dlopen(None)


def const(name: str) -> int:
    return int(getattr(_lib(), name))


def na() -> int:
    return const("MOKKA_NA")


def _opt(value: int | None) -> int:
    return na() if value is None else value


def _put_str(field: Any, text: str) -> None:
    data = text.encode()
    size = len(field)
    if len(data) >= size:
        raise ValueError(f"{text!r} is longer than {size - 1} bytes")
    ffi().memmove(field, data + b"\0", len(data) + 1)


FIRST_IRQ = 41  # the real H200's GPU interrupt; further GPUs count up


def irq(device: Device) -> int:
    """The GPU's interrupt line, shared by NVML and the staged sysfs/procfs files."""
    return FIRST_IRQ + device.index


def _cpu_mask(device: Device, profile: Profile) -> list[int]:
    cpus = profile.topology.cpus or (os.cpu_count() or 1)
    nodes = profile.topology.numa_nodes
    per_node = max(1, cpus // nodes)
    first = device.numa_node * per_node
    last = cpus if device.numa_node == nodes - 1 else first + per_node
    words = [0] * const("MOKKA_CPUSET_WORDS")
    for cpu in range(first, min(last, 64 * len(words))):
        words[cpu // 64] |= 1 << (cpu % 64)
    return words


# CUDA cores per SM by compute capability (NVIDIA's CUDA Programming Guide): 64 on Turing
# (7.5) and GA100 (8.0), 128 from GA10x (8.6) on. Boards whose profile has no core count
# (the captures say N/A) get their SM count from NVIDIA's published figures.
CORES_PER_SM = {"7.5": 64, "8.0": 64}
SM_COUNT_BY_CC = {"10.0": 148, "10.3": 160}  # B200/GB200 (2 x 74 SMs), Blackwell Ultra


def multiprocessors(compute_capability: str, cuda_cores: int | None) -> int:
    """The SM count CUDA reports (cuDeviceGetAttribute MULTIPROCESSOR_COUNT)."""
    if cuda_cores:
        return cuda_cores // CORES_PER_SM.get(compute_capability, 128)
    return SM_COUNT_BY_CC.get(compute_capability, 0)


def fill_gpu(g: Any, device: Device, profile: Profile) -> None:
    """Write one GPU record from a concrete device."""
    s = device.spec
    dom, bus, dev, fn = parse_bus_id(device.bus_id)
    _put_str(g.name, s.name)
    _put_str(g.uuid, device.uuid)
    _put_str(g.serial, device.serial)
    _put_str(g.board_part_number, s.board_part_number)
    _put_str(g.gpu_part_number, s.gpu_part_number)
    _put_str(g.vbios_version, s.vbios_version)
    _put_str(g.inforom_image, s.inforom.image)
    _put_str(g.inforom_oem, s.inforom.oem)
    _put_str(g.inforom_ecc, s.inforom.ecc)
    _put_str(g.inforom_power, s.inforom.power)
    _put_str(g.bus_id, device.bus_id)
    g.index = device.index
    g.minor_number = device.index
    g.brand = BRANDS[s.brand]
    g.architecture = int(Architecture[s.architecture])
    major, minor = s.compute_capability.split(".")
    g.cc_major, g.cc_minor = int(major), int(minor)
    g.board_id = (dom << 16) | (bus << 8) | dev
    g.module_id = device.module_id
    flags = 0
    if s.lost:
        flags |= const("MOKKA_GPU_LOST")
    if s.modes.mig is not None:
        flags |= const("MOKKA_GPU_MIG_CAPABLE")
    if s.modes.multi_gpu_board:
        flags |= const("MOKKA_GPU_MULTI_GPU_BOARD")
    if s.fabric.state != "Not Supported":
        flags |= const("MOKKA_GPU_FABRIC_SUPPORTED")
    if s.row_remapping is not None:
        flags |= const("MOKKA_GPU_REMAP_SUPPORTED")
        if s.row_remapping.pending:
            flags |= const("MOKKA_GPU_REMAP_PENDING")
        if s.row_remapping.failure:
            flags |= const("MOKKA_GPU_REMAP_FAILURE")
    if s.retired_pages:
        flags |= const("MOKKA_GPU_RETIRE_SUPPORTED")
    if s.power.management:
        flags |= const("MOKKA_GPU_POWER_MANAGEMENT")
    if s.architecture in ("Ada", "Hopper", "Blackwell"):
        flags |= const("MOKKA_GPU_TLIMIT")
    sram_split = s.architecture in ("Ampere", "Ada", "Hopper", "Blackwell")
    if s.sram_ecc_breakdown if s.sram_ecc_breakdown is not None else sram_split:
        flags |= const("MOKKA_GPU_SRAM_STATUS")
    g.flags = flags
    g.num_cores = _opt(s.cuda_cores)
    g.multiprocessor_count = multiprocessors(s.compute_capability, s.cuda_cores)
    g.memory_bus_width = _opt(s.memory.bus_width)

    p = s.pci
    g.pci_domain, g.pci_bus, g.pci_device, g.pci_function = dom, bus, dev, fn
    g.pci_device_id = (p.device_id << 16) | p.vendor_id
    g.pci_subsystem_id = (p.subsystem_device_id << 16) | p.subsystem_vendor_id
    g.pci_class = p.class_code
    g.pci_revision = p.revision
    g.pcie_max_gen = p.max_link_gen
    g.pcie_cur_gen = p.current_link_gen or p.max_link_gen
    g.pcie_max_width = p.max_link_width
    g.pcie_cur_width = p.current_link_width or p.max_link_width
    g.pcie_device_max_gen = p.device_max_link_gen or p.max_link_gen
    g.c2c_mode = _opt(None if s.modes.c2c is None else int(s.modes.c2c))
    g.pcie_replay_counter = s.pcie_replay_counter
    g.numa_node = device.numa_node if profile.topology.numa_nodes > 1 else na()
    g.irq = irq(device)
    for i, word in enumerate(_cpu_mask(device, profile)):
        g.cpu_affinity[i] = word

    m = s.memory
    g.mem_total = round(m.total_mib * MIB)
    g.mem_reserved = round(m.reserved_mib * MIB)
    g.mem_used = m.used_mib * MIB
    g.bar1_total = m.bar1_total_mib * MIB
    g.bar1_used = m.bar1_used_mib * MIB

    pw = s.power
    g.power_usage = round(pw.draw_w * 1000)
    g.power_limit = round(pw.limit_w * 1000)
    g.power_default_limit = round(pw.default_limit_w * 1000)
    g.power_min_limit = round(pw.min_limit_w * 1000)
    g.power_max_limit = round(pw.max_limit_w * 1000)
    g.power_enforced_limit = round(pw.limit_w * 1000)
    g.energy_mj = 0
    g.memory_power_usage = _opt(None if pw.memory_draw_w is None else round(pw.memory_draw_w * 1000))
    mod = pw.module
    g.module_power_usage = _opt(None if mod is None else round(mod.draw_w * 1000))
    g.module_power_limit = _opt(None if mod is None else round(mod.limit_w * 1000))
    g.module_power_default_limit = _opt(None if mod is None else round(mod.default_limit_w * 1000))
    g.module_power_min_limit = _opt(None if mod is None else round(mod.min_limit_w * 1000))
    g.module_power_max_limit = _opt(None if mod is None else round(mod.max_limit_w * 1000))

    t = s.temperature
    g.temp_gpu = t.gpu
    g.temp_memory = _opt(t.memory)
    for i in range(const("MOKKA_THRESHOLD_COUNT")):
        g.thresholds[i] = na()
    g.thresholds[TH_SHUTDOWN] = _opt(t.shutdown)
    g.thresholds[TH_SLOWDOWN] = _opt(t.slowdown)
    g.thresholds[TH_MEM_MAX] = _opt(t.memory_max)
    g.thresholds[TH_GPU_MAX] = _opt(t.gpu_max)
    g.thresholds[TH_ACOUSTIC_MIN] = _opt(t.target_min)
    g.thresholds[TH_ACOUSTIC_CURR] = _opt(t.target)
    g.thresholds[TH_ACOUSTIC_MAX] = _opt(t.target_max)

    c = s.clocks
    for target, clockset in (
        (g.clock_current, c.current),
        (g.clock_max, c.max),
        (g.clock_app, c.applications),
        (g.clock_default_app, c.default_applications),
        (g.clock_boost, c.max_boost),
    ):
        values = [None] * 4 if clockset is None else [clockset.graphics, clockset.sm, clockset.memory, clockset.video]
        for i, v in enumerate(values):
            target[i] = _opt(v)
    if c.applications_deprecated:
        for i in range(const("MOKKA_CLOCK_DOMAINS")):
            g.clock_app[i] = g.clock_default_app[i] = const("MOKKA_DEPRECATED")
    g.n_mem_clocks = len(c.supported)
    for i, entry in enumerate(c.supported):
        g.mem_clocks[i] = entry.memory
        gfx = entry.graphics_list()
        g.n_gfx_clocks[i] = len(gfx)
        for j, v in enumerate(gfx):
            g.gfx_clocks[i][j] = v
    g.clocks_event_reasons = s.clocks_event_reasons
    g.supported_event_reasons = s.supported_event_reasons
    g.pstate = s.modes.performance_state

    u = s.utilization
    g.util_gpu, g.util_memory, g.util_encoder = u.gpu, u.memory, u.encoder
    g.util_decoder, g.util_jpeg, g.util_ofa = u.decoder, u.jpeg, u.ofa

    md = s.modes
    g.persistence_mode = int(md.persistence)
    g.compute_mode = COMPUTE_MODES[md.compute]
    g.ecc_current = g.ecc_pending = na() if md.ecc is None else int(md.ecc)
    g.mig_current = g.mig_pending = na() if md.mig is None else int(md.mig)
    mig_state.fill(g, s, device.uuid, _put_str)
    g.display_mode = int(md.display_attached)
    g.display_active = int(md.display_active)
    g.accounting_mode = int(md.accounting)
    g.accounting_buffer = md.accounting_buffer
    g.virtualization_mode = VIRT_MODES[md.virtualization]
    g.fan_count = s.fans
    g.fan_speed = s.fan_speed if s.fans else na()

    rr = s.row_remapping
    if rr is not None:
        g.remap_correctable = rr.correctable
        g.remap_uncorrectable = rr.uncorrectable
        g.remap_histogram[0] = rr.max_banks
        g.remap_histogram[4] = 0
    g.retired_sbe = 0
    g.retired_dbe = 0

    nv = s.nvlink
    g.nvlink_count = nv.links
    g.nvlink_version = nv.version
    g.nvlink_speed_mbps = round(nv.speed_gbps * 1000)
    g.nvlink_active_mask = ((1 << nv.links) - 1) if nv.active else 0

    fb = s.fabric
    g.fabric_state = FABRIC_STATES[fb.state]
    g.fabric_status = 0
    g.clique_id = fb.clique_id
    g.fabric_ready_s = fb.manager_ready_at
    ffi().memmove(g.cluster_uuid, uuidlib.UUID(fb.cluster_uuid).bytes, 16)

    dynamic.fill(g, s.dynamic, device.index)
    g.n_procs = len(s.processes)
    for i, proc in enumerate(s.processes):
        g.procs[i].pid = proc.pid
        g.procs[i].type = 0 if proc.type == "C" else 1
        g.procs[i].used_memory = proc.used_memory_mib * MIB
        _put_str(g.procs[i].name, proc.name)
    fill_board_extras(g, device, profile)


# nvmlMemoryLocation_t values the profile's ECC counts land in
LOC_DRAM, LOC_SRAM = 2, 7
# nvmlGpuFabricInfo_v3_t healthMask, degraded-bandwidth field: 1 degraded, 2 full
FABRIC_BW_DEGRADED, FABRIC_BW_FULL = 1, 2


def _atomic_mask(names: list[str]) -> int:
    return sum(1 << ATOMIC_CAPS.index(n) for n in set(names))


def nvlink_far_ends(device: Device, profile: Profile) -> list[str]:
    """The bus id each NVLink of a GPU reaches: the node's NVSwitches, links split among them
    in order (18 links over 4 switches: 5, 4, 4, 5 as on HGX H100); none without switches."""
    switches, links = profile.topology.nvswitches, device.spec.nvlink.links
    if not switches or not links:
        return []
    n = len(switches)
    sizes = [links // n + (1 if i < links % n else 0) for i in range(n)]
    if n > 2 and links % n == 2:  # 18 over 4: the outer switches take the extra links
        sizes = [links // n + (1 if i in (0, n - 1) else 0) for i in range(n)]
    return [bus for bus, size in zip(switches, sizes, strict=True) for _ in range(size)]


def fill_board_extras(g: Any, device: Device, profile: Profile) -> None:
    """Sparse mode, PCIe atomics, ECC counts, fabric health and NVLink far ends."""
    s = device.spec
    g.sparse_mode = _opt(None if s.modes.sparse is None else int(s.modes.sparse))
    g.atomic_caps_in = _atomic_mask(list(s.pci.atomic_caps_inbound))
    g.atomic_caps_out = _atomic_mask(list(s.pci.atomic_caps_outbound))
    for counter, counts in enumerate((s.ecc_errors.volatile, s.ecc_errors.aggregate)):
        g.ecc_counts[0][counter][LOC_DRAM] = counts.dram_correctable
        g.ecc_counts[1][counter][LOC_DRAM] = counts.dram_uncorrectable
        g.ecc_counts[0][counter][LOC_SRAM] = counts.sram_correctable
        g.ecc_counts[1][counter][LOC_SRAM] = counts.sram_uncorrectable
    bw = s.fabric.degraded_bandwidth
    g.fabric_health = 0 if bw is None else (FABRIC_BW_DEGRADED if bw else FABRIC_BW_FULL)
    ends = nvlink_far_ends(device, profile)
    g.nvlink_remote_device_id = (profile.topology.nvswitch_device_id << 16) | 0x10DE if ends else 0
    for i in range(const("MOKKA_MAX_NVLINKS")):
        if i < len(ends):
            dom, bus, dev, fn = parse_bus_id(ends[i])
            g.nvlink_remote[i] = ((dom & 0xFFFF) << 16) | (bus << 8) | (dev << 3) | fn
        else:
            g.nvlink_remote[i] = na()


def fill_pci_peers(h: Any, gpus: Any, profile: Profile) -> None:
    """Where the InfiniBand adapters sit beside the GPUs (``nvidia-smi topo -m``'s NIC columns):
    each adapter's bus id and NUMA node, and the PCIe switch a GPU shares with its adapter."""
    switches = pcie.switches(profile)
    switch_ids = {switches[gpu].adapter: n + 1 for n, gpu in enumerate(sorted(switches))}
    for n, gpu in enumerate(sorted(switches)):
        gpus[gpu].pcie_switch = n + 1
    hcas = infiniband.adapters(profile)
    h.nic_count = len(hcas)
    for i, hca in enumerate(hcas):
        dom, bus, dev, fn = parse_bus_id(hca.bus_id)
        h.nics[i].pci = ((dom & 0xFFFF) << 16) | (bus << 8) | (dev << 3) | fn
        h.nics[i].numa_node = hca.numa_node if profile.topology.numa_nodes > 1 else na()
        h.nics[i].pcie_switch = switch_ids.get(hca.bus_id, 0)


def region_size(gpu_count: int) -> int:
    """Bytes of a state region for ``gpu_count`` GPUs: the header and two copies."""
    return int(ffi().sizeof("mokka_header_t")) + 2 * _copy_size(gpu_count)


def _copy_size(gpu_count: int) -> int:
    f = ffi()
    return int(f.sizeof("mokka_node_t")) + gpu_count * int(f.sizeof("mokka_gpu_t"))


def compile_profile(profile: Profile) -> bytes:
    """The state region for a profile (header and both copies), as bytes."""
    f = ffi()
    devices = profile.devices()
    hsize = f.sizeof("mokka_header_t")
    copy = _copy_size(len(devices))
    buf = f.new("char[]", hsize + 2 * copy)
    h = f.cast("mokka_header_t *", buf)
    h.magic = const("MOKKA_STATE_MAGIC")
    h.version = const("MOKKA_STATE_VERSION")
    h.header_size = hsize
    h.node_size = f.sizeof("mokka_node_t")
    h.gpu_size = f.sizeof("mokka_gpu_t")
    h.gpu_count = len(devices)
    h.seq = 0
    _put_str(h.driver_version, profile.driver.version)
    major = profile.driver.cuda.split(".")[0]
    _put_str(h.nvml_version, f"{major}.{profile.driver.version}")
    h.cuda_version = profile.driver.cuda_int
    _put_str(h.profile, profile.name)
    node = f.cast("mokka_node_t *", buf + hsize)
    node.generation = 0
    gpus = f.cast("mokka_gpu_t *", buf + hsize + f.sizeof("mokka_node_t"))
    for i, device in enumerate(devices):
        try:
            fill_gpu(gpus[i], device, profile)
        except ValueError as exc:
            raise StateError(f"profile {profile.name}, GPU {i}: {exc}") from None
    fill_pci_peers(h, gpus, profile)
    f.memmove(buf + hsize + copy, buf + hsize, copy)  # both copies start equal
    return bytes(f.buffer(buf))


# ---- where the region lives: a state file, or inside a library file ------------------


def embed(library: bytes, region: bytes) -> bytes:
    """A library file that carries ``region``: the ELF image, zero padding to a multiple of
    MOKKA_STATE_ALIGN, the region, and the trailer the library finds it by."""
    align = const("MOKKA_STATE_ALIGN")
    offset = -(-len(library) // align) * align
    f = ffi()
    trailer = f.new("mokka_trailer_t *")
    trailer.state_offset = offset
    trailer.state_size = len(region)
    trailer.magic = const("MOKKA_TRAILER_MAGIC")
    return library + bytes(offset - len(library)) + region + bytes(f.buffer(trailer))


def locate(fd: int, source: str) -> tuple[int, int]:
    """(offset, size) of the state region in an open file: from byte 0 of a state file, or
    where the trailer of a library file carrying one says."""
    size = os.fstat(fd).st_size
    f = ffi()
    if size >= 8 and int.from_bytes(os.pread(fd, 8, 0), "little") == const("MOKKA_STATE_MAGIC"):
        return 0, size
    tsize = f.sizeof("mokka_trailer_t")
    if size >= tsize:
        raw = os.pread(fd, tsize, size - tsize)
        trailer = f.cast("mokka_trailer_t *", f.from_buffer(raw))
        if trailer.magic == const("MOKKA_TRAILER_MAGIC"):
            offset, length = int(trailer.state_offset), int(trailer.state_size)
            if offset % const("MOKKA_STATE_ALIGN") or offset + length > size - tsize:
                raise StateError(f"{source}: truncated or corrupt (the trailer points outside the file)")
            return offset, length
    if size < f.sizeof("mokka_header_t"):
        raise StateError(f"{source}: truncated ({size} bytes, header needs {f.sizeof('mokka_header_t')})")
    raise StateError(f"{source}: not a Mokka state file (bad magic), nor a library carrying one")


def read(path: Path) -> bytes:
    """The state region of a state file or of a library carrying one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        offset, size = locate(fd, str(path))
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def write_new(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Create or replace a file atomically (write a temporary file, fsync, rename).

    Only for files nobody has mapped yet; live changes go through :func:`update`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(path, data, mode)


def check(data: bytes | bytearray | mmap.mmap, source: str = "state") -> tuple[int, int, int]:
    """Validate a state region; return (header size, gpu size, gpu count)."""
    f = ffi()
    hsize = f.sizeof("mokka_header_t")
    if len(data) < hsize:
        raise StateError(f"{source}: truncated ({len(data)} bytes, header needs {hsize})")
    h = f.cast("mokka_header_t *", f.from_buffer(data))
    if h.magic != const("MOKKA_STATE_MAGIC"):
        raise StateError(f"{source}: not a Mokka state file (bad magic)")
    if (
        h.version != const("MOKKA_STATE_VERSION")
        or h.header_size != hsize
        or h.node_size != f.sizeof("mokka_node_t")
        or h.gpu_size != f.sizeof("mokka_gpu_t")
    ):
        raise StateError(
            f"{source}: written for another state layout (version {h.version}, record sizes "
            f"{h.header_size}/{h.node_size}/{h.gpu_size}); regenerate it with this Mokka"
        )
    if h.gpu_count > const("MOKKA_MAX_GPUS") or len(data) < region_size(h.gpu_count):
        need = region_size(min(h.gpu_count, const("MOKKA_MAX_GPUS")))
        raise StateError(f"{source}: truncated or corrupt ({len(data)} bytes, {h.gpu_count} GPUs need {need})")
    return hsize, h.gpu_size, h.gpu_count


# ---- the writer ----------------------------------------------------------------------

WRITER_CDEF = """
int mokka_state_stable_copy(const void *region, uint64_t region_size);
int mokka_state_publish(void *region, uint64_t region_size, const void *live, uint64_t live_size);
"""


@functools.cache
def _writer() -> tuple[cffi.FFI, Any]:
    """The C writer (native/writer/): the latch with the memory ordering readers need."""
    wffi = cffi.FFI()
    wffi.cdef(WRITER_CDEF)
    return wffi, wffi.dlopen(str(library_path(STATE_WRITER)))


@contextmanager
def locked(path: Path) -> Iterator[mmap.mmap]:
    """The state region of ``path`` mapped read-write, under the file's writer lock.

    Writers serialise on flock: a writer that is killed drops its lock with its process."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or its process dies
        offset, size = locate(fd, str(path))
        if size == 0:
            raise StateError(f"{path}: empty state")
        mm = mmap.mmap(fd, size, offset=offset)
        try:
            check(mm, str(path))
            yield mm
        finally:
            mm.close()
    finally:
        os.close(fd)


def _publish(mm: mmap.mmap, live: bytes | bytearray, source: str) -> None:
    wffi, lib = _writer()
    region = wffi.from_buffer(mm)
    try:
        rc = lib.mokka_state_publish(region, len(mm), wffi.from_buffer(live), len(live))
    finally:
        del region
    if rc != 0:
        raise StateError(f"{source}: the writer refused the update (error {rc})")


def update(path: Path, change: Callable[[Any, Any], None]) -> int:
    """Change a live state in place; return the new generation.

    ``change(node, gpus)`` edits a private copy of the live data (``node``: the
    mokka_node_t, ``gpus``: the mokka_gpu_t array), which then replaces what readers see
    in one publish. Writers serialise on the file's lock; a counter left behind by a killed
    writer is repaired on the way."""
    f = ffi()
    with locked(path) as mm:
        h = f.cast("mokka_header_t *", f.from_buffer(mm))
        copy = _copy_size(h.gpu_count)
        wffi, lib = _writer()
        region = wffi.from_buffer(mm)
        stable = lib.mokka_state_stable_copy(region, len(mm))
        del region
        start = f.sizeof("mokka_header_t") + stable * copy
        live = bytearray(mm[start : start + copy])
        base = f.from_buffer(live)
        node = f.cast("mokka_node_t *", base)
        gpus = f.cast("mokka_gpu_t *", base + f.sizeof("mokka_node_t"))
        change(node, gpus)
        node.generation += 1
        generation = int(node.generation)
        del h, base, node, gpus
        _publish(mm, live, str(path))
        return generation


def refresh(path: Path, region: bytes) -> bool:
    """Make a live state file hold ``region``'s data in place, if it has the same layout and
    static header; return False (nothing changed) when it does not: then the file must be
    written anew. Repairs a counter a killed writer left behind."""
    f = ffi()
    hsize = f.sizeof("mokka_header_t")
    check(region, "new state")
    try:
        with locked(path) as mm:
            if len(mm) != len(region) or _static_header(mm[:hsize]) != _static_header(region[:hsize]):
                return False
            seq = int.from_bytes(mm[f.offsetof("mokka_header_t", "seq") :][:4], "little")
            if seq % 2 == 0 and mm[hsize:] == region[hsize:]:
                return True  # already this state, counter at rest: leave every byte alone
            copy = _copy_size(f.cast("mokka_header_t *", f.from_buffer(region)).gpu_count)
            _publish(mm, region[hsize : hsize + copy], str(path))
            return True
    except (OSError, StateError):
        return False


def _static_header(raw: bytes) -> bytes:
    """The header without its counter: what must match for an in-place refresh."""
    seq = ffi().offsetof("mokka_header_t", "seq")
    return raw[:seq] + raw[seq + 4 :]


def refresh_library(path: Path, library: bytes, region: bytes) -> bool:
    """Refresh the state a staged library carries in place when the file is this very
    library (identical ELF bytes) with a state of the same layout; False otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        offset, size = locate(fd, str(path))
        same = size == len(region) and offset > 0 and os.pread(fd, offset, 0) == embed(library, region)[:offset]
    except (OSError, StateError):
        return False
    finally:
        os.close(fd)
    return same and refresh(path, region)
