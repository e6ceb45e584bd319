"""Reading `nvidia-smi -q -x` output of any release from 470 on (earlier ones too, as far as
their elements go): plain or gzip-compressed, with the element names of older releases
mapped onto the names current releases print, so that one reader and one scorer serve them all.

Renamed or reshaped between releases (the DTD versions v11 -> v12 -> v13):
- ``power_readings`` (one block, ``power_limit``) became ``gpu_power_readings`` with
  ``current_power_limit``/``requested_power_limit``; ``enforced_power_limit`` and
  ``power_management`` left the XML;
- ``clocks_throttle_reasons``/``clocks_throttle_reason_*`` became
  ``clocks_event_reasons``/``clocks_event_reason_*``;
- ECC counts per location (``single_bit``/``double_bit`` x ``device_memory``, ``l1_cache``,
  ...) became ``dram_correctable``/``dram_uncorrectable`` and ``sram_*`` (the other locations).
"""

from __future__ import annotations

import copy
import gzip
import xml.etree.ElementTree as ET
from pathlib import Path

NA_TEXT = {"N/A", "Not Supported", "[N/A]", "", "Unknown Error", "Insufficient Permissions"}
SRAM_LOCATIONS = ("register_file", "l1_cache", "l2_cache", "texture_memory", "texture_shm", "cbu", "sram")


class CaptureError(Exception):
    """A file is not a readable `nvidia-smi -q -x` capture; the message says which and why."""


def read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CaptureError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise CaptureError(f"{path}: not a valid gzip file: {exc}") from None
    return raw


def parse(path: Path) -> ET.Element:
    """The ``nvidia_smi_log`` root of a capture file, legacy elements renamed."""
    raw = read_bytes(path)
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as exc:
        raise CaptureError(f"{path}: not an nvidia-smi -q -x capture (XML error: {exc})") from None
    if root.tag != "nvidia_smi_log":
        raise CaptureError(f"{path}: not an nvidia-smi -q -x capture (root element <{root.tag}>)")
    gpus = root.findall("gpu")
    if not gpus:
        raise CaptureError(f"{path}: the capture lists no <gpu>")
    for gpu in gpus:
        normalize(gpu)
    return root


def text(elem: ET.Element | None, path: str) -> str | None:
    """The stripped text at ``path`` under ``elem``; None when absent or N/A."""
    if elem is None:
        return None
    found = elem.find(path)
    if found is None or len(found):
        return None
    value = (found.text or "").strip()
    return None if value in NA_TEXT else value


def _rename(parent: ET.Element, old: str, new: str) -> None:
    for child in parent.findall(old):
        child.tag = new


def _sum_counts(block: ET.Element, names: tuple[str, ...]) -> str:
    values = [v for v in (text(block, n) for n in names) if v is not None]
    return str(sum(int(v) for v in values)) if values and all(v.isdigit() for v in values) else "N/A"


def _normalize_ecc(ecc: ET.Element) -> None:
    for scope in ("volatile", "aggregate"):
        block = ecc.find(scope)
        if block is None or block.find("single_bit") is None:
            continue
        single, double = block.find("single_bit"), block.find("double_bit")
        new = ET.Element(scope)
        for name, source, names in (
            ("sram_correctable", single, SRAM_LOCATIONS),
            ("sram_uncorrectable", double, SRAM_LOCATIONS),
            ("dram_correctable", single, ("device_memory",)),
            ("dram_uncorrectable", double, ("device_memory",)),
        ):
            ET.SubElement(new, name).text = _sum_counts(source, names) if source is not None else "N/A"
        index = list(ecc).index(block)
        ecc.remove(block)
        ecc.insert(index, new)


def normalize(gpu: ET.Element) -> ET.Element:
    """Rename one ``<gpu>`` element's legacy children in place to the current names."""
    power = gpu.find("power_readings")
    if power is not None and gpu.find("gpu_power_readings") is None:
        power.tag = "gpu_power_readings"
        _rename(power, "power_limit", "current_power_limit")
        for gone in ("enforced_power_limit", "power_management"):
            for child in power.findall(gone):
                power.remove(child)
    reasons = gpu.find("clocks_throttle_reasons")
    if reasons is not None:
        reasons.tag = "clocks_event_reasons"
        for child in reasons:
            child.tag = child.tag.replace("clocks_throttle_reason_", "clocks_event_reason_")
    ecc = gpu.find("ecc_errors")
    if ecc is not None:
        _normalize_ecc(ecc)
    return gpu


def legacy_power(path: Path) -> dict[int, dict[str, str | None]]:
    """What the legacy power block said that its normalized form drops, per GPU index
    (``power_management``, ``enforced_power_limit``): read from the raw file."""
    root = ET.fromstring(read_bytes(path))
    out: dict[int, dict[str, str | None]] = {}
    for index, gpu in enumerate(root.findall("gpu")):
        block = gpu.find("power_readings")
        if block is not None:
            out[index] = {k: text(block, k) for k in ("power_management", "enforced_power_limit")}
    return out


def normalized_copy(gpu: ET.Element) -> ET.Element:
    return normalize(copy.deepcopy(gpu))
