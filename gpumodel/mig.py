"""Multi-Instance GPU: each board's profile tables, the placement rules, and layouts.

A MIG-capable board splits into GPU instances (GIs) of fixed profiles, each occupying a run of
memory slices (its *placement*) and some of the board's GPU slices; a GI splits further into
compute instances (CIs); every CI is a MIG device with its own ``MIG-…`` UUID.

Two numberings name a GI profile: NVML's profile *index* (``NVML_GPU_INSTANCE_PROFILE_1_SLICE``
= 0 …), the argument of ``nvmlDeviceGetGpuInstanceProfileInfo``, and the driver's profile *ID*
(19, 20, 15, 14, 9, 5, 0 on A100/H100/H200/B200/GB200), which nvidia-smi shows and every other
call takes. Compute-instance profile IDs equal their index on these boards.

The tables come from NVIDIA's MIG user guide and public ``nvidia-smi mig -lgip/-lgipp`` captures of
real boards (sources per board below; values marked *inferred* were not seen on a real board).
The same rules are implemented in C (native/src/mig.c) for instances created at run time through
NVML; both choose the same placements and IDs, so a layout declared in a profile and the same
layout created through ``nvidia-smi mig`` come out identical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from .mig_devices import FABRIC_IMEX_MINOR as FABRIC_IMEX_MINOR
from .mig_devices import MAX_CI_ID as MAX_CI_ID
from .mig_devices import MAX_GI_ID as MAX_GI_ID
from .mig_devices import MAX_GPUS_IN_MINORS as MAX_GPUS_IN_MINORS
from .mig_devices import cap_minor as cap_minor
from .mig_devices import mig_minors_text as mig_minors_text

# NVML_GPU_INSTANCE_PROFILE_* indices and NVML_COMPUTE_INSTANCE_PROFILE_* indices (nvml.h).
GI_INDEX = {"1": 0, "2": 1, "3": 2, "4": 3, "7": 4, "8": 5, "6": 6, "1+me": 7, "2+me": 8, "1x2": 9}
CI_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
# GI IDs by placement size (memory slices): the first ID of the run, then one per placement.
# Seen on H100 (1g: 7 + start) and in NVIDIA's user guide (2g: 3 + start/2, 7g: 0).
FIRST_GI_ID = {8: 0, 4: 1, 2: 3, 1: 7}


@dataclass(frozen=True)
class ComputeProfile:
    """A compute-instance profile of one GI profile."""

    index: int
    id: int
    name: str  # "1c.3g.40gb", or the GI's name for the CI spanning the whole GI
    slices: int
    instances: int
    placements: tuple[int, ...]  # starts, in compute slices
    multiprocessors: int


@dataclass(frozen=True)
class GpuProfile:
    """A GPU-instance profile: one row of ``nvidia-smi mig -lgip``."""

    index: int  # NVML_GPU_INSTANCE_PROFILE_*
    id: int  # the driver's profile ID
    name: str  # "1g.10gb+me" (nvidia-smi prefixes "MIG ")
    slices: int  # GPU slices
    memory_slices: int  # placement size
    instances: int
    placements: tuple[int, ...]  # starts, in memory slices
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int

    @property
    def first_id(self) -> int:
        return FIRST_GI_ID[self.memory_slices]

    def compute_profiles(self) -> tuple[ComputeProfile, ...]:
        """The CI profiles a GI of this profile offers (``-lcip``): every c of 1, 2, 3, 4, 7 up
        to the GI's slices that NVIDIA's heuristic keeps (c = g, or 2c <= g + 1: no 3c in a 4g),
        floor(g/c) of them at multiples of c (A100 captures: 1c.3g x3, 2c.3g x1, 1c.4g x4, 2c.4g
        x2; 3c.7g exists). SMs: the GI's share per slice (A100's 14 per slice exactly)."""
        g = self.slices
        out = []
        for c in (1, 2, 3, 4, 7):
            if c > g or (c < g and 2 * c > g + 1):
                continue
            name = self.name if c == g else f"{c}c.{self.name}"
            starts = tuple(range(0, g - c + 1, c))
            out.append(
                ComputeProfile(CI_INDEX[c], CI_INDEX[c], name, c, len(starts), starts, self.multiprocessors * c // g)
            )
        return tuple(out)

    def compute_profile(self, key: str | int) -> ComputeProfile | None:
        for p in self.compute_profiles():
            if key in (p.id, p.name) or (isinstance(key, str) and key.removeprefix("MIG ") == p.name):
                return p
        return None


@dataclass(frozen=True)
class Board:
    """One MIG-capable board's tables."""

    key: str
    title: str
    device_ids: tuple[int, ...]  # PCI device ids that carry this table
    source: str
    profiles: tuple[GpuProfile, ...]
    gpu_slices: int = 7
    memory_slices: int = 8
    max_devices: int = 7  # nvmlDeviceGetMaxMigDeviceCount

    def profile(self, key: str | int) -> GpuProfile | None:
        """A GI profile by driver ID (19), name (``1g.10gb``, ``MIG 1g.10gb``) or ID string."""
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        for p in self.profiles:
            if key == p.id or (isinstance(key, str) and key.removeprefix("MIG ") == p.name):
                return p
        return None

    def names(self) -> str:
        return ", ".join(f"{p.name} ({p.id})" for p in self.profiles)


