"""Turn real-hardware evidence into a profile: `mokka profile import`.

The evidence is an ``nvidia-smi -q -x`` capture (any release from 470 on, legacy element
names mapped by :mod:`gpumodel.smi_xml`; gzip accepted), optionally completed by files of
the same node: ``nvidia-smi --query-gpu`` CSV (a header row of field names and a row per
GPU, or one ``field,value`` row per line), an NVML dump as ``tools/capture/nvml_dump.py``
writes it, and ``nvidia-smi -q`` text. Every value the evidence carries goes into the
profile: the values every GPU shares into ``gpu``, what differs per GPU into ``gpus``.
What none of it carries comes from the closest built-in board (same PCI device id, else
same architecture, else nearest generation; among those the closest memory size), and
the result lists those fields as inferred. Board-specific counts the capture does not show
(CUDA cores, memory bus width, NVLink) are taken only from a built-in board of the same PCI
device id; otherwise they stay unknown (N/A) and the result says so. Serials and UUIDs are
regenerated unless ``keep_ids``; bus ids and module ids (the node's layout) are kept.

One file, though long: it is one reading of one capture, section by section (value parsing, what
the capture says of one GPU, the completing files, the closest built-in board, putting it
together); each section only feeds the next, and none is used elsewhere.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import mig, mig_import
from . import profile as profiles
from .smi_xml import CaptureError, legacy_power, parse, read_bytes, text

ARCHITECTURES = ["Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell"]
# nvidia-smi's "Product Brand" text -> the profile's brand name (GRID prints as "Grid").
BRAND_TEXT = {name: name for name in profiles.BRANDS} | {"Grid": "GRID"}
# "Clocks Event Reasons" elements -> nvmlClocksEventReasons bits
EVENT_REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}
DEPRECATED = "Requested functionality has been deprecated"
# Fields a built-in board lends only when it is the same product (PCI device id).
SAME_BOARD_ONLY = ("cuda_cores", "memory.bus_width", "nvlink")


class ImportFailure(Exception):
    """Evidence that cannot be imported; the message is one line naming the file and problem."""


@dataclass
class ImportResult:
    data: dict[str, Any]  # the profile, as YAML/JSON-ready data
    base: str  # the built-in board that lent what the evidence lacks
    inferred: list[str] = field(default_factory=list)  # fields taken from it or derived
    unknown: list[str] = field(default_factory=list)  # fields left N/A: no evidence, no same board
    notes: list[str] = field(default_factory=list)

    def yaml_text(self) -> str:
        import yaml

        lines = [f"# Imported by `mokka profile import`: {self.data['source']}"]
        lines.append(f"# Closest built-in board: {self.base}.")
        if self.inferred:
            lines.append("# Inferred (not in the evidence; from that board or derived):")
            lines += [f"#   {item}" for item in self.inferred]
        if self.unknown:
            lines.append("# Unknown (not in the evidence, no built-in board of this product): left N/A:")
            lines += [f"#   {item}" for item in self.unknown]
        lines += [f"# Note: {note}" for note in self.notes]
        return "\n".join(lines) + "\n" + yaml.safe_dump(self.data, sort_keys=False, width=110)


# ---- value parsing ------------------------------------------------------------------


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def _int(value: str | None) -> int | None:
    n = _num(value)
    return None if n is None else round(n)


def _hex(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


def _enabled(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("enabled", "yes", "active", "supported", "on")


def _slug(name: str) -> str:
    base = re.sub(r"^(nvidia|tesla)\s+", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "imported"


# ---- what the capture says about one GPU ----------------------------------------------


def _architecture(gpu: ET.Element, device_id: int | None) -> tuple[str | None, bool]:
    """(architecture, inferred?) from the capture, else from the PCI device id's range."""
    arch = text(gpu, "product_architecture")
    if arch:
        arch = {"Ada Lovelace": "Ada"}.get(arch, arch)
        if arch in ARCHITECTURES:
            return arch, False
    if device_id is None:
        return None, True
    ranges = [
        (0x1340, 0x17FF, "Maxwell"),
        (0x1B00, 0x1D7F, "Pascal"),
        (0x15F0, 0x15FF, "Pascal"),
        (0x1D80, 0x1DFF, "Volta"),
        (0x1E00, 0x1FFF, "Turing"),
        (0x2180, 0x21FF, "Turing"),
        (0x20B0, 0x20FF, "Ampere"),
        (0x2200, 0x25FF, "Ampere"),
        (0x2300, 0x233F, "Hopper"),
        (0x2600, 0x28FF, "Ada"),
        (0x2900, 0x2FFF, "Blackwell"),
        (0x3100, 0x31FF, "Blackwell"),
    ]
    for lo, hi, name in sorted(ranges, key=lambda r: r[1] - r[0]):
        if lo <= device_id <= hi:
            return name, True
    return None, True


