"""MIG in the compiled state: the board's tables and the initial layout written into a GPU
record (``mokka_mig_t``, native/mokka_state.h), and the live layout read back from a state —
the layout every NVML consumer sees now, after any change made through NVML or nvidia-smi."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import mig
from .mig_devices import GpuMig as GpuMig
from .mig_devices import MigDevice as MigDevice

if TYPE_CHECKING:
    from .profile import GpuSpec


def board_of(spec: GpuSpec) -> mig.Board | None:
    """The MIG table of a GPU: None on a board without MIG or without a known table."""
    if spec.modes.mig is None:
        return None
    return mig.board_for(spec.pci.device_id, spec.mig.board if spec.mig else None)


def pending_mode(spec: GpuSpec) -> bool | None:
    if spec.modes.mig is None:
        return None
    if spec.mig is not None and spec.mig.pending is not None:
        return spec.mig.pending
    return spec.modes.mig


def initial_layout(spec: GpuSpec) -> list[mig.GpuInstance]:
    board = board_of(spec)
    if board is None or not spec.modes.mig or spec.mig is None:
        return []
    return mig.plan(board, spec.mig.instances)


def fill(g: Any, spec: GpuSpec, gpu_uuid: str, put_str: Callable[[Any, str], None]) -> None:
    """Write the MIG part of GPU record ``g``: pending mode, tables, initial layout."""
    pending = pending_mode(spec)
    if pending is not None:
        g.mig_pending = int(pending)
    board = board_of(spec)
    m = g.mig
    if board is None:
        m.n_profiles = 0
        return
    m.n_profiles = len(board.profiles)
    m.gpu_slices, m.memory_slices, m.max_devices = board.gpu_slices, board.memory_slices, board.max_devices
    for i, p in enumerate(board.profiles):
        t = m.profiles[i]
        t.index, t.id, t.slice_count, t.memory_slices = p.index, p.id, p.slices, p.memory_slices
        t.instance_count, t.multiprocessor_count = p.instances, p.multiprocessors
        t.copy_engine_count, t.decoder_count, t.encoder_count = p.copy_engines, p.decoders, p.encoders
        t.jpeg_count, t.ofa_count, t.first_id = p.jpeg, p.ofa, p.first_id
        t.n_placements = len(p.placements)
        for k, start in enumerate(p.placements):
            t.placements[k] = start
        t.memory_mib = p.memory_mib
        put_str(t.name, p.name)
        cis = p.compute_profiles()
        t.n_ci_profiles = len(cis)
        for j, c in enumerate(cis):
            ct = t.ci[j]
            ct.index, ct.id, ct.slice_count, ct.instance_count = c.index, c.id, c.slices, c.instances
            ct.multiprocessor_count = c.multiprocessors
            ct.n_placements = len(c.placements)
            for k, start in enumerate(c.placements):
                ct.placements[k] = start
            put_str(ct.name, c.name)
    gis = initial_layout(spec)
    m.n_gis = len(gis)
    for i, gi in enumerate(gis):
        rec = m.gis[i]
        rec.id, rec.profile, rec.start = gi.id, board.profiles.index(gi.profile), gi.start
        rec.n_cis = len(gi.compute)
        cis = gi.profile.compute_profiles()
        for j, ci in enumerate(gi.compute):
            crec = rec.ci[j]
            crec.id, crec.profile, crec.start = ci.id, cis.index(ci.profile), ci.start
            put_str(crec.uuid, mig.mig_uuid(gpu_uuid, gi.id, gi.profile.id, ci.id, ci.profile.id))


# ---- the live layout --------------------------------------------------------------------


def read(path: Path) -> list[GpuMig]:
    """The MIG state of every GPU in the state at ``path`` (a state file or a library carrying
    one), from the copy readers use now."""
    from . import state

    return read_region(state.read(path), str(path))


def read_region(region: bytes, source: str = "state") -> list[GpuMig]:
    """:func:`read` for a state region in memory."""
    from . import state

    state.check(region, source)
    f = state.ffi()
    raw = f.from_buffer(region)
    h = f.cast("mokka_header_t *", raw)
    copy = f.sizeof("mokka_node_t") + h.gpu_count * f.sizeof("mokka_gpu_t")
    start = f.sizeof("mokka_header_t") + (h.seq & 1) * copy + f.sizeof("mokka_node_t")
    gpus = f.cast("mokka_gpu_t *", raw + start)
    out = []
    capable_flag = state.const("MOKKA_GPU_MIG_CAPABLE")
    for i in range(h.gpu_count):
        g = gpus[i]
        capable = bool(g.flags & capable_flag)
        m = g.mig
        devices: list[MigDevice] = []
        gis: list[tuple[int, int]] = []
        uuid = f.string(g.uuid).decode()
        if capable and g.mig_current == 1:
            for k in range(m.n_gis):
                gi = m.gis[k]
                prof = m.profiles[gi.profile]
                gis.append((int(gi.id), int(prof.id)))
                for j in range(gi.n_cis):
                    ci = gi.ci[j]
                    cprof = prof.ci[ci.profile]
                    devices.append(
                        MigDevice(
                            gpu=int(g.index),
                            gpu_minor=int(g.minor_number),
                            index=len(devices),
                            gi=int(gi.id),
                            ci=int(ci.id),
                            uuid=f.string(ci.uuid).decode(),
                            profile=f.string(cprof.name).decode(),
                            gi_profile_id=int(prof.id),
                            ci_profile_id=int(cprof.id),
                            placement=(int(gi.start), int(prof.memory_slices)),
                        )
                    )
        out.append(
            GpuMig(
                gpu=int(g.index),
                uuid=uuid,
                minor=int(g.minor_number),
                capable=capable,
                current=capable and g.mig_current == 1,
                pending=capable and g.mig_pending == 1,
                devices=tuple(devices),
                gpu_instances=tuple(gis),
            )
        )
    del gpus, h, raw
    return out