# Column order of a table row: MiB, SMs, copy engines, decoders, encoders, JPEG, OFA.
Row = tuple[int, int, int, int, int, int, int]


def _eight_slice(
    key: str, title: str, device_ids: tuple[int, ...], source: str, names: Sequence[str], rows: Sequence[Row]
) -> Board:
    """A board with 8 memory slices and 7 GPU slices (A100, H100, H200, B200, GB200): the same
    profile IDs, instance counts and placements (``-lgipp``), its own memory and engine counts.
    ``names``/``rows`` in the order 1g, 1g+me, 1g (twice the memory), 2g, 3g, 4g, 7g."""
    geometry = [  # (index key, driver ID, GPU slices, memory slices, placements)
        ("1", 19, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1+me", 20, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1x2", 15, 1, 2, (0, 2, 4, 6)),
        ("2", 14, 2, 2, (0, 2, 4)),
        ("3", 9, 3, 4, (0, 4)),
        ("4", 5, 4, 4, (0,)),
        ("7", 0, 7, 8, (0,)),
    ]
    instances = {19: 7, 20: 1, 15: 4, 14: 3, 9: 2, 5: 1, 0: 1}
    profiles = tuple(
        GpuProfile(GI_INDEX[ix], pid, name, g, m, instances[pid], starts, *row)
        for (ix, pid, g, m, starts), name, row in zip(geometry, names, rows, strict=True)
    )
    return Board(key, title, device_ids, source, profiles)


