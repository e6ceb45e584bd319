"""A capture's MIG layout as a profile's ``mig`` section (`mokka profile import`).

``nvidia-smi -q -x`` shows, per GPU, the MIG mode (current, pending) and one ``mig_device`` per
compute instance: its GPU instance (GI) and compute instance (CI) IDs, the CI's SM count, the GI's
shared engine counts (copy engines, decoders, encoders, JPEG, OFA) and the GI's memory. It does
not name profiles and does not show placements. From the board's MIG table (``mig.py``):

- each GI's profile is the one whose memory, engines and CI SM counts the capture shows (on an
  A100 80GB, 1g.20gb and 2g.20gb share their memory and differ in copy engines and SMs);
- each CI's profile is the GI's CI profile with the CI's SM count;
- a GI's placement is not in the capture: it is taken from the GI's ID as the mock numbers GIs
  (ID = the placement's first ID + start / size, see ``mig.gi_id``), so the mock shows the
  captured IDs; where that placement is not possible, the driver's own choice
  (``mig.choose_gi_start``) is left to stand, and the notes say so;
- CI placements and IDs come out as the driver gives them (first free placement, lowest free ID).

The result is checked with ``mig.plan``: a layout that could not exist on the board is not
imported (the notes say why) and the GPU keeps its captured MIG mode.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import mig
from .smi_xml import text

# Shared engine elements of a MIG device's device_attributes -> GpuProfile attribute.
ENGINES = {
    "copy_engine_count": "copy_engines",
    "decoder_count": "decoders",
    "encoder_count": "encoders",
    "jpg_count": "jpeg",
    "ofa_count": "ofa",
}
# How far the capture's GI memory may be from the table's (driver releases differ by a few
# hundred MiB for the same profile) before no profile is taken to be the one it shows.
MEMORY_TOLERANCE = 0.05


@dataclass
class CapturedGi:
    """What the capture shows of one GPU instance (through its MIG devices)."""

    id: int
    memory_mib: int | None = None
    engines: dict[str, int] = field(default_factory=dict)
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (CI id, SMs)


@dataclass
class MigImport:
    """The ``mig`` section for one GPU (None: leave MIG as ``modes.mig`` says) and what to tell."""

    spec: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    inferred: list[str] = field(default_factory=list)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    head = value.split()[0] if value.split() else ""
    return int(head) if head.isdigit() else None


def _mode(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() == "enabled"


def captured_instances(gpu: ET.Element) -> list[CapturedGi] | str:
    """The GPU instances a ``<gpu>``'s MIG devices show, in GI-ID order; or why they cannot be read."""
    gis: dict[int, CapturedGi] = {}
    for n, dev in enumerate(gpu.findall("mig_devices/mig_device")):
        gi_id, ci_id = _int(text(dev, "gpu_instance_id")), _int(text(dev, "compute_instance_id"))
        if gi_id is None or ci_id is None:
            return f"MIG device {n} shows no GPU/compute instance ID"
        gi = gis.setdefault(gi_id, CapturedGi(gi_id))
        if any(c == ci_id for c, _ in gi.compute):
            return f"MIG device {n} repeats GPU instance {gi_id}, compute instance {ci_id}"
        memory = _int(text(dev, "fb_memory_usage/total"))
        if memory is not None:
            gi.memory_mib = memory
        for name in ENGINES:
            value = _int(text(dev, f"device_attributes/shared/{name}"))
            if value is not None:
                gi.engines[name] = value
        gi.compute.append((ci_id, _int(text(dev, "device_attributes/shared/multiprocessor_count"))))
    for gi in gis.values():
        if gi.memory_mib is None and not gi.engines and all(sms is None for _, sms in gi.compute):
            return f"GPU instance {gi.id}'s MIG devices show neither memory nor SMs nor engines"
    return [gis[k] for k in sorted(gis)]