def _compute_capability(arch: str, device_id: int | None) -> str:
    """CUDA compute capability from the architecture and the chip (NVIDIA's CUDA GPU list)."""
    dev = device_id or 0
    if arch == "Ampere":
        return "8.0" if 0x20B0 <= dev <= 0x20FF else "8.6"
    if arch == "Blackwell":
        if 0x3100 <= dev <= 0x31FF:
            return "10.3"
        return "12.0" if 0x2B00 <= dev <= 0x2FFF else "10.0"
    if arch == "Pascal":
        return "6.0" if 0x15F0 <= dev <= 0x15FF else "6.1"
    return {"Kepler": "3.7", "Maxwell": "5.2", "Volta": "7.0", "Turing": "7.5", "Ada": "8.9", "Hopper": "9.0"}[arch]


def _clockset(block: ET.Element | None) -> dict[str, int | None] | None:
    """A clock set; a domain the block does not list is N/A (None), as nvidia-smi leaves it out."""
    if block is None:
        return None
    values = {
        "graphics": _int(text(block, "graphics_clock")),
        "sm": _int(text(block, "sm_clock")),
        "memory": _int(text(block, "mem_clock")),
        "video": _int(text(block, "video_clock")),
    }
    return values if any(v is not None for v in values.values()) else None


def _deprecated(block: ET.Element | None) -> bool:
    return block is not None and any((c.text or "").strip() == DEPRECATED for c in block)


def _supported_clocks(gpu: ET.Element) -> list[dict[str, Any]]:
    out = []
    for mem in gpu.findall("supported_clocks/supported_mem_clock"):
        memory = _int(text(mem, "value"))
        graphics = [v for v in (_int((g.text or "").strip()) for g in mem.findall("supported_graphics_clock")) if v]
        if memory is None:
            continue
        steps = {a - b for a, b in itertools.pairwise(graphics)}
        if len(graphics) > 2 and len(steps) == 1 and steps.pop() > 0:
            out.append({"memory": memory, "graphics_range": [graphics[0], graphics[-1], graphics[0] - graphics[1]]})
        else:
            out.append({"memory": memory, "graphics": graphics})
    return out


def _power(gpu: ET.Element, legacy: dict[str, str | None]) -> tuple[dict[str, Any], list[str]]:
    p = gpu.find("gpu_power_readings")
    notes = []
    draw = _num(text(p, "instant_power_draw")) or _num(text(p, "power_draw")) or _num(text(p, "average_power_draw"))
    limits = {
        "limit_w": _num(text(p, "current_power_limit")),
        "default_limit_w": _num(text(p, "default_power_limit")),
        "min_limit_w": _num(text(p, "min_power_limit")),
        "max_limit_w": _num(text(p, "max_power_limit")),
    }
    management = all(v is not None for v in limits.values())
    if legacy.get("power_management") is not None:
        management = management and _enabled(legacy["power_management"]) is True
    out: dict[str, Any] = {"draw_w": draw or 0.0, "management": management}
    if management:
        out.update(limits)
    else:
        out.update({k: 0.0 for k in limits})
        notes.append("power management not supported (limits N/A)")
    mem = gpu.find("gpu_memory_power_readings")
    mem_draw = _num(text(mem, "average_power_draw")) or _num(text(mem, "power_draw"))
    out["memory_draw_w"] = mem_draw
    mod = gpu.find("module_power_readings")
    mod_limits = {
        "draw_w": _num(text(mod, "instant_power_draw")) or _num(text(mod, "power_draw")),
        "limit_w": _num(text(mod, "current_power_limit")),
        "default_limit_w": _num(text(mod, "default_power_limit")),
        "min_limit_w": _num(text(mod, "min_power_limit")),
        "max_limit_w": _num(text(mod, "max_power_limit")),
    }
    if mod_limits["limit_w"] is not None and mod_limits["max_limit_w"] is not None:
        # the model has no N/A for a module limit: a missing one is the nearest value that holds
        limit, most = mod_limits["limit_w"], mod_limits["max_limit_w"]
        out["module"] = {
            "draw_w": mod_limits["draw_w"] or 0.0,
            "limit_w": limit,
            "default_limit_w": mod_limits["default_limit_w"] if mod_limits["default_limit_w"] is not None else limit,
            "min_limit_w": mod_limits["min_limit_w"] if mod_limits["min_limit_w"] is not None else 0.0,
            "max_limit_w": most,
        }
        if mod_limits["min_limit_w"] is None:
            notes.append("module power: minimum limit N/A in the capture, modelled as 0 W")
    else:
        out["module"] = None
    return out, notes