BOARDS: tuple[Board, ...] = (
    _eight_slice(
        "a100-40gb",
        "A100-SXM4-40GB / A100-PCIE-40GB",
        (0x20B0, 0x20F1),
        "nvidia-smi mig -lgip as in NVIDIA's MIG user guide (R515+ table with 1g.10gb), "
        "the same MiB as NVIDIA's go-nvml A100 mock; placements: user guide -lgipp",
        ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        [
            (4864, 14, 1, 0, 0, 0, 0),
            (4864, 14, 1, 1, 0, 1, 1),
            (9856, 14, 1, 1, 0, 0, 0),
            (9856, 28, 2, 1, 0, 0, 0),
            (19968, 42, 3, 2, 0, 0, 0),
            (19968, 56, 4, 2, 0, 0, 0),
            (40192, 98, 7, 5, 0, 1, 1),
        ],
    ),
    _eight_slice(
        "a100-80gb",
        "A100-SXM4-80GB / A100 80GB PCIe",
        (0x20B2, 0x20B5),
        "nvidia-smi mig -lgip of an A100 80GB PCIe, driver 515.86.01, and GFD labels of the same "
        "node; 1g.20gb named by the user guide, its MiB, SMs and engines as four 1g.20gb MIG devices "
        "of an A100-SXM4-80GB on 535.54.03 show them (tests/captures/public/qx-a100-sxm4-80gb-mig.xml)",
        ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        [
            (9728, 14, 1, 0, 0, 0, 0),
            (9728, 14, 1, 1, 0, 1, 1),
            (19968, 14, 1, 1, 0, 0, 0),
            (19968, 28, 2, 1, 0, 0, 0),
            (40192, 42, 3, 2, 0, 0, 0),
            (40192, 56, 4, 2, 0, 0, 0),
            (80896, 98, 7, 5, 0, 1, 1),
        ],
    ),
    _eight_slice(
        "h100-80gb",
        "H100 80GB HBM3 (SXM5)",
        (0x2330,),
        "nvidia-smi mig -lgip/-lgipp of an H100 80GB HBM3; GFD labels in NVIDIA's GPU Operator "
        "MIG page; R575 -q -x and R580 MIG tables (40448 MiB, 60 SMs for 3g.40gb)",
        ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        [
            (9984, 16, 1, 1, 0, 1, 0),
            (9984, 16, 1, 1, 0, 1, 1),
            (20096, 26, 1, 1, 0, 1, 0),
            (20096, 32, 2, 2, 0, 2, 0),
            (40448, 60, 3, 3, 0, 3, 0),
            (40448, 64, 4, 4, 0, 4, 0),
            (81152, 132, 8, 7, 0, 7, 1),
        ],
    ),
    _eight_slice(
        "h200-141gb",
        "H200 141GB (SXM)",
        (0x2335,),
        "nvidia-smi mig -lgip of H200 nodes in github.com/NVIDIA/mig-parted/issues/120 (2024); "
        "user guide table 8 (7g: 8 copy engines); placements as A100/H100 (inferred)",
        ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
        [
            (16384, 16, 1, 1, 0, 1, 0),
            (16384, 16, 1, 1, 0, 1, 1),
            (33024, 26, 1, 1, 0, 1, 0),
            (33024, 32, 2, 2, 0, 2, 0),
            (71168, 60, 3, 3, 0, 3, 0),
            (71168, 64, 4, 4, 0, 4, 0),
            (143104, 132, 8, 7, 0, 7, 1),
        ],
    ),
    _eight_slice(
        "b200",
        "B200 (180GB)",
        (0x2901,),
        "nvidia-smi mig -lgip in github.com/NVIDIA/mig-parted/pull/187 (Mar 2025) and a B200 MIG "
        "table in github.com/NVIDIA/gpu-operator/issues/2155 (1g, 1g.45gb, 2g rows); 3g/4g/7g "
        "inferred: memory doubling as on H100, SMs 68/72/148, copy engines 6/8/16 (user guide)",
        ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
        [
            (20992, 18, 2, 1, 0, 1, 0),
            (20992, 18, 2, 1, 0, 1, 1),
            (45312, 30, 2, 1, 0, 1, 0),
            (45312, 36, 4, 2, 0, 2, 0),
            (90880, 68, 6, 3, 0, 3, 0),
            (90880, 72, 8, 4, 0, 4, 0),
            (182016, 148, 16, 7, 0, 7, 1),
        ],
    ),
    _eight_slice(
        "gb200",
        "GB200 (186GB)",
        (0x2941,),
        "nvidia-smi mig -lgip of a GB200 NVL node in github.com/NVIDIA/mig-parted/issues/227 "
        "(Aug 2025; 1g, 1g.47gb, 2g rows); 3g/4g/7g inferred (names as go-nvlib computes them "
        "from this memory, SMs 72/76/148, engines as B200)",
        ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"],
        [
            (22528, 18, 2, 1, 0, 1, 0),
            (22528, 18, 2, 1, 0, 1, 1),
            (46592, 32, 2, 1, 0, 1, 0),
            (46592, 38, 4, 2, 0, 2, 0),
            (93440, 72, 6, 3, 0, 3, 0),
            (93440, 76, 8, 4, 0, 4, 0),
            (187136, 148, 16, 7, 0, 7, 1),
        ],
    ),
)


def board_by_key(key: str) -> Board | None:
    return next((b for b in BOARDS if b.key == key), None)


def board_for(device_id: int, key: str | None = None) -> Board | None:
    """The table of a board: by explicit key, else by its PCI device id."""
    if key is not None:
        return board_by_key(key)
    return next((b for b in BOARDS if device_id in b.device_ids), None)


# ---- the profile's MIG section ----------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComputeInstanceSpec(_Strict):
    profile: str | int = Field(description="CI profile name (1c.3g.40gb, 3g.40gb) or ID")
    placement: int | None = Field(None, ge=0, description="first compute slice; default: the first free")


class GpuInstanceSpec(_Strict):
    profile: str | int = Field(description="GI profile name (3g.40gb, MIG 3g.40gb) or driver ID (9)")
    placement: int | None = Field(None, ge=0, description="first memory slice; default: chosen as the driver does")
    compute: list[str | int | ComputeInstanceSpec] | None = Field(
        None, description="compute instances; default: one spanning the GPU instance (as `nvidia-smi mig -cgi -C`)"
    )


