"""How faithfully the mock reproduces a real board: compare `nvidia-smi -q -x` outputs.

Only value-carrying static elements count: identifiers (serials, UUIDs, bus placement),
live readings (temperatures, draws, clocks now, utilization, counters), and what comes
from the driver or the host (versions, GSP firmware, addressing and virtualization
mode) are left out, as are elements one nvidia-smi release prints and the other does
not. Elements the capture shows as N/A carry no value: they are not counted, only checked —
a value the mock reports there is counted as invented, and there must be none.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

# Element names (anywhere in the tree) that are not static board values.
SKIP_NAMES = {
    # identifiers and placement
    "serial",
    "uuid",
    "pdi",
    "minor_number",
    "board_id",
    "module_id",
    "pci_bus",
    "pci_device",
    "pci_domain",
    "pci_bus_id",
    "gpu_fabric_guid",
    "clusterUuid",
    "cliqueId",
    "chassis_serial_number",
    "slot_number",
    "tray_index",
    "host_id",
    "peer_type",
    # live readings
    "timestamp",
    "gpu_temp",
    "memory_temp",
    "gpu_temp_tlimit",
    "average_power_draw",
    "instant_power_draw",
    "power_draw",
    "graphics_clock",
    "sm_clock",
    "mem_clock",
    "video_clock",
    "gpu_util",
    "memory_util",
    "encoder_util",
    "decoder_util",
    "jpeg_util",
    "ofa_util",
    "used",
    "free",
    "replay_counter",
    "replay_rollover_counter",
    "tx_util",
    "rx_util",
    "session_count",
    "average_fps",
    "average_latency",
    "fan_speed",
    "performance_state",
    "power_state",
    "latest_timestamp",
    "latest_duration",
    "processes",
    "accounted_processes",
    "retired_pagelist",
    # from the driver or the host
    "driver_version",
    "cuda_version",
    "gsp_firmware_version",
    "display_mode",
    "addressing_mode",
    "virtualization_mode",
    "host_vgpu_mode",
    "max_host_link_gen",
    "attached_gpus",
}
# Whole subtrees of live state or counters.
SKIP_SUBTREES = {
    "clocks_event_reasons",
    "clocks_event_reasons_counters",
    "clocks_throttle_reasons",
    "ecc_errors",
    "utilization",
    "encoder_stats",
    "fbc_stats",
    "processes",
    "accounted_processes",
    "clocks",
    "fabric/health",
    "remapped_rows",
    "temperature",
}
# Live-looking names that are static inside these parents (max/application clocks, thresholds).
STATIC_PARENTS = {
    "max_clocks",
    "applications_clocks",
    "default_applications_clocks",
    "max_customer_boost_clocks",
    "supported_clocks",
    "deferred_clocks",
}
KEEP_TEMPERATURE = {
    "gpu_temp_max_threshold",
    "gpu_temp_slow_threshold",
    "gpu_temp_max_gpu_threshold",
    "gpu_temp_max_mem_threshold",
    "gpu_target_temperature",
    "gpu_temp_max_tlimit_threshold",
    "gpu_temp_slow_tlimit_threshold",
    "gpu_temp_max_gpu_tlimit_threshold",
    "gpu_temp_max_mem_tlimit_threshold",
}
KEEP_REMAP = {"row_remapper_histogram_max"}
NA = {"N/A", "Not Supported", "[N/A]"}


def leaves(elem: ET.Element, prefix: str = "") -> dict[str, str]:
    """Path → text for every leaf; repeated siblings get an index."""
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    for child in elem:
        counts[child.tag] = counts.get(child.tag, 0) + 1
    seen: dict[str, int] = {}
    for child in elem:
        tag = child.tag
        if counts[tag] > 1:
            tag = f"{tag}[{seen.get(child.tag, 0)}]"
            seen[child.tag] = seen.get(child.tag, 0) + 1
        path = f"{prefix}/{tag}" if prefix else tag
        if len(child):
            out.update(leaves(child, path))
        else:
            out[path] = (child.text or "").strip()
    return out


def _drop_unprintable_lists(rl: dict[str, str], ml: dict[str, str], index: int, report: Report) -> dict[str, str]:
    prefix = "supported_clocks/supported_mem_clock"
    groups: dict[str, list[str]] = {}
    for path in rl:
        if path.startswith(prefix) and "/supported_graphics_clock" in path:
            groups.setdefault(path.split("/supported_graphics_clock")[0], []).append(path)
    for group, paths in groups.items():
        if len(paths) > SMI_CLOCK_LIST_LIMIT and ml.get(f"{group}/supported_graphics_clock") == "Unknown Error":
            report.unprintable.append(f"GPU {index} {group}: {len(paths)} graphics clocks (> {SMI_CLOCK_LIST_LIMIT})")
            rl = {p: v for p, v in rl.items() if p not in set(paths)}
    return rl


def _shape(path: str) -> str:
    return re.sub(r"\[\d+\]", "", path)


def is_static(path: str) -> bool:
    parts = [re.sub(r"\[\d+\]$", "", p) for p in path.split("/")]
    name = parts[-1]
    if any(p in STATIC_PARENTS for p in parts[:-1]):
        return True
    if "temperature" in parts[:-1]:
        return name in KEEP_TEMPERATURE
    if "remapped_rows" in parts:
        return name in KEEP_REMAP
    joined = "/".join(parts)
    if any(sub in parts[:-1] or joined.startswith(sub) or f"/{sub}" in joined for sub in SKIP_SUBTREES):
        return False
    return name not in SKIP_NAMES


# nvidia-smi 535/550 ask nvmlDeviceGetSupportedGraphicsClocks for at most 256 clocks
# (seen: count=256 on input); the NVML contract answers INSUFFICIENT_SIZE for longer
# lists and those releases print "Unknown Error". Longer lists (GB200, GB300: 260) are
# something those releases cannot print, so they are left out and reported as such.
SMI_CLOCK_LIST_LIMIT = 256


@dataclass
class Report:
    compared: int = 0
    matched: int = 0
    unprintable: list[str] = field(default_factory=list)
    invented: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.matched / self.compared if self.compared else 0.0


def compare(capture_xml: str, mock_xml: str) -> Report:
    """Compare every GPU of the capture with the mock's GPU of the same index."""
    real = ET.fromstring(capture_xml).findall("gpu")
    mock = ET.fromstring(mock_xml).findall("gpu")
    report = Report()
    for index, (r, m) in enumerate(zip(real, mock, strict=False)):
        rl, ml = leaves(r), leaves(m)
        rl = _drop_unprintable_lists(rl, ml, index, report)
        shapes = {_shape(p) for p in ml}
        for path, value in rl.items():
            if not is_static(path):
                continue
            if path not in ml:
                # An element this nvidia-smi never prints is left out; a repeated element it
                # does print (a supported clock, say) that the mock lacks is a mismatch.
                if _shape(path) in shapes and value not in NA:
                    report.compared += 1
                    report.mismatched.append(f"GPU {index} {path}: capture {value!r}, mock lacks it")
                continue
            got = ml[path]
            if value in NA:  # not value-carrying: only checked for invention
                if got not in NA:
                    report.invented.append(f"GPU {index} {path}: capture N/A, mock {got!r}")
                continue
            report.compared += 1
            if got == value:
                report.matched += 1
            else:
                report.mismatched.append(f"GPU {index} {path}: capture {value!r}, mock {got!r}")
    return report