def _temperature(gpu: ET.Element) -> dict[str, Any]:
    t = gpu.find("temperature")
    now = _int(text(t, "gpu_temp"))
    out: dict[str, Any] = {"gpu": now if now is not None else 0, "memory": _int(text(t, "memory_temp"))}
    out["shutdown"] = _int(text(t, "gpu_temp_max_threshold"))
    out["slowdown"] = _int(text(t, "gpu_temp_slow_threshold"))
    out["gpu_max"] = _int(text(t, "gpu_temp_max_gpu_threshold"))
    out["memory_max"] = _int(text(t, "gpu_temp_max_mem_threshold"))
    margin = _int(text(t, "gpu_temp_tlimit"))
    if margin is not None and now is not None:
        # T.Limit form: thresholds relative to the GPU's maximum operating temperature
        gpu_max = now + margin
        out["gpu_max"] = gpu_max
        for key, name in (
            ("shutdown", "gpu_temp_max_tlimit_threshold"),
            ("slowdown", "gpu_temp_slow_tlimit_threshold"),
        ):
            offset = _int(text(t, name))
            if offset is not None:
                out[key] = gpu_max - offset
        out.pop("memory_max")  # its T.Limit form carries no absolute value
    out["target"] = _int(text(t, "gpu_target_temperature"))
    target = gpu.find("supported_gpu_target_temp")
    out["target_min"] = _int(text(target, "gpu_target_temp_min"))
    out["target_max"] = _int(text(target, "gpu_target_temp_max"))
    return out


def _ecc_errors(gpu: ET.Element) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scope in ("volatile", "aggregate"):
        block = gpu.find(f"ecc_errors/{scope}")
        counts = {"dram_correctable": 0, "dram_uncorrectable": 0, "sram_correctable": 0, "sram_uncorrectable": 0}
        for name in ("dram_correctable", "dram_uncorrectable", "sram_correctable"):
            v = _int(text(block, name))
            if v:
                counts[name] = v
        sram_unc = sum(
            v
            for v in (
                _int(text(block, n))
                for n in ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")
            )
            if v
        )
        counts["sram_uncorrectable"] = sram_unc
        out[scope] = counts
    return out