def _misfit(p: mig.GpuProfile, gi: CapturedGi) -> tuple[int, float] | None:
    """How badly ``p`` explains ``gi``: (shown counts it contradicts, memory distance); None if it
    cannot be that GI (memory too far off, more compute instances than compute slices)."""
    distance = 0.0
    if gi.memory_mib is not None:
        distance = abs(p.memory_mib - gi.memory_mib) / p.memory_mib
        if distance > MEMORY_TOLERANCE:
            return None
    if len(gi.compute) > p.slices:
        return None
    misses = sum(1 for name, value in gi.engines.items() if getattr(p, ENGINES[name]) != value)
    offered = {c.multiprocessors for c in p.compute_profiles()}
    misses += sum(1 for _, sms in gi.compute if sms is not None and sms not in offered)
    return misses, distance


def _gi_profile(board: mig.Board, gi: CapturedGi) -> tuple[mig.GpuProfile, int, list[mig.GpuProfile]] | None:
    """The table's profile that best explains ``gi``, how many shown counts it contradicts, and
    the other profiles that explain it as well (the capture cannot tell them apart)."""
    scored = [(fit, p) for p in board.profiles if (fit := _misfit(p, gi)) is not None]
    if not scored:
        return None
    scored.sort(key=lambda item: (item[0], item[1].slices, item[1].id))
    (best_fit, best) = scored[0]
    ties = [p for fit, p in scored[1:] if fit == best_fit]
    return best, best_fit[0], ties


def _compute_names(p: mig.GpuProfile, gi: CapturedGi) -> list[str]:
    """The CI profiles of ``gi``'s compute instances, in CI-ID order: by SM count, the whole
    GI's where the capture shows none (the default a CI is created with)."""
    out = []
    full = next(c for c in p.compute_profiles() if c.slices == p.slices)
    for _, sms in sorted(gi.compute):
        match = [c for c in p.compute_profiles() if c.multiprocessors == sms]
        out.append((match[-1] if match else full).name)
    return out


def _compute_specs(p: mig.GpuProfile, names: Sequence[str]) -> list[Any]:
    """The compute list of a GI: the names, created in CI-ID order where the driver's first-free
    placements hold them all; else with the first placements (in that order) that do."""
    profiles = [cp for n in names if (cp := p.compute_profile(n)) is not None]

    def place(gi: mig.GpuInstance, k: int, fixed: bool) -> list[int] | None:
        if k == len(profiles):
            return []
        cp = profiles[k]
        starts = cp.placements if fixed else [s for s in [mig.choose_ci_start(gi, cp)] if s is not None]
        for start in starts:
            if mig.ci_fits(gi, cp, start):
                gi.compute.append(mig.ComputeInstance(cp, start, k))
                rest = place(gi, k + 1, fixed)
                gi.compute.pop()
                if rest is not None:
                    return [start, *rest]
        return None

    if place(mig.GpuInstance(p, 0, 0), 0, fixed=False) is not None:
        return list(names)
    starts = place(mig.GpuInstance(p, 0, 0), 0, fixed=True)
    if starts is None:
        return list(names)  # no arrangement holds them: mig.plan says why
    return [{"profile": n, "placement": s} for n, s in zip(names, starts, strict=True)]


def _start_from_id(p: mig.GpuProfile, gi_id: int) -> int | None:
    k = gi_id - p.first_id
    start = k * p.memory_slices
    return start if k >= 0 and start in p.placements else None


