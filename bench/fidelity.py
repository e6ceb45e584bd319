"""How faithfully the mock reproduces a real board: compare `nvidia-smi -q -x` outputs.

Every GPU of a capture is compared with the mock's GPU of the same index, element by element
(paths as ``pci/pci_gpu_link_info/pcie_gen/max_link_gen``; repeated siblings get an index).

Each element belongs to one field class (:func:`field_class`):

- ``identity``: what names one physical unit or its place (serials, UUIDs, bus ids, module and
  board ids, fabric GUIDs, clique and cluster ids) — never scored;
- ``host``: what the driver or the host decides (driver, CUDA and GSP versions, display-mode
  and reset-status wording, addressing and virtualization mode, the host bridge's PCIe
  generation) — never scored;
- ``live``: readings that change by the second (temperatures, draws, current clocks,
  utilization, memory in use, event reasons and their counters, PCIe traffic and replays,
  processes) — reported, not scored;
- ``board``: facts of the board model (names, part numbers, VBIOS, InfoROM, PCI ids and link
  limits, memory and BAR1 sizes, power limits, maximum, default and supported clocks,
  temperature thresholds, row-remapper banks);
- ``config``: modes and settings (persistence, ECC, MIG, compute and accounting mode, sparse
  operation, C2C, fabric state, applications clocks, the power limit in force);
- ``health``: error state of a healthy board (ECC and SRAM counters and sources, retired pages,
  remapped rows, repair flags, fabric health);
- ``mig``: the MIG devices a capture lists (``mig_devices``: instance IDs, SM and engine counts,
  memory and BAR1 sizes; the memory in use there is ``live``) — scored: `mokka profile import`
  turns them into the profile's MIG layout.

A *value-carrying* element is one the capture prints with a value (not N/A, Not Supported or
empty). Two rules count them:

- **strict** (the bar): every value-carrying ``board``, ``config``, ``health`` and ``mig`` element
  of the capture counts, wherever it sits. It matches when the mock prints the same text at the same
  path. An element the mock does not print counts as a miss, unless the nvidia-smi release that
  read the mock does not know the element at all (its name, or a parent's, is missing from the
  DTD the binary embeds: :func:`dtd_elements`) — those are listed as unprintable, outside the
  count. Supported-clock lists longer than 535/550 can print (see ``SMI_CLOCK_LIST_LIMIT``)
  and architecture names a release does not know (it prints "Unknown") are unprintable too.
- **lenient** (the scorer before the strict rule): board and config elements outside the ECC,
  temperature-reading and remapped-row subtrees, counting only elements the mock prints or
  repeats.

A capture element without a value is not counted; if the mock prints a value there, it is
listed as *invented* (strict classes), and there must be none.

One file, though long: the field classes, the comparison and its report are one rule; the
tests and the docs quote its classes by this module's name.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpumodel import smi_xml

if TYPE_CHECKING:
    from gpumodel.profile import Profile

CLASSES = ("board", "config", "health", "live", "mig", "identity", "host")
SCORED = ("board", "config", "health", "mig")
NA = {"N/A", "Not Supported", "[N/A]", ""}

IDENTITY_NAMES = {
    "serial",
    "uuid",
    "pdi",
    "minor_number",
    "board_id",
    "module_id",
    "gpu_module_id",
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
}
HOST_NAMES = {
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
# Subtrees whose wording the driver release decides: reset status is "No" through NVML's
# field values on 535-580, but nvidia-smi 570 prints "Requested functionality has been
# deprecated" there and 580 drops the element.
HOST_SUBTREES = {"gpu_reset_status"}
LIVE_NAMES = {
    "timestamp",
    "gpu_temp",
    "memory_temp",
    "gpu_temp_tlimit",
    "average_power_draw",
    "instant_power_draw",
    "power_draw",
    "power_state",
    "performance_state",
    "used",
    "free",
    "replay_counter",
    "replay_rollover_counter",
    "tx_util",
    "rx_util",
    "fan_speed",
    "processes",
    "accounted_processes",
    "graphics_volt",
}
LIVE_SUBTREES = {
    "clocks",
    "clocks_event_reasons",
    "clocks_event_reasons_counters",
    "clocks_throttle_reasons",
    "utilization",
    "encoder_stats",
    "fbc_stats",
    "processes",
    "accounted_processes",
    "inforom_bbx_flush",
}
# What a MIG device's processes change: its memory (and BAR1) in use.
MIG_LIVE_NAMES = {"used", "free"}
HEALTH_SUBTREES = {"ecc_errors", "retired_pages", "remapped_rows", "health"}
HEALTH_NAMES = {"gpu_recovery_action"}
CONFIG_NAMES = {
    "persistence_mode",
    "accounting_mode",
    "accounting_mode_buffer_size",
    "compute_mode",
    "display_active",
    "display_attached",
    "c2c_mode",
    "sparse_operation_mode",
    "mig_devices",
    "power_smoothing",
    "edpp_multiplier",
    "gpu_target_temperature",
    "vgpu_heterogeneous_mode",
    "relaxed_ordering_mode",
    "current_power_limit",
    "requested_power_limit",
    "state",
    "status",
}
CONFIG_SUBTREES = {
    "mig_mode",
    "ecc_mode",
    "driver_model",
    "gpu_operation_mode",
    "clock_policy",
    "applications_clocks",
    "deferred_clocks",
    "dram_encryption_mode",
    "power_profiles",
    "capabilities",
    "supported_gpu_target_temp",
}
# Subtrees whose elements are board facts even where their names look live.
BOARD_SUBTREES = {"max_clocks", "default_applications_clocks", "max_customer_boost_clocks", "supported_clocks"}
BOARD_IN_HEALTH = {"row_remapper_histogram_max"}

# The scorer used before the strict rule (kept to report its figure): static elements were
# those under these parents, or outside the skipped subtrees and names.
LENIENT_STATIC_PARENTS = {
    "max_clocks",
    "applications_clocks",
    "default_applications_clocks",
    "max_customer_boost_clocks",
    "supported_clocks",
    "deferred_clocks",
}
LENIENT_SKIP_SUBTREES = {
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
LENIENT_KEEP_TEMPERATURE = {
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
LENIENT_SKIP_NAMES = (
    IDENTITY_NAMES
    | HOST_NAMES
    | LIVE_NAMES
    | {
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
        "session_count",
        "average_fps",
        "average_latency",
        "latest_timestamp",
        "latest_duration",
        "retired_pagelist",
    }
)

# nvidia-smi 535/550 ask nvmlDeviceGetSupportedGraphicsClocks for at most 256 clocks
# (seen: count=256 on input); the NVML contract answers INSUFFICIENT_SIZE for longer
# lists and those releases print "Unknown Error". Longer lists (GB200, GB300: 260) are
# something those releases cannot print, so they are left out and reported as such.
SMI_CLOCK_LIST_LIMIT = 256


def _parts(path: str) -> list[str]:
    return [re.sub(r"\[\d+\]$", "", p) for p in path.split("/")]


def field_class(path: str) -> str:
    """The class of an element path (see the module docstring)."""
    parts = _parts(path)
    name, parents = parts[-1], set(parts[:-1])
    if "mig_devices" in parents:
        return "live" if name in MIG_LIVE_NAMES else "mig"
    if name in IDENTITY_NAMES:
        return "identity"
    if name in HOST_NAMES or parents & HOST_SUBTREES:
        return "host"
    if parents & BOARD_SUBTREES:
        return "board"
    if name in BOARD_IN_HEALTH:
        return "board"
    if parents & HEALTH_SUBTREES or name in HEALTH_NAMES:
        return "health"
    if parents & LIVE_SUBTREES or name in LIVE_NAMES:
        return "live"
    if parents & CONFIG_SUBTREES or name in CONFIG_NAMES:
        return "config"
    return "board"


def in_lenient(path: str) -> bool:
    """Whether the scorer before the strict rule counted this element."""
    parts = _parts(path)
    name = parts[-1]
    if any(p in LENIENT_STATIC_PARENTS for p in parts[:-1]):
        return True
    if "temperature" in parts[:-1]:
        return name in LENIENT_KEEP_TEMPERATURE
    if "remapped_rows" in parts:
        return name == "row_remapper_histogram_max"
    joined = "/".join(parts)
    if any(sub in parts[:-1] or joined.startswith(sub) or f"/{sub}" in joined for sub in LENIENT_SKIP_SUBTREES):
        return False
    return name not in LENIENT_SKIP_NAMES


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


def dtd_elements(nvidia_smi: Path) -> frozenset[str]:
    """Element names of the `-q -x` DTD an nvidia-smi binary embeds: what that release prints."""
    text = subprocess.run(["strings", "-n", "6", str(nvidia_smi)], capture_output=True, text=True, check=True).stdout
    return frozenset(re.findall(r"<!ELEMENT\s+(\S+)", text))


def _shape(path: str) -> str:
    return re.sub(r"\[\d+\]", "", path)


@dataclass
class Tally:
    compared: int = 0
    matched: int = 0

    @property
    def share(self) -> float:
        return self.matched / self.compared if self.compared else 0.0

    def add(self, ok: bool) -> None:
        self.compared += 1
        self.matched += ok


@dataclass
class Report:
    strict: Tally = field(default_factory=Tally)
    lenient: Tally = field(default_factory=Tally)
    classes: dict[str, Tally] = field(default_factory=lambda: {c: Tally() for c in CLASSES})
    unprintable: list[str] = field(default_factory=list)
    invented: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    gpus: int = 0

    # the strict figures, for callers that want one number
    @property
    def compared(self) -> int:
        return self.strict.compared

    @property
    def matched(self) -> int:
        return self.strict.matched

    @property
    def share(self) -> float:
        return self.strict.share


def _unprintable_clock_lists(rl: dict[str, str], ml: dict[str, str]) -> dict[str, int]:
    """Supported-clock groups of the capture too long for the release that read the mock."""
    prefix = "supported_clocks/supported_mem_clock"
    groups: dict[str, int] = {}
    for path in rl:
        if path.startswith(prefix) and "/supported_graphics_clock" in path:
            group = path.split("/supported_graphics_clock")[0]
            groups[group] = groups.get(group, 0) + 1
    return {
        g: n
        for g, n in groups.items()
        if n > SMI_CLOCK_LIST_LIMIT and ml.get(f"{g}/supported_graphics_clock") == "Unknown Error"
    }


# Values a release cannot print whatever the library answers: nvidia-smi 535-555 predate
# Blackwell and print "Unknown" for its architecture number (nvmlDeviceGetArchitecture 10).
RELEASE_UNNAMED = {"product_architecture": "Unknown"}
# Capture values a release never prints (element name, capture value) -> what it prints
# instead. nvidia-smi 555.58.02 prints fabric health "Bandwidth: Degraded" for
# NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE and N/A for every other healthMask tried
# (0..63, every single bit, 0x2 with every other bit): "Full" (DEGRADED_BW_FALSE, which 550
# prints) is out of its reach.
RELEASE_CANNOT_PRINT = {"555": {("bandwidth", "Full"): "N/A"}}


# One quantity, two forms: releases before 535.261 print "SRAM Uncorrectable" on every board;
# later ones split it into parity and SEC-DED on Ampere and newer. The capture's single value
# is compared with the sum of the mock's split.
SPLIT_FORMS = {"sram_uncorrectable": ("sram_uncorrectable_parity", "sram_uncorrectable_secded")}


def _split_form(path: str, ml: dict[str, str]) -> str | None:
    parent, _, name = path.rpartition("/")
    parts = SPLIT_FORMS.get(name)
    if not parts:
        return None
    values = [ml.get(f"{parent}/{p}" if parent else p) for p in parts]
    if any(v is None for v in values):
        return None
    if all(v is not None and v.isdigit() for v in values):
        return str(sum(int(v) for v in values if v is not None))
    return "N/A"


def _printable(path: str, known: frozenset[str] | None, mock_shapes: set[str]) -> bool:
    """Whether the release that read the mock prints this element at all."""
    if known is None:
        return _shape(path) in mock_shapes
    return all(p in known for p in _parts(path))


def compare(capture_xml: str, mock_xml: str, known: frozenset[str] | None = None, release: str | None = None) -> Report:
    """Score every GPU of the capture against the mock's GPU of the same index.

    ``known``: the element names the mock's nvidia-smi release prints (:func:`dtd_elements`);
    without it, an element counts as printable when the mock prints one of its shape.
    ``release``: that release ("550"), for the values it cannot print (RELEASE_CANNOT_PRINT).
    """
    cannot_print = RELEASE_CANNOT_PRINT.get(release or "", {})
    real = [smi_xml.normalized_copy(g) for g in ET.fromstring(capture_xml).findall("gpu")]
    mock = ET.fromstring(mock_xml).findall("gpu")
    report = Report(gpus=len(real))
    for index, r in enumerate(real):
        rl = leaves(r)
        ml = leaves(mock[index]) if index < len(mock) else {}
        if index >= len(mock):
            report.mismatched.append(f"GPU {index}: the mock has no GPU {index}")
        too_long = _unprintable_clock_lists(rl, ml)
        for group, n in too_long.items():
            report.unprintable.append(f"GPU {index} {group}: {n} graphics clocks (> {SMI_CLOCK_LIST_LIMIT})")
        shapes = {_shape(p) for p in ml}
        for path, value in rl.items():
            if any(path.startswith(g + "/") for g in too_long):
                continue
            cls = field_class(path)
            got = ml.get(path)
            if got is None:
                got = _split_form(path, ml)
            if value in NA:
                if cls in SCORED and got is not None and got not in NA:
                    report.invented.append(f"GPU {index} {path}: capture {value or 'empty'!r}, mock {got!r}")
                continue
            ok = got == value
            if not ok and got is not None and cannot_print.get((_parts(path)[-1], value)) == got:
                report.unprintable.append(f"GPU {index} {path}: nvidia-smi {release} cannot print {value!r}")
                continue
            if not ok and got is not None and RELEASE_UNNAMED.get(_parts(path)[-1]) == got:
                report.unprintable.append(f"GPU {index} {path}: {value!r} has no name in this nvidia-smi ({got!r})")
                continue
            if got is None and not _printable(path, known, shapes):
                if cls in SCORED:
                    report.unprintable.append(f"GPU {index} {path}: not printed by this nvidia-smi")
                continue
            report.classes[cls].add(ok)
            if cls in SCORED:
                report.strict.add(ok)
                if not ok:
                    shown = "lacks it" if got is None else repr(got)
                    report.mismatched.append(f"GPU {index} {path}: capture {value!r}, mock {shown}")
            if in_lenient(path) and (got is not None or _shape(path) in shapes):
                report.lenient.add(ok)
    return report


def table_row(name: str, version: str, report: Report) -> str:
    """One line of the per-profile table: strict, per class, lenient, invented."""
    cells = [name, version, f"{report.gpus}", f"{report.strict.matched}/{report.strict.compared} {report.share:.1%}"]
    for cls in ("board", "config", "health", "live", "mig"):
        t = report.classes[cls]
        cells.append(f"{t.share:.1%}" if t.compared else "-")
    cells.append(f"{report.lenient.share:.1%}")
    cells.append(str(len(report.invented)))
    return "| " + " | ".join(cells) + " |"


TABLE_HEADER = (
    "| profile | nvidia-smi | GPUs | strict (board+config+health+mig) | board | config | health | live (not scored) "
    "| mig | lenient | invented |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


# ---- the built-in profiles against their captures --------------------------------------

CAPTURES = Path(__file__).resolve().parent.parent / "tests" / "captures"
BUILTIN_CAPTURES = {
    "a100": "qx-a100.xml",
    "b200": "qx-b200.xml",
    "gb200": "qx-gb200.xml",
    "gb300": "qx-gb300.xml",
    "h100": "qx-h100.xml",
    "h200": "h200/qx-h200.xml",
    "l40s": "qx-l40s.xml",
    "t4": "qx-t4.xml",
}


def gpu_count(capture_xml: str) -> int:
    return len(ET.fromstring(capture_xml).findall("gpu"))


def score_profile(
    profile: Profile, capture_xml: str, nvidia_smi: Path, workdir: Path, release: str | None = None
) -> Report:
    """Stage ``profile`` with the capture's GPU count, read it with ``nvidia_smi -q -x``, score it."""
    from gpumodel import driver_root

    root = driver_root.stage(profile.with_count(gpu_count(capture_xml)), workdir)
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(root.libdir)}
    res = subprocess.run([str(nvidia_smi), "-q", "-x"], env=env, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"nvidia-smi -q -x exited {res.returncode}: {(res.stdout + res.stderr).strip()[:500]}")
    return compare(capture_xml, res.stdout, dtd_elements(nvidia_smi), release)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.fidelity [--smi 550,535,555] [PROFILE...]``: the per-profile table."""
    import argparse
    import tempfile

    from fetch import nvidia_smi as smi_fetcher
    from gpumodel import profile as profiles

    ap = argparse.ArgumentParser(prog="python -m bench.fidelity", description=main.__doc__)
    ap.add_argument("profiles", nargs="*", default=sorted(BUILTIN_CAPTURES))
    ap.add_argument("--smi", default="550,535,555", help="nvidia-smi releases (Debian's), comma-separated")
    ap.add_argument("-v", "--verbose", action="store_true", help="list mismatches and invented values")
    args = ap.parse_args(argv)
    print(TABLE_HEADER)
    with tempfile.TemporaryDirectory(prefix="mokka-fidelity-") as tmp:
        for name in args.profiles:
            capture = (CAPTURES / BUILTIN_CAPTURES[name]).read_text()
            for version in args.smi.split(","):
                smi = smi_fetcher.fetch(version)
                report = score_profile(profiles.load(name), capture, smi, Path(tmp) / name, version)
                print(table_row(name, version, report))
                if args.verbose:
                    for line in report.mismatched + [f"invented: {i}" for i in report.invented]:
                        print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---- `mokka profile import` round trips ---------------------------------------------


def release_for(driver: str | None) -> str:
    """The Debian nvidia-smi release closest to a capture's driver (535 for anything older)."""
    major = int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else 550
    return "535" if major < 550 else "550" if major < 555 else "555"


def roundtrip(capture: Path, nvidia_smi: Path, workdir: Path, release: str | None = None) -> Report:
    """Import a capture, stage the profile, read it back with ``nvidia_smi``, score it."""
    from gpumodel import importer
    from gpumodel import profile as profiles
    from gpumodel.smi_xml import read_bytes

    result = importer.import_capture(capture)
    prof = profiles.Profile.model_validate(result.data)
    return score_profile(prof, read_bytes(capture).decode(errors="replace"), nvidia_smi, workdir, release)