def _spec(gpu: ET.Element, legacy: dict[str, str | None]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(spec fields the capture carries, per-unit facts, notes) for one <gpu>."""
    notes: list[str] = []
    s: dict[str, Any] = {}
    s["name"] = text(gpu, "product_name") or "NVIDIA GPU"
    brand = text(gpu, "product_brand")
    if brand is not None:
        s["brand"] = BRAND_TEXT.get(brand, "NVIDIA")
        if brand not in BRAND_TEXT:
            notes.append(f"brand {brand!r} unknown to NVML's brand list: imported as NVIDIA")
    s["vbios_version"] = text(gpu, "vbios_version") or ""
    s["board_part_number"] = text(gpu, "board_part_number") or ""
    s["gpu_part_number"] = text(gpu, "gpu_part_number") or ""

    pci: dict[str, Any] = {}
    dev = _hex(text(gpu, "pci/pci_device_id"))
    sub = _hex(text(gpu, "pci/pci_sub_system_id"))
    if dev is not None:
        pci["device_id"], pci["vendor_id"] = dev >> 16, dev & 0xFFFF
    if sub is not None:
        pci["subsystem_device_id"], pci["subsystem_vendor_id"] = sub >> 16, sub & 0xFFFF
    base_class, sub_class = _int(text(gpu, "pci/pci_base_class")), _int(text(gpu, "pci/pci_sub_class"))
    if base_class is not None and sub_class is not None:
        pci["class_code"] = (base_class << 16) | (sub_class << 8)
    link = gpu.find("pci/pci_gpu_link_info")
    for key, path in (
        ("max_link_gen", "pcie_gen/max_link_gen"),
        ("current_link_gen", "pcie_gen/current_link_gen"),
        ("device_max_link_gen", "pcie_gen/max_device_link_gen"),
        ("max_link_width", "link_widths/max_link_width"),
        ("current_link_width", "link_widths/current_link_width"),
    ):
        v = _int(text(link, path))
        if v is not None:
            pci[key] = v
    for key, path in (
        ("atomic_caps_inbound", "pci/atomic_caps_inbound"),
        ("atomic_caps_outbound", "pci/atomic_caps_outbound"),
    ):
        caps = text(gpu, path)
        pci[key] = [c for c in caps.split() if c in profiles.ATOMIC_CAPS] if caps else []
    s["pci"] = pci
    arch, arch_inferred = _architecture(gpu, pci.get("device_id"))
    if arch is not None:
        s["architecture"] = arch
    s["inforom"] = {
        "image": text(gpu, "inforom_version/img_version") or "",
        "oem": text(gpu, "inforom_version/oem_object") or "",
        "ecc": text(gpu, "inforom_version/ecc_object") or "",
        "power": text(gpu, "inforom_version/pwr_object") or "",
    }
    fb, bar1 = gpu.find("fb_memory_usage"), gpu.find("bar1_memory_usage")
    memory: dict[str, Any] = {}
    for key, elem, path in (
        ("total_mib", fb, "total"),
        ("reserved_mib", fb, "reserved"),
        ("used_mib", fb, "used"),
        ("bar1_total_mib", bar1, "total"),
        ("bar1_used_mib", bar1, "used"),
    ):
        v = _int(text(elem, path))
        if v is not None:
            memory[key] = v
    s["memory"] = memory
    s["power"], power_notes = _power(gpu, legacy)
    notes += power_notes
    s["temperature"] = _temperature(gpu)

    clocks: dict[str, Any] = {
        "current": _clockset(gpu.find("clocks")) or {},
        "max": _clockset(gpu.find("max_clocks")) or {},
        "applications": _clockset(gpu.find("applications_clocks")),
        "default_applications": _clockset(gpu.find("default_applications_clocks")),
        "max_boost": _clockset(gpu.find("max_customer_boost_clocks")),
        "applications_deprecated": _deprecated(gpu.find("applications_clocks")),
        "supported": _supported_clocks(gpu),
    }
    s["clocks"] = clocks
    util = gpu.find("utilization")
    s["utilization"] = {
        k: _int(text(util, f"{k}_util")) or 0 for k in ("gpu", "memory", "encoder", "decoder", "jpeg", "ofa")
    }

    modes: dict[str, Any] = {}
    persistence = _enabled(text(gpu, "persistence_mode"))
    modes["persistence"] = bool(persistence)
    compute = text(gpu, "compute_mode")
    if compute in ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"):
        modes["compute"] = compute
    modes["ecc"] = _enabled(text(gpu, "ecc_mode/current_ecc"))
    modes["mig"] = _enabled(text(gpu, "mig_mode/current_mig"))
    attached = text(gpu, "display_attached")
    modes["display_attached"] = attached == "Yes" if attached is not None else bool(_enabled(text(gpu, "display_mode")))
    modes["display_active"] = bool(_enabled(text(gpu, "display_active")))
    modes["accounting"] = bool(_enabled(text(gpu, "accounting_mode")))
    buffer = _int(text(gpu, "accounting_mode_buffer_size"))
    if buffer is not None:
        modes["accounting_buffer"] = buffer
    virt = text(gpu, "gpu_virtualization_mode/virtualization_mode")
    virt = {"VGPU": "vGPU", "Host VGPU": "Host vGPU", "Host VSGA": "Host vSGA"}.get(virt or "", virt)
    if virt in ("None", "Pass-Through", "vGPU", "Host vGPU", "Host vSGA"):
        modes["virtualization"] = virt
    modes["multi_gpu_board"] = text(gpu, "multigpu_board") == "Yes"
    modes["c2c"] = _enabled(text(gpu, "c2c_mode"))
    pstate = text(gpu, "performance_state")
    if pstate and re.match(r"^P\d+$", pstate):
        modes["performance_state"] = int(pstate[1:])
    modes["sparse"] = _enabled(text(gpu, "sparse_operation_mode"))
    s["modes"] = modes

    rr = gpu.find("remapped_rows")
    if rr is not None and len(rr):
        s["row_remapping"] = {
            "max_banks": _int(text(rr, "row_remapper_histogram/row_remapper_histogram_max")) or 0,
            "correctable": _int(text(rr, "remapped_row_corr")) or 0,
            "uncorrectable": _int(text(rr, "remapped_row_unc")) or 0,
            "pending": text(rr, "remapped_row_pending") == "Yes",
            "failure": text(rr, "remapped_row_failure") == "Yes",
        }
    else:
        s["row_remapping"] = None
    s["retired_pages"] = text(gpu, "retired_pages/double_bit_retirement/retired_count") is not None
    s["ecc_errors"] = _ecc_errors(gpu)
    if text(gpu, "ecc_errors/volatile/sram_uncorrectable_parity") is not None:
        s["sram_ecc_breakdown"] = True
    # The plain SRAM pair of older nvidia-smi releases says nothing of the library: current
    # releases print the parity/SEC-DED split for the same board (left to the architecture).
    fan = _int(text(gpu, "fan_speed"))
    s["fans"], s["fan_speed"] = (1, fan) if fan is not None else (0, 0)
    fabric_state = text(gpu, "fabric/state")
    fabric: dict[str, Any] = profiles.Fabric().model_dump() | {"state": fabric_state or "Not Supported"}
    if fabric_state:
        fabric["status"] = text(gpu, "fabric/status") or "N/A"
        clique = _int(text(gpu, "fabric/cliqueId"))
        if clique is not None:
            fabric["clique_id"] = clique
        cluster = text(gpu, "fabric/clusterUuid")
        if cluster and re.match(r"^[0-9a-fA-F-]{36}$", cluster):
            fabric["cluster_uuid"] = cluster
        bandwidth = text(gpu, "fabric/health/bandwidth")
        if bandwidth in ("Full", "Degraded"):
            fabric["degraded_bandwidth"] = bandwidth == "Degraded"
    s["fabric"] = fabric
    reasons = gpu.find("clocks_event_reasons")
    if reasons is not None and len(reasons):
        s["clocks_event_reasons"] = sum(
            bit for name, bit in EVENT_REASON_BITS.items() if text(reasons, f"clocks_event_reason_{name}") == "Active"
        )
    s["pcie_replay_counter"] = _int(text(gpu, "pci/replay_counter")) or 0
    procs = []
    for p in gpu.findall("processes/process_info"):
        pid, name = _int(text(p, "pid")), text(p, "process_name")
        kind = text(p, "type") or "C"
        if pid is None or not name:
            continue
        procs.append(
            {
                "pid": pid,
                "name": name[:63],
                "used_memory_mib": _int(text(p, "used_memory")) or 0,
                "type": "G" if kind == "G" else "C",
            }
        )
    s["processes"] = procs[:16]

    unit = {
        "bus_id": text(gpu, "pci/pci_bus_id") or gpu.get("id"),
        "module_id": _int(text(gpu, "gpu_module_id")) or _int(text(gpu, "platformInfo/module_id")),
        "serial": text(gpu, "serial"),
        "uuid": text(gpu, "uuid"),
        "arch_inferred": arch_inferred,
    }
    return s, unit, notes


# ---- completing files ----------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return read_bytes(path).decode(errors="replace")
    except CaptureError as exc:
        raise ImportFailure(str(exc)) from None


def query_csv(path: Path) -> list[dict[str, str]]:
    """Rows of ``--query-gpu`` output, one dict per GPU (field name without unit -> value)."""
    rows = list(csv.reader(io.StringIO(_read_text(path))))
    rows = [[c.strip() for c in r] for r in rows if r]
    if not rows:
        raise ImportFailure(f"{path}: empty --query-gpu CSV")
    names = [re.sub(r"\s*\[.*\]$", "", c) for c in rows[0]]
    if len(rows) > 1 and all(len(r) == len(names) for r in rows[1:]) and len(names) > 2:
        return [dict(zip(names, r, strict=True)) for r in rows[1:]]
    # one "field,value" row per line (tools/capture style, a single GPU)
    single = {r[0]: r[1] for r in rows if len(r) >= 2 and not r[1].startswith("Field ")}
    if not single:
        raise ImportFailure(f"{path}: not nvidia-smi --query-gpu CSV (no header of field names)")
    return [single]


def nvml_dump(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(_read_text(path))
        devices = data["devices"]
        if not isinstance(devices, list):
            raise TypeError("devices is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise ImportFailure(f"{path}: not an NVML dump of tools/capture/nvml_dump.py ({exc})") from None
    return [d if isinstance(d, dict) else {} for d in devices]


def smi_text(path: Path) -> list[dict[str, str]]:
    """``nvidia-smi -q`` text: per GPU, "Section/Key" -> value for every line."""
    gpus: list[dict[str, str]] = []
    stack: list[tuple[int, str]] = []
    for line in _read_text(path).splitlines():
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:", line):
            gpus.append({})
            stack = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path_key = "/".join([s for _, s in stack] + [key])
        if sep and value.strip():
            gpus[-1][path_key] = value.strip()
        else:
            stack.append((indent, key))
    if not gpus:
        raise ImportFailure(f"{path}: not nvidia-smi -q text (no 'GPU <bus id>' section)")
    return gpus


def _ok(dump: dict[str, Any], key: str) -> Any:
    entry = dump.get(key)
    return entry.get("ok") if isinstance(entry, dict) else None


# ---- the closest built-in board ------------------------------------------------------


def closest_builtin(spec: dict[str, Any]) -> profiles.Profile:
    arch = spec.get("architecture")
    device_id = spec.get("pci", {}).get("device_id")
    total = spec.get("memory", {}).get("total_mib", 0)

    def score(p: profiles.Profile) -> tuple[int, int, int]:
        g = p.gpu
        same_device = int(device_id is not None and g.pci.device_id == device_id)
        distance = abs(ARCHITECTURES.index(g.architecture) - ARCHITECTURES.index(arch)) if arch else 9
        return (same_device, -distance, -abs(g.memory.total_mib - total))

    return max((profiles.load(n) for n in profiles.builtin_names()), key=score)


def _leaves(data: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix


def _value_at(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def _merge_missing(spec: dict[str, Any], base: dict[str, Any], prefix: str, taken: list[str]) -> dict[str, Any]:
    """``spec`` with every key it lacks taken from ``base`` (recursively); record which."""
    out = dict(spec)
    for key, value in base.items():
        where = f"{prefix}.{key}" if prefix else key
        if key not in out:
            out[key] = value
            if isinstance(value, dict) and value:
                taken.extend(
                    leaf for leaf in _leaves(value, where) if _value_at(value, leaf[len(where) + 1 :]) is not None
                )
            elif value is not None:  # a default N/A lends nothing
                taken.append(where)
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = _merge_missing(out[key], value, where, taken)
    return out


def _diff(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in other.items():
        if key not in base:
            out[key] = value
        elif isinstance(value, dict) and isinstance(base[key], dict):
            sub = _diff(base[key], value)
            if sub:
                out[key] = sub
        elif value != base[key]:
            out[key] = value
    return out


# ---- putting it together -------------------------------------------------------------


def import_capture(
    capture: Path,
    *,
    name: str | None = None,
    query: Path | None = None,
    nvml: Path | None = None,
    smi_q: Path | None = None,
    keep_ids: bool = False,
    driver: str | None = None,
    cuda: str | None = None,
) -> ImportResult:
    try:
        root = parse(capture)
        legacy = legacy_power(capture)
    except CaptureError as exc:
        raise ImportFailure(str(exc)) from None
    gpus = root.findall("gpu")
    specs, units, notes = [], [], []
    mig_inferred: set[str] = set()
    for index, gpu in enumerate(gpus):
        spec, unit, gpu_notes = _spec(gpu, legacy.get(index, {}))
        specs.append(spec)
        units.append(unit)
        notes += [f"GPU {index}: {n}" for n in gpu_notes]
        board = mig.board_for(spec.get("pci", {}).get("device_id", 0))
        found = mig_import.layout(gpu, index, board, spec["name"])
        if found.spec is not None:
            spec["mig"] = found.spec
        notes += found.notes
        mig_inferred.update(found.inferred)
    csv_rows = query_csv(query) if query else []
    dumps = nvml_dump(nvml) if nvml else []
    texts = smi_text(smi_q) if smi_q else []
    inferred: list[str] = []
    derived: set[str] = set()
    for index, spec in enumerate(specs):
        row = csv_rows[index] if index < len(csv_rows) else {}
        dump = dumps[index] if index < len(dumps) else {}
        txt = texts[index] if index < len(texts) else {}
        _complete(spec, row, dump, txt, derived)
        if units[index]["arch_inferred"] and "architecture" in spec:
            derived.add("architecture")
    base = closest_builtin(specs[0])
    base_spec = base.gpu.model_dump()
    same_board = base.gpu.pci.device_id == specs[0].get("pci", {}).get("device_id")
    unknown: list[str] = []
    if not same_board:
        for key in SAME_BOARD_ONLY:
            head, _, tail = key.partition(".")
            if tail:
                base_spec[head] = {k: v for k, v in base_spec[head].items() if k != tail}
            else:
                base_spec.pop(head)
            if not _has(specs[0], key):
                unknown.append(key)
        for spec in specs:
            spec.setdefault("cuda_cores", None)
            spec.setdefault("nvlink", {"links": 0})
            spec.setdefault("memory", {}).setdefault("bus_width", None)
    for key in ("serial", "uuid", "module_id", "lost", "mig"):
        base_spec.pop(key, None)
    full = []
    for spec in specs:
        taken: list[str] = []
        full.append(_merge_missing(spec, base_spec, "", taken))
        inferred = sorted(set(inferred) | set(taken))
    inferred = sorted(set(inferred) | derived | mig_inferred)
    gpu_dicts = []
    for i, f in enumerate(full):
        try:
            gpu_dicts.append(profiles.GpuSpec.model_validate(f).model_dump(mode="json"))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ImportFailure(f"{capture}: GPU {i}: cannot model {where}: {err['msg']}") from None
    for d in gpu_dicts:
        _tidy_mig(d)
    shared = gpu_dicts[0]
    overrides = {i: d for i in range(1, len(gpu_dicts)) if (d := _diff(shared, gpu_dicts[i]))}
    for i, d in overrides.items():
        if "mig" in d:  # a layout is replaced whole, never merged into GPU 0's
            d["mig"] = gpu_dicts[i].get("mig") and {"instances": [], **gpu_dicts[i]["mig"]}
    if keep_ids:
        for i, unit in enumerate(units):
            ids = {k: unit[k] for k in ("serial", "uuid") if unit[k]}
            if ids:
                overrides.setdefault(i, {}).update(ids)
        shared.pop("serial", None)
        shared.pop("uuid", None)
    for d in [shared, *overrides.values()]:
        for key in ("serial", "uuid"):
            if key in d and d[key] is None:
                d.pop(key)
    version = driver or text(root, "driver_version")
    cuda_version = cuda or text(root, "cuda_version")
    data: dict[str, Any] = {
        "name": name or _slug(shared["name"]),
        "description": f"{len(gpus)}x {shared['name']}, imported from {capture.name}",
        "source": f"{capture.name} (nvidia-smi -q -x, driver {text(root, 'driver_version') or 'unknown'})",
        "gpu_count": len(gpus),
    }
    drv: dict[str, str] = {}
    if version and re.match(r"^\d+\.\d+(\.\d+)?$", version):
        drv["version"] = version
    if cuda_version and re.match(r"^\d+\.\d+$", cuda_version):
        drv["cuda"] = cuda_version
    if drv:
        data["driver"] = drv
    bus_ids = [u["bus_id"] for u in units]
    topology: dict[str, Any] = {}
    if all(bus_ids) and len(set(bus_ids)) == len(bus_ids):
        topology["bus_ids"] = bus_ids
    module_ids = [u["module_id"] for u in units]
    if all(m is not None for m in module_ids):
        topology["module_ids"] = module_ids
    if same_board and base.topology.nvswitches and len(gpus) == base.gpu_count:
        topology["nvswitches"] = list(base.topology.nvswitches)
        topology["nvswitch_device_id"] = base.topology.nvswitch_device_id
        inferred.append("topology.nvswitches")
    if topology:
        data["topology"] = topology
    data["gpu"] = shared
    if overrides:
        data["gpus"] = overrides
    try:
        profiles.Profile.model_validate(data)
    except ValidationError as exc:
        raise ImportFailure(f"{capture}: {profiles._first_error(exc)}") from None
    return ImportResult(data=data, base=base.name, inferred=inferred, unknown=unknown, notes=notes)


def _tidy_mig(gpu: dict[str, Any]) -> None:
    """Drop the defaults a validated ``mig`` section dumps (None), so the YAML says only what the
    capture showed."""
    section = gpu.get("mig")
    if not isinstance(section, dict):
        return
    gpu["mig"] = {k: v for k, v in section.items() if v is not None}
    if "instances" in gpu["mig"]:
        gpu["mig"]["instances"] = [{k: v for k, v in i.items() if v is not None} for i in gpu["mig"]["instances"]]
    if not gpu["mig"].get("instances"):
        gpu["mig"].pop("instances", None)


def _has(spec: dict[str, Any], dotted: str) -> bool:
    node: Any = spec
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _complete(
    spec: dict[str, Any], row: dict[str, str], dump: dict[str, Any], txt: dict[str, str], derived: set[str]
) -> None:
    """Fill what the XML lacks from the completing files of the same GPU."""
    cc = row.get("compute_cap")
    cap = _ok(dump, "nvmlDeviceGetCudaComputeCapability")
    if isinstance(cap, list) and len(cap) == 2:
        spec["compute_capability"] = f"{cap[0]}.{cap[1]}"
    elif cc and re.match(r"^\d+\.\d+$", cc):
        spec["compute_capability"] = cc
    elif "architecture" in spec:
        spec["compute_capability"] = _compute_capability(spec["architecture"], spec.get("pci", {}).get("device_id"))
        derived.add("compute_capability")
    cores = _ok(dump, "nvmlDeviceGetNumGpuCores")
    if isinstance(cores, int):
        spec["cuda_cores"] = cores
    width = _ok(dump, "nvmlDeviceGetMemoryBusWidth")
    if isinstance(width, int):
        spec.setdefault("memory", {})["bus_width"] = width
    temp = spec.setdefault("temperature", {})
    for key, th in (
        ("memory_max", "MEM_MAX"),
        ("gpu_max", "GPU_MAX"),
        ("shutdown", "SHUTDOWN"),
        ("slowdown", "SLOWDOWN"),
    ):
        v = _ok(dump, f"nvmlDeviceGetTemperatureThreshold[NVML_TEMPERATURE_THRESHOLD_{th}]")
        if isinstance(v, int) and temp.get(key) is None:
            temp[key] = v
    links = [_ok(dump, f"nvmlDeviceGetNvLinkState[{i}]") for i in range(18)]
    if dump and any(v is not None for v in links):
        spec["nvlink"] = {"links": sum(1 for v in links if v is not None)}
    elif dump and "nvmlDeviceGetNvLinkState[0]" in dump:
        spec["nvlink"] = {"links": 0}
    if not spec.get("board_part_number") and txt.get("Board Part Number") not in (None, "N/A"):
        spec["board_part_number"] = txt["Board Part Number"]
    if not spec.get("gpu_part_number") and txt.get("GPU Part Number") not in (None, "N/A"):
        spec["gpu_part_number"] = txt["GPU Part Number"]
    if not spec.get("vbios_version") and txt.get("VBIOS Version") not in (None, "N/A"):
        spec["vbios_version"] = txt["VBIOS Version"]