def layout(gpu: ET.Element, index: int, board: mig.Board | None, product: str) -> MigImport:
    """The ``mig`` section for GPU ``index`` of a capture (``board``: its MIG table, if any): only
    where ``modes.mig`` (the current mode, imported with the other modes) does not say it all."""
    out = MigImport()
    current = _mode(text(gpu, "mig_mode/current_mig"))
    pending = _mode(text(gpu, "mig_mode/pending_mig"))
    devices = gpu.findall("mig_devices/mig_device")
    if current is None:
        return out  # not MIG-capable (N/A): modes.mig stays null
    if board is None:
        if devices or pending != current:
            out.notes.append(
                f"GPU {index}: MIG layout not imported ({len(devices)} MIG devices, MIG mode "
                f"{'on' if current else 'off'}): no MIG profile table for {product}; the GPU keeps MIG mode as captured"
            )
        return out
    section: dict[str, Any] = {"mode": current}
    if pending is not None and pending != current:
        section["pending"] = pending
        out.spec = section  # modes.mig alone cannot say a change is pending
    if not devices:
        return out
    where = f"GPU {index}: MIG layout not imported ({len(devices)} MIG devices)"
    if not current:
        out.notes.append(f"{where}: the capture lists MIG devices with MIG mode off")
        return out
    found = captured_instances(gpu)
    if isinstance(found, str):
        out.notes.append(f"{where}: {found}")
        return out
    chosen: list[tuple[CapturedGi, mig.GpuProfile]] = []
    for gi in found:
        match = _gi_profile(board, gi)
        if match is None:
            shown = f"{gi.memory_mib} MiB" if gi.memory_mib is not None else "its engines"
            out.notes.append(f"{where}: GPU instance {gi.id} ({shown}) matches no profile of {board.title}")
            return out
        profile, misses, ties = match
        if ties:
            others = " or ".join(p.name for p in ties)
            out.notes.append(
                f"GPU {index}: GPU instance {gi.id} could be {profile.name} or {others} (the capture shows too "
                f"little to tell): taken as {profile.name}"
            )
        if misses:
            out.notes.append(
                f"GPU {index}: GPU instance {gi.id} taken as {profile.name}, the closest profile of {board.title} "
                f"({misses} of the capture's engine/SM counts differ from the table)"
            )
        elif gi.memory_mib is not None and gi.memory_mib != profile.memory_mib:
            out.notes.append(
                f"GPU {index}: GPU instance {gi.id} taken as {profile.name} ({gi.memory_mib} MiB in the capture, "
                f"{profile.memory_mib} MiB in the table: another driver release)"
            )
        chosen.append((gi, profile))
    specs, placed_by_id = _specs(board, chosen)
    try:
        planned = mig.plan(board, [mig.GpuInstanceSpec.model_validate(s) for s in specs])
    except mig.LayoutError as exc:
        out.notes.append(f"{where}: the layout could not exist on {board.title}: {exc}")
        return out
    section["instances"] = specs
    out.spec = section
    out.notes.append(_summary(index, chosen, placed_by_id, planned))
    out.inferred.append("mig.instances (profiles from memory, SMs and engines; placements)")
    return out


def _specs(
    board: mig.Board, chosen: Sequence[tuple[CapturedGi, mig.GpuProfile]]
) -> tuple[list[dict[str, Any]], set[int]]:
    """Instance specs: those whose GI ID gives a possible placement first (with it), then the
    rest (the driver places them); and the GI IDs placed from their ID."""
    fixed: list[dict[str, Any]] = []
    free: list[dict[str, Any]] = []
    taken: list[mig.GpuInstance] = []
    by_id: set[int] = set()
    for gi, profile in chosen:
        entry: dict[str, Any] = {"profile": profile.name}
        start = _start_from_id(profile, gi.id)
        if start is not None and mig.gi_fits(board, taken, profile, start):
            taken.append(mig.GpuInstance(profile, start, gi.id))
            entry["placement"] = start
            by_id.add(gi.id)
        names = _compute_names(profile, gi)
        if names != [profile.name]:
            entry["compute"] = _compute_specs(profile, names)
        (fixed if "placement" in entry else free).append(entry)
    return fixed + free, by_id


def _summary(
    index: int,
    chosen: Sequence[tuple[CapturedGi, mig.GpuProfile]],
    placed_by_id: set[int],
    planned: Sequence[mig.GpuInstance],
) -> str:
    devices = sum(len(gi.compute) for gi, _ in chosen)
    parts = ", ".join(f"GI {gi.id} {p.name} x{len(gi.compute)} CI" for gi, p in chosen)
    text_ = (
        f"GPU {index}: MIG layout from the capture's {devices} MIG devices ({parts}): profiles deduced from "
        "memory, SMs and engines; placements are not in -q -x: "
    )
    if len(placed_by_id) == len(chosen):
        text_ += "each GI placed where the mock's GI numbering gives its captured ID"
    else:
        text_ += "placed where the GI ID allows, the others where the driver would put them"
    wanted = sorted((gi.id, sorted(c for c, _ in gi.compute)) for gi, _ in chosen)
    got = sorted((g.id, [c.id for c in g.compute]) for g in planned)
    if wanted != got:
        text_ += f"; the mock's GI/CI IDs {got} differ from the capture's {wanted}"
    return text_
