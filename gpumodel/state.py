"""Compile a validated profile into the binary state file the native library maps.

The layout comes from ``native/mokka_state.h`` through cffi (ABI mode: cffi computes the
same offsets the C compiler does), so the file has one definition. Writes into an
existing file happen in place under the header's seqlock; a new file is written whole.
"""

from __future__ import annotations

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

from . import atomic
from .native import header_path
from .profile import MIB, Architecture, Brand, Device, Profile

COMPUTE_MODES = {"Default": 0, "Exclusive_Thread": 1, "Prohibited": 2, "Exclusive_Process": 3}
VIRT_MODES = {"None": 0, "Pass-Through": 1, "vGPU": 2, "Host vGPU": 3, "Host vSGA": 4}
FABRIC_STATES = {"Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}
# nvmlTemperatureThresholds_t
TH_SHUTDOWN, TH_SLOWDOWN, TH_MEM_MAX, TH_GPU_MAX = 0, 1, 2, 3


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


def fill_gpu(g: Any, device: Device, profile: Profile) -> None:
    """Write one GPU record from a concrete device."""
    s = device.spec
    from .profile import parse_bus_id

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
    g.brand = int(Brand[s.brand])
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
    g.flags = flags
    g.num_cores = _opt(s.cuda_cores)
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
    ffi().memmove(g.cluster_uuid, uuidlib.UUID(fb.cluster_uuid).bytes, 16)

    g.n_procs = len(s.processes)
    for i, proc in enumerate(s.processes):
        g.procs[i].pid = proc.pid
        g.procs[i].type = 0 if proc.type == "C" else 1
        g.procs[i].used_memory = proc.used_memory_mib * MIB
        _put_str(g.procs[i].name, proc.name)


def compile_profile(profile: Profile) -> bytes:
    """The whole state file for a profile, as bytes."""
    f = ffi()
    devices = profile.devices()
    hsize, gsize = f.sizeof("mokka_header_t"), f.sizeof("mokka_gpu_t")
    buf = f.new("char[]", hsize + gsize * len(devices))
    h = f.cast("mokka_header_t *", buf)
    h.magic = const("MOKKA_STATE_MAGIC")
    h.version = const("MOKKA_STATE_VERSION")
    h.header_size = hsize
    h.gpu_size = gsize
    h.gpu_count = len(devices)
    h.seq = 0
    h.generation = 1
    _put_str(h.driver_version, profile.driver.version)
    major = profile.driver.cuda.split(".")[0]
    _put_str(h.nvml_version, f"{major}.{profile.driver.version}")
    h.cuda_version = profile.driver.cuda_int
    _put_str(h.profile, profile.name)
    gpus = f.cast("mokka_gpu_t *", buf + hsize)
    for i, device in enumerate(devices):
        try:
            fill_gpu(gpus[i], device, profile)
        except ValueError as exc:
            raise StateError(f"profile {profile.name}, GPU {i}: {exc}") from None
    return bytes(f.buffer(buf))


def write_new(path: Path, data: bytes) -> None:
    """Create or replace a state file atomically (write a temporary file, fsync, rename).

    Only for files nobody has mapped yet; live changes go through :func:`update`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(path, data, 0o644)


def check(data: bytes | bytearray | mmap.mmap, source: str = "state") -> tuple[int, int, int]:
    """Validate a state image; return (header size, gpu size, gpu count)."""
    f = ffi()
    hsize = f.sizeof("mokka_header_t")
    if len(data) < hsize:
        raise StateError(f"{source}: truncated ({len(data)} bytes, header needs {hsize})")
    h = f.cast("mokka_header_t *", f.from_buffer(data))
    if h.magic != const("MOKKA_STATE_MAGIC"):
        raise StateError(f"{source}: not a Mokka state file (bad magic)")
    if h.version != const("MOKKA_STATE_VERSION") or h.header_size != hsize or h.gpu_size != f.sizeof("mokka_gpu_t"):
        raise StateError(
            f"{source}: written for another state layout (version {h.version}, record sizes "
            f"{h.header_size}/{h.gpu_size}); regenerate it with this Mokka"
        )
    need = hsize + h.gpu_size * h.gpu_count
    if h.gpu_count > const("MOKKA_MAX_GPUS") or len(data) < need:
        raise StateError(f"{source}: truncated or corrupt ({len(data)} bytes, {h.gpu_count} GPUs need {need})")
    return hsize, h.gpu_size, h.gpu_count


@contextmanager
def mapped(path: Path) -> Iterator[tuple[Any, Any]]:
    """Map a state file read-write; yield (header, gpu array) cdata views."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise StateError(f"{path}: empty state file")
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    try:
        hsize, _, _ = check(mm, str(path))
        f = ffi()
        base = f.from_buffer(mm)
        yield f.cast("mokka_header_t *", base), f.cast("mokka_gpu_t *", base + hsize)
        del base
    finally:
        mm.flush()
        mm.close()


def update(path: Path, change: Callable[[Any, Any], None]) -> int:
    """Change a live state file in place under its seqlock; return the new generation."""
    with mapped(path) as (h, gpus):
        h.seq += 1  # odd: readers retry
        try:
            change(h, gpus)
        finally:
            h.seq += 1
            h.generation += 1
        return int(h.generation)