class MigSpec(_Strict):
    mode: bool | None = Field(None, description="current MIG mode (sets modes.mig); default: modes.mig")
    pending: bool | None = Field(None, description="pending MIG mode; default: the current mode")
    board: str | None = Field(None, description="profile table to use; default: the board's by PCI device id")
    instances: list[GpuInstanceSpec] = Field(default_factory=list)


# ---- layouts ---------------------------------------------------------------------------


@dataclass
class ComputeInstance:
    profile: ComputeProfile
    start: int
    id: int


@dataclass
class GpuInstance:
    profile: GpuProfile
    start: int
    id: int
    compute: list[ComputeInstance] = field(default_factory=list)


class LayoutError(ValueError):
    """A layout that could not exist on the board; the message names the instance."""


def _overlaps(a: int, alen: int, b: int, blen: int) -> bool:
    return a < b + blen and b < a + alen


def gi_fits(board: Board, gis: Sequence[GpuInstance], profile: GpuProfile, start: int) -> bool:
    """Whether a GI of ``profile`` at ``start`` can join ``gis``: a placement of the profile,
    free memory slices, GPU slices left, and the profile's instance limit."""
    if start not in profile.placements:
        return False
    if any(_overlaps(start, profile.memory_slices, g.start, g.profile.memory_slices) for g in gis):
        return False
    if sum(g.profile.slices for g in gis) + profile.slices > board.gpu_slices:
        return False
    return sum(1 for g in gis if g.profile.id == profile.id) < profile.instances


def choose_gi_start(board: Board, gis: Sequence[GpuInstance], profile: GpuProfile) -> int | None:
    """Where the driver puts a GI created without a placement: the possible placement that
    blocks the fewest placements (of any profile) still free, the lowest start on a tie.
    This reproduces the captured orders: 1g.10gb x7 on an H100 fills 6, 4, 5, 0, 1, 2, 3;
    3g first takes 4; 2g first takes 4 and a following 1g takes 6."""
    best: tuple[int, int] | None = None
    for start in profile.placements:
        if not gi_fits(board, gis, profile, start):
            continue
        cost = 0
        for other in board.profiles:
            for s in other.placements:
                free = not any(_overlaps(s, other.memory_slices, g.start, g.profile.memory_slices) for g in gis)
                if free and _overlaps(s, other.memory_slices, start, profile.memory_slices):
                    cost += 1
        if best is None or cost < best[0]:
            best = (cost, start)
    return None if best is None else best[1]


def gi_id(profile: GpuProfile, start: int) -> int:
    """The GI ID the driver gives a GI at ``start``: by placement size, then placement."""
    return profile.first_id + start // profile.memory_slices


def ci_fits(gi: GpuInstance, profile: ComputeProfile, start: int) -> bool:
    if start not in profile.placements:
        return False
    if any(_overlaps(start, profile.slices, c.start, c.profile.slices) for c in gi.compute):
        return False
    return sum(1 for c in gi.compute if c.profile.id == profile.id) < profile.instances


def choose_ci_start(gi: GpuInstance, profile: ComputeProfile) -> int | None:
    """The first free placement (captures: 1c CIs at 0:1, 1:1, ...)."""
    return next((s for s in profile.placements if ci_fits(gi, profile, s)), None)


def next_ci_id(gi: GpuInstance) -> int:
    taken = {c.id for c in gi.compute}
    return next(i for i in range(MAX_CI_ID + 1) if i not in taken)


def plan(board: Board, specs: Sequence[GpuInstanceSpec], where: str = "mig.instances") -> list[GpuInstance]:
    """The layout ``specs`` describe, placed as the driver would; LayoutError names the first
    instance that could not exist (``where``.N[.compute.M])."""
    gis: list[GpuInstance] = []
    for n, spec in enumerate(specs):
        at = f"{where}.{n}"
        profile = board.profile(spec.profile)
        if profile is None:
            raise LayoutError(
                f"{at}.profile: {spec.profile!r} is not a GPU instance profile of {board.title} ({board.names()})"
            )
        if spec.placement is not None:
            start: int | None = spec.placement
            if spec.placement not in profile.placements:
                raise LayoutError(
                    f"{at}.placement: {profile.name} can start only at memory slice "
                    f"{', '.join(map(str, profile.placements))}, not {spec.placement}"
                )
            for k, other in enumerate(gis):
                if _overlaps(spec.placement, profile.memory_slices, other.start, other.profile.memory_slices):
                    raise LayoutError(
                        f"{at}.placement: {profile.name} at {spec.placement}:{profile.memory_slices} overlaps "
                        f"{where}.{k} ({other.profile.name} at {other.start}:{other.profile.memory_slices})"
                    )
            if not gi_fits(board, gis, profile, spec.placement):
                start = None
        else:
            start = choose_gi_start(board, gis, profile)
        if start is None:
            used = ", ".join(f"{g.profile.name} at {g.start}:{g.profile.memory_slices}" for g in gis) or "nothing"
            raise LayoutError(
                f"{at}: no room for {profile.name} (insufficient resources: the board holds {used}; at most "
                f"{profile.instances} {profile.name}, {board.gpu_slices} GPU slices in all)"
            )
        gi = GpuInstance(profile, start, gi_id(profile, start))
        gis.append(gi)
        computes: list[str | int | ComputeInstanceSpec] = [profile.name] if spec.compute is None else list(spec.compute)
        for m, item in enumerate(computes):
            cat = f"{at}.compute.{m}"
            cspec = item if isinstance(item, ComputeInstanceSpec) else ComputeInstanceSpec(profile=item)
            cprof = profile.compute_profile(cspec.profile)
            if cprof is None:
                offered = ", ".join(f"{c.name} ({c.id})" for c in profile.compute_profiles())
                raise LayoutError(
                    f"{cat}: {cspec.profile!r} is not a compute instance profile of {profile.name} ({offered})"
                )
            cstart = cspec.placement if cspec.placement is not None else choose_ci_start(gi, cprof)
            if cstart is None or not ci_fits(gi, cprof, cstart):
                raise LayoutError(f"{cat}: no room for {cprof.name} in {profile.name} (insufficient resources)")
            gi.compute.append(ComputeInstance(cprof, cstart, next_ci_id(gi)))
    gis.sort(key=lambda g: g.id)
    for g in gis:
        g.compute.sort(key=lambda c: c.id)
    return gis


# ---- identities ------------------------------------------------------------------------

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def _fnv1a(data: bytes, seed: int) -> int:
    h = seed
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return h


def mig_uuid(gpu_uuid: str, gi_id: int, gi_profile_id: int, ci_id: int, ci_profile_id: int) -> str:
    """A MIG device's UUID: ``MIG-`` and a name-based (version 5 style) UUID of the parent, the
    GI and the CI — stable while the instance lives, different when it is recreated elsewhere
    (real drivers hand the same UUID to a re-created instance with the same IDs). The same
    hash is computed in C (native/src/mig.c)."""
    key = f"mokka-mig:{gpu_uuid}:{gi_id}:{gi_profile_id}:{ci_id}:{ci_profile_id}".encode()
    hi = _fnv1a(key, FNV_OFFSET)
    lo = _fnv1a(key, hi ^ FNV_PRIME)
    raw = bytearray(hi.to_bytes(8, "big") + lo.to_bytes(8, "big"))
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def instance_ids(board: Board) -> list[tuple[int, int | None]]:
    """Every (GI id, CI id or None for the GI itself) an instance on ``board`` can get: the
    capabilities whose /dev/nvidia-caps nodes a node needs (a GI of g slices holds CIs 0..g-1)."""
    cis: dict[int, int] = {}
    for p in board.profiles:
        for start in p.placements:
            gi = gi_id(p, start)
            cis[gi] = max(cis.get(gi, 0), p.slices)
    return [(gi, ci) for gi in sorted(cis) for ci in (None, *range(cis[gi]))]


def nvlib_profile_name(gi_slices: int, ci_slices: int, memory_mib: int, parent_total_mib: int, suffix: str = "") -> str:
    """The profile name NVIDIA's go-nvlib (GFD, the device plugin) computes for a MIG device from
    its memory and the parent's total: memory rounded up to eighths of the parent, then to GB
    (``nvidia.com/mig-<name>`` resources and labels use it, with ``+`` turned into ``.``)."""
    total_bytes = parent_total_mib * 1024 * 1024
    frac = math.ceil(memory_mib * 1024 * 1024 / total_bytes * 8) / 8
    gb = math.floor(frac * math.ceil(total_bytes / 2**30) + 0.5)
    name = f"{gi_slices}g.{gb}gb{suffix}"
    return name if ci_slices == gi_slices else f"{ci_slices}c.{name}"
