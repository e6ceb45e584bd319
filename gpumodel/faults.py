"""Inject faults into a live mock node, clear them, list them: the Python API behind
``mokka fault``, scenarios and the cluster's fault ConfigMap.

Every change goes through the one writer path (:func:`gpumodel.state.update`: the file's
lock, the latch publish, a futex wake), so each fault is visible to every NVML consumer on
the node, containers included, at its next call, and an event set sleeping in
nvmlEventSetWait wakes at once. Faults live in the state the library carries, so they
survive restarts of the consumers; `mokka host cleanup` removes them with the library.

What each fault does to the record (native/mokka_state.h, ``mokka_faults_t``) is recorded
beside it, so ``clear`` undoes exactly the faults and leaves the profile's own values.
``clear`` undoes what a GPU reset undoes (lost, overrides, link state and error counters,
volatile ECC counts, pending remaps and retirements); ``clear --all`` also the persistent
record a board keeps in its InfoROM (aggregate ECC counts, remapped rows, a remap failure,
retired pages).

One file, though long: every fault kind and its undo are written against the same record
(``mokka_faults_t``); keeping them together keeps ``clear`` exactly the inverse of each fault.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import dynamic, kernel_log, state
from . import faultspec as fs
from .nodelayout import NodeLayout

# nvmlEventType_t bits
EVENT_SBE, EVENT_DBE, EVENT_XID = 0x1, 0x2, 0x8
EVENT_NAMES = {EVENT_SBE: "single-bit ECC", EVENT_DBE: "double-bit ECC", EVENT_XID: "Xid"}
NO_INSTANCE = 0xFFFFFFFF
# nvmlClockType_t, nvmlTemperatureThresholds_t
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM = 0, 1, 2


class FaultError(Exception):
    """A fault cannot be applied; the message says what and where. Nothing was changed."""


@dataclass(frozen=True)
class Target:
    """Where a node's state lives, and its staged kernel log."""

    state: Path
    kernel_log: Path | None
    root: Path | None = None  # the staged node (its InfiniBand ports), when known


def kernel_log_for(library: Path) -> Path:
    """The staged kernel log beside a driver root: ``<driver root>/var/log/kern.log`` when the
    library lies in ``<driver root>/usr/lib*``, else ``kern.log`` next to the file."""
    parent = library.parent
    if parent.parent.name == "usr" and parent.name.startswith("lib"):
        return parent.parent.parent / "var" / "log" / "kern.log"
    return parent / "kern.log"


def for_root(root: Path) -> Target:
    """The node host setup staged under ``root`` (its node.json names the library)."""
    try:
        layout = NodeLayout.load(root)
    except FileNotFoundError:
        raise FaultError(f"{root}: no staged node here (no node.json; run `mokka host setup`), --root") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FaultError(f"{root}/node.json: unreadable ({exc}), --root") from None
    log = Path(layout.kernel_log) if layout.kernel_log else kernel_log_for(Path(layout.state))
    return _checked(Target(Path(layout.state), log, root), "--root")


def for_driver_root(path: Path) -> Target:
    """A driver root (``mokka driver-root --out DIR``): its libnvidia-ml carries the state."""
    libs = sorted(
        p for d in ("usr/lib64", "usr/lib") for p in (path / d).glob("libnvidia-ml.so.*.*") if not p.is_symlink()
    )
    if not libs:
        raise FaultError(f"{path}: no libnvidia-ml.so.<version> under usr/lib64, --driver-root")
    return _checked(Target(libs[0], kernel_log_for(libs[0])), "--driver-root")


def for_state(path: Path) -> Target:
    """A state file, or a library carrying one (what MOKKA_STATE names)."""
    return _checked(Target(path, kernel_log_for(path)), "--state")


def _checked(target: Target, where: str) -> Target:
    try:
        state.read(target.state)
    except FileNotFoundError:
        raise FaultError(f"{target.state}: no such file, {where}") from None
    except (OSError, state.StateError) as exc:
        raise FaultError(f"{exc}, {where}") from None
    return target


# ---- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """A GPU of the node as the state lists it (slot = its record's position)."""

    slot: int
    index: int
    uuid: str
    bus_id: str
    serial: str
    name: str


@contextmanager
def _snapshot(target: Target) -> Iterator[tuple[Any, Any, int]]:
    """(node, gpus, GPU count) of the copy readers use now, copied under the writer lock."""
    f = state.ffi()
    with state.locked(target.state) as mm:
        h = f.cast("mokka_header_t *", f.from_buffer(mm))
        count, seq = int(h.gpu_count), int(h.seq)
        del h
        hsize = f.sizeof("mokka_header_t")
        size = f.sizeof("mokka_node_t") + count * f.sizeof("mokka_gpu_t")
        start = hsize + (seq & 1) * size
        live = bytearray(mm[start : start + size])
    base = f.from_buffer(live)
    yield f.cast("mokka_node_t *", base), f.cast("mokka_gpu_t *", base + f.sizeof("mokka_node_t")), count


def _text(f: Any, field: Any) -> str:
    return str(f.string(field).decode(errors="replace"))


def gpus(target: Target) -> list[Gpu]:
    f = state.ffi()
    with _snapshot(target) as (_node, records, count):
        out = []
        for i in range(count):
            g = records[i]
            out.append(Gpu(i, int(g.index), _text(f, g.uuid), _text(f, g.bus_id), _text(f, g.serial), _text(f, g.name)))
        return out


def select(available: Sequence[Gpu], wanted: str | int | Sequence[str | int] | None, where: str = "--gpu") -> list[Gpu]:
    """GPUs by index or UUID: one, a list (or comma-separated), ``all`` or None for every GPU."""
    if wanted is None or wanted == "all":
        return list(available)
    items = wanted if isinstance(wanted, (list, tuple)) else str(wanted).split(",")
    chosen: list[Gpu] = []
    for item in items:
        key = str(item).strip()
        match = [g for g in available if str(g.index) == key or g.uuid == key]
        if not match:
            span = f"0-{len(available) - 1}" if available else "none"
            raise FaultError(f"no GPU {key!r} on this node (indices {span}, or a GPU UUID), {where}")
        if match[0] not in chosen:
            chosen.append(match[0])
    return sorted(chosen, key=lambda g: g.slot)


# ---- applying ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    gpu: int
    fault: str
    note: str


@dataclass
class _Context:
    """One GPU record being changed, and what the change adds to the kernel log."""

    node: Any
    g: Any
    gpu: Gpu
    now_ms: int
    log: list[str]
    notes: list[str] = field(default_factory=list)

    def flag(self, name: str) -> int:
        return state.const(name)

    def has(self, name: str) -> bool:
        return bool(self.g.flags & self.flag(name))


def raise_event(node: Any, g: Any, event_type: int, data: int = 0, now_ms: int | None = None) -> None:
    """Append an NVML event to a GPU record's ring (mokka_events_t), inside a state.update change."""
    node.events += 1
    ring = state.const("MOKKA_EVENT_RING")
    n = int(g.events.count)
    e = g.events.ring[n % ring]
    e.seq, e.type, e.data = node.events, event_type, data
    e.time_us = (int(time.time() * 1000) if now_ms is None else now_ms) * 1000
    e.gpu_instance = e.compute_instance = NO_INSTANCE
    g.events.count = n + 1


def _raise_event(c: _Context, event_type: int, data: int = 0) -> None:
    raise_event(c.node, c.g, event_type, data, c.now_ms)


def _xid(c: _Context, code: int, message: str | None = None, pid: int | None = None, process: str | None = None,
         **values: int) -> None:  # fmt: skip
    _raise_event(c, EVENT_XID, code)
    if not c.g.faults.misc & state.const("MOKKA_FAULT_LOGGED"):
        c.log += kernel_log.first_xid_preamble(c.gpu.bus_id, c.gpu.uuid, c.gpu.serial)
        c.g.faults.misc |= state.const("MOKKA_FAULT_LOGGED")
    if message is None:
        message = kernel_log.default_message(code, c.has("MOKKA_GPU_REMAP_SUPPORTED"), index=c.gpu.index, **values)
    c.log.append(kernel_log.xid(c.gpu.bus_id, code, message, pid, process))
    c.notes.append(f"Xid {code}")
    if code == 79:
        _lose(c)


def _lose(c: _Context) -> None:
    lost = c.flag("MOKKA_GPU_LOST")
    if c.g.flags & lost:
        return
    c.g.flags |= lost
    c.g.faults.flags_set |= lost
    c.log += kernel_log.fell_off_the_bus(c.gpu.bus_id, c.gpu.serial)
    c.notes.append("lost: NVML answers GPU_IS_LOST")


def _set_flag(c: _Context, name: str) -> bool:
    """Turn a record flag on (remembering that a fault did); whether it was off."""
    bit = c.flag(name)
    if c.g.flags & bit:
        return False
    c.g.flags |= bit
    c.g.faults.flags_set |= bit
    return True


def _override(c: _Context, metric: str, value: float, start: float | None = None, over_s: float | None = None) -> None:
    m = dynamic.METRICS[metric]
    if over_s is None:
        fields = {"kind": dynamic.KIND["constant"], "a": round(value * m.scale)}
    else:
        begin = round(start * m.scale) if start is not None else _static(c.g, m.index)
        fields = {
            "kind": dynamic.KIND["ramp"],
            "a": begin,
            "b": round(value * m.scale),
            "period_ms": round(over_s * 1000),
        }
    dynamic.write_pattern(c.g.faults.override[m.index], {**fields, "start_ms": c.now_ms})


def _static(g: Any, index: int) -> int:
    """A metric's value in the record itself (the profile's, without pattern or override)."""
    return int(
        [g.power_usage, g.temp_gpu, g.temp_memory, g.util_gpu, g.util_memory, g.mem_used,
         g.clock_current[CLOCK_SM], g.clock_current[CLOCK_MEM]][index]
    )  # fmt: skip


def _bump_histogram(c: _Context, rows: int) -> None:
    """Rows remapped use up spare rows: as many banks move from `max` to `high`."""
    moved = min(rows, int(c.g.remap_histogram[0]))
    c.g.remap_histogram[0] -= moved
    c.g.remap_histogram[1] += moved
    c.g.faults.histogram_moved[1] += moved


def _apply_one(c: _Context, fault: Any) -> None:
    g, gpu = c.g, c.gpu
    where = fault.kind
    na = state.na()
    if isinstance(fault, fs.Xid):
        _xid(c, fault.code, fault.message, fault.pid, fault.process)
    elif isinstance(fault, fs.Lost):
        if g.flags & c.flag("MOKKA_GPU_LOST"):
            c.notes.append("already lost")
        else:
            _xid(c, 79)
    elif isinstance(fault, fs.Ecc):
        if g.ecc_current == na or g.ecc_current == 0:
            state_ = "not supported" if g.ecc_current == na else "disabled"
            raise FaultError(f"GPU {gpu.index}: ECC is {state_} on this board, {where}")
        loc = fs.LOCATIONS[fault.location]
        counters = {"both": (0, 1), "volatile": (0,), "aggregate": (1,)}[fault.counter]
        for kind, n in ((0, fault.corrected), (1, fault.uncorrected)):
            for counter in counters:
                g.ecc_counts[kind][counter][loc] += n
                g.faults.ecc_added[kind][counter][loc] += n
        c.notes.append(f"ECC +{fault.corrected} corrected +{fault.uncorrected} uncorrected at {fault.location}")
        if fault.counter == "aggregate":
            return  # errors from before this driver load: no events
        if fault.corrected:
            _raise_event(c, EVENT_SBE)
        if fault.uncorrected:
            _raise_event(c, EVENT_DBE)
            address = 0x1000 * (int(g.ecc_counts[1][1][loc]) + 1)
            _xid(c, 48, address=address)
            if loc == fs.LOCATIONS["dram"]:
                _bad_dram_rows(c, fault.uncorrected, address)
    elif isinstance(fault, fs.Remap):
        if not c.has("MOKKA_GPU_REMAP_SUPPORTED"):
            raise FaultError(f"GPU {gpu.index}: this board does not remap rows (retire pages instead), {where}")
        g.remap_correctable += fault.correctable
        g.remap_uncorrectable += fault.uncorrectable
        g.faults.remap_added[0] += fault.correctable
        g.faults.remap_added[1] += fault.uncorrectable
        _bump_histogram(c, fault.correctable + fault.uncorrectable)
        address = 0x1000 * (int(g.remap_correctable) + int(g.remap_uncorrectable))
        pending = fault.pending if fault.pending is not None else bool(fault.correctable or fault.uncorrectable)
        c.notes.append(f"rows +{fault.correctable} correctable +{fault.uncorrectable} uncorrectable")
        if pending and _set_flag(c, "MOKKA_GPU_REMAP_PENDING"):
            _xid(c, 63, address=address)
        if fault.failure and _set_flag(c, "MOKKA_GPU_REMAP_FAILURE"):
            moved = min(1, int(g.remap_histogram[0]))
            g.remap_histogram[0] -= moved
            g.remap_histogram[4] += moved
            g.faults.histogram_moved[4] += moved
            _xid(c, 64, address=address)
    elif isinstance(fault, fs.Retire):
        if not c.has("MOKKA_GPU_RETIRE_SUPPORTED"):
            raise FaultError(f"GPU {gpu.index}: this board does not retire pages (it remaps rows), {where}")
        g.retired_sbe += fault.sbe
        g.retired_dbe += fault.dbe
        g.faults.retired_added[0] += fault.sbe
        g.faults.retired_added[1] += fault.dbe
        c.notes.append(f"pages +{fault.sbe} single-bit +{fault.dbe} double-bit")
        pending = fault.pending if fault.pending is not None else bool(fault.sbe or fault.dbe)
        if pending and not g.faults.retired_pending:
            g.faults.retired_pending = 1
            _xid(c, 63, address=0x1000 * (int(g.retired_sbe) + int(g.retired_dbe)))
    elif isinstance(fault, fs.Temperature):
        if fault.memory is not None and g.temp_memory == na:
            raise FaultError(f"GPU {gpu.index}: the board reports no memory temperature, {where} --memory")
        _override(c, "temperature_c", fault.celsius, fault.start, fault.over_s)
        if fault.memory is not None:
            _override(c, "memory_temperature_c", fault.memory)
        c.notes.append(f"temperature {fault.celsius} C")
    elif isinstance(fault, fs.Power):
        _override(c, "power_w", fault.watts, fault.start, fault.over_s)
        c.notes.append(f"power {fault.watts:g} W")
    elif isinstance(fault, fs.PowerLimit):
        if not c.has("MOKKA_GPU_POWER_MANAGEMENT"):
            raise FaultError(f"GPU {gpu.index}: the board has no power management, {where}")
        mw = round(fault.watts * 1000)
        lo, hi = int(g.power_min_limit), int(g.power_max_limit)
        if not lo <= mw <= hi:
            raise FaultError(
                f"{fault.watts:g} W is outside GPU {gpu.index}'s limits {lo / 1000:g}-{hi / 1000:g} W, {where}"
            )
        if not g.faults.misc & state.const("MOKKA_FAULT_POWER_LIMIT"):
            g.faults.saved_power_limit, g.faults.saved_enforced_limit = g.power_limit, g.power_enforced_limit
            g.faults.misc |= state.const("MOKKA_FAULT_POWER_LIMIT")
        g.power_limit = g.power_enforced_limit = mw
        c.notes.append(f"power limit {fault.watts:g} W")
    elif isinstance(fault, fs.Utilization):
        _override(c, "utilization_gpu", fault.gpu, fault.start, fault.over_s)
        if fault.memory is not None:
            _override(c, "utilization_memory", fault.memory)
        c.notes.append(f"utilization {fault.gpu}%" + (f" memory {fault.memory}%" if fault.memory is not None else ""))
    elif isinstance(fault, fs.Clocks):
        for name, value, domain in (("SM", fault.sm, CLOCK_SM), ("memory", fault.memory, CLOCK_MEM)):
            if value is None:
                continue
            if g.clock_current[domain] == na:
                raise FaultError(f"GPU {gpu.index}: the board reports no {name} clock, {where}")
            top = int(g.clock_max[domain])
            if top != na and value > top:
                raise FaultError(f"{name} clock {value} MHz is above GPU {gpu.index}'s maximum {top} MHz, {where}")
        _override(c, "clock_sm_mhz", fault.sm)
        if fault.memory is not None:
            _override(c, "clock_memory_mhz", fault.memory)
        c.notes.append(
            f"clocks SM {fault.sm} MHz" + (f" memory {fault.memory} MHz" if fault.memory is not None else "")
        )
    elif isinstance(fault, (fs.NvLink, fs.NvLinkErrors)):
        links = int(g.nvlink_count)
        if fault.link >= links:
            have = f"links 0-{links - 1}" if links else "no NVLink"
            raise FaultError(f"GPU {gpu.index} has {have}: no link {fault.link}, {where}")
        bit = 1 << fault.link
        if isinstance(fault, fs.NvLinkErrors):
            errors = g.faults.nvlink_errors[fault.link]
            errors[0] += fault.replay
            errors[1] += fault.recovery
            errors[2] += fault.crc
            c.notes.append(f"link {fault.link}: +{fault.crc} CRC +{fault.replay} replay +{fault.recovery} recovery")
        elif fault.state == "down":
            if not g.nvlink_active_mask & bit:
                c.notes.append(f"link {fault.link} already down")
                return
            g.nvlink_active_mask &= ~bit
            g.faults.nvlink_down |= bit
            c.notes.append(f"link {fault.link} down")
            _xid(c, 74, link=fault.link)
        else:
            if not g.faults.nvlink_down & bit:
                up = "up" if g.nvlink_active_mask & bit else "down in the profile itself"
                c.notes.append(f"link {fault.link} is {up}: nothing to bring up")
                return
            g.nvlink_active_mask |= bit
            g.faults.nvlink_down &= ~bit
            c.notes.append(f"link {fault.link} up")
    elif isinstance(fault, fs.Fabric):
        _fabric(c, fault.state)
    elif isinstance(fault, fs.Clear):
        _clear(c, fault.all)
    else:  # pragma: no cover - the model admits no other kind
        raise FaultError(f"unknown fault {fault!r}")


# nvmlReturn_t NVML_ERROR_NOT_READY: a probe still In Progress has no result (as while the fabric
# manager is not ready, native/src/device.c).
NVML_ERROR_NOT_READY = 27


def _fabric(c: _Context, wanted: str) -> None:
    """The fabric probe and health mask as fault ``wanted`` says, the profile's kept to restore
    (:func:`_saved_fabric`). A FaultError leaves the state as it was (the change is discarded)."""
    g, f = c.g, c.g.faults
    held = bool(f.misc & state.const("MOKKA_FAULT_FABRIC"))
    if wanted == "healthy":
        if not held:
            c.notes.append("fabric is the profile's: nothing to restore")
            return
        _restore_fabric(c)
        c.notes.append("fabric healthy")
        return
    if not held:
        if int(g.fabric_state) == state.FABRIC_STATES["Not Supported"]:
            raise FaultError(f"GPU {c.gpu.index} has no NVLink fabric (fabric state Not Supported), fabric")
        f.saved_fabric = int(g.fabric_state) | int(g.fabric_health) << 8 | int(g.fabric_status) << 16
        f.misc |= state.const("MOKKA_FAULT_FABRIC")
    saved_state, saved_health, saved_status = _saved_fabric(f)
    if wanted == "degraded":
        if saved_health == 0:
            raise FaultError(
                f"GPU {c.gpu.index} reports no fabric health (the profile's fabric has no degraded_bandwidth), fabric"
            )
        g.fabric_state, g.fabric_health, g.fabric_status = saved_state, state.FABRIC_BW_DEGRADED, saved_status
        c.notes.append("fabric bandwidth degraded")
    else:
        g.fabric_state, g.fabric_health = state.FABRIC_STATES["In Progress"], saved_health
        g.fabric_status = NVML_ERROR_NOT_READY
        c.notes.append("fabric probe In Progress")


def _saved_fabric(f: Any) -> tuple[int, int, int]:
    """The profile's fabric state, health mask and status, as a fabric fault keeps them in
    ``saved_fabric`` (state | health << 8 | status << 16)."""
    saved = int(f.saved_fabric)
    return saved & 0xFF, saved >> 8 & 0xFF, saved >> 16


def _restore_fabric(c: _Context) -> None:
    g, f = c.g, c.g.faults
    if f.misc & state.const("MOKKA_FAULT_FABRIC"):
        g.fabric_state, g.fabric_health, g.fabric_status = _saved_fabric(f)
        f.misc &= ~state.const("MOKKA_FAULT_FABRIC")
        f.saved_fabric = 0


def _clear(c: _Context, everything: bool) -> None:
    g, f = c.g, c.g.faults
    for i in range(state.const("MOKKA_METRICS")):
        dynamic.write_pattern(f.override[i], {"kind": 0})
    if f.misc & state.const("MOKKA_FAULT_POWER_LIMIT"):
        g.power_limit, g.power_enforced_limit = f.saved_power_limit, f.saved_enforced_limit
        f.misc &= ~state.const("MOKKA_FAULT_POWER_LIMIT")
    g.nvlink_active_mask |= f.nvlink_down
    f.nvlink_down = 0
    _restore_fabric(c)
    for link in range(state.const("MOKKA_MAX_NVLINKS")):
        for k in range(state.const("MOKKA_NVLINK_COUNTERS")):
            f.nvlink_errors[link][k] = 0
    transient = c.flag("MOKKA_GPU_LOST") | c.flag("MOKKA_GPU_REMAP_PENDING")
    undo = f.flags_set & (transient | (c.flag("MOKKA_GPU_REMAP_FAILURE") if everything else 0))
    g.flags &= ~undo
    f.flags_set &= ~undo
    f.retired_pending = 0
    for kind in (0, 1):
        for counter in (0, 1) if everything else (0,):
            for loc in range(state.const("MOKKA_ECC_LOCATIONS")):
                g.ecc_counts[kind][counter][loc] -= min(
                    int(f.ecc_added[kind][counter][loc]), int(g.ecc_counts[kind][counter][loc])
                )
                f.ecc_added[kind][counter][loc] = 0
    if everything:
        g.remap_correctable -= min(int(f.remap_added[0]), int(g.remap_correctable))
        g.remap_uncorrectable -= min(int(f.remap_added[1]), int(g.remap_uncorrectable))
        f.remap_added[0] = f.remap_added[1] = 0
        for bucket in range(1, 5):
            moved = min(int(f.histogram_moved[bucket]), int(g.remap_histogram[bucket]))
            g.remap_histogram[bucket] -= moved
            g.remap_histogram[0] += moved
            f.histogram_moved[bucket] = 0
        g.retired_sbe -= min(int(f.retired_added[0]), int(g.retired_sbe))
        g.retired_dbe -= min(int(f.retired_added[1]), int(g.retired_dbe))
        f.retired_added[0] = f.retired_added[1] = 0
    c.notes.append("cleared" + (" (all)" if everything else " (what a GPU reset undoes)"))


def _bad_dram_rows(c: _Context, count: int, address: int) -> None:
    """An uncorrectable DRAM error: the board remaps the row (pending a reset) or retires the
    page (pending a driver reload), and the driver logs Xid 63."""
    g = c.g
    if c.has("MOKKA_GPU_REMAP_SUPPORTED"):
        g.remap_uncorrectable += count
        g.faults.remap_added[1] += count
        _bump_histogram(c, count)
        _set_flag(c, "MOKKA_GPU_REMAP_PENDING")
        _xid(c, 63, address=address)
    elif c.has("MOKKA_GPU_RETIRE_SUPPORTED"):
        g.retired_dbe += count
        g.faults.retired_added[1] += count
        g.faults.retired_pending = 1
        _xid(c, 63, address=address)


Order = tuple[Sequence[Gpu], Any]  # (the GPUs, a faultspec model)


@contextmanager
def _log_lock(target: Target) -> Iterator[None]:
    """Serialise kernel log appends with the state updates they follow (log order = state order)."""
    if target.kernel_log is None:
        yield
        return
    target.kernel_log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.kernel_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def apply(target: Target, orders: Sequence[Order], now_ms: int | None = None, tag: int | None = None) -> list[Result]:
    """Apply faults in one update (every reader sees all of them or none); return what each did.

    ``tag`` (when given) is recorded with them in the state (:func:`applied_tag`): what the
    cluster's fault watcher applied. Raises FaultError (nothing changed) when a fault does
    not fit a GPU."""
    results: list[Result] = []
    log: list[str] = []

    def change(node: Any, records: Any) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if tag is not None:
            node.fault_tag = tag
        for gpus_, fault in orders:
            for gpu in gpus_:
                c = _Context(node, records[gpu.slot], gpu, now, log)
                _apply_one(c, fault)
                results.append(Result(gpu.index, fault.describe(), "; ".join(c.notes)))

    with _log_lock(target):
        try:
            state.update(target.state, change)
        except state.StateError as exc:
            raise FaultError(str(exc)) from None
        if target.kernel_log is not None and log:
            kernel_log.append(target.kernel_log, kernel_log.syslog_lines(log))
    return results


# ---- listing -----------------------------------------------------------------------------


METRIC_LABEL = {
    "power_w": "power",
    "temperature_c": "temperature",
    "memory_temperature_c": "memory temperature",
    "utilization_gpu": "utilization",
    "utilization_memory": "memory utilization",
    "memory_used_mib": "memory used",
    "clock_sm_mhz": "SM clock",
    "clock_memory_mhz": "memory clock",
}


def _describe_override(name: str, p: Any) -> str:
    m = dynamic.METRICS[name]
    a, b = int(p.a) / m.scale, int(p.b) / m.scale
    if p.kind == dynamic.KIND["ramp"]:
        return f"{METRIC_LABEL[name]} {a:g} -> {b:g} {m.unit} over {int(p.period_ms) / 1000:g} s"
    return f"{METRIC_LABEL[name]} {a:g} {m.unit}"


def applied_tag(target: Target) -> int:
    """The tag the last :func:`apply` given one recorded (0: none since the state was compiled)."""
    with _snapshot(target) as (node, _records, _count):
        return int(node.fault_tag)


def active(target: Target) -> dict[int, list[str]]:
    """What is in effect on each GPU (by index): faults and the recent events."""
    out: dict[int, list[str]] = {}
    available = gpus(target)
    with _snapshot(target) as (_node, records, _count):
        for gpu in available:
            g, ft = records[gpu.slot], records[gpu.slot].faults
            lines: list[str] = []
            if ft.flags_set & state.const("MOKKA_GPU_LOST"):
                lines.append("lost (fell off the bus)")
            for name, m in dynamic.METRICS.items():
                if ft.override[m.index].kind:
                    lines.append(_describe_override(name, ft.override[m.index]))
            if ft.misc & state.const("MOKKA_FAULT_POWER_LIMIT"):
                lines.append(f"power limit {int(g.power_limit) / 1000:g} W")
            if ft.misc & state.const("MOKKA_FAULT_FABRIC"):
                probe = int(g.fabric_state) == state.FABRIC_STATES["In Progress"]
                lines.append("fabric probe In Progress" if probe else "fabric bandwidth degraded")
            for link in range(int(g.nvlink_count)):
                if ft.nvlink_down >> link & 1:
                    lines.append(f"NVLink {link} down")
                e = ft.nvlink_errors[link]
                if e[0] or e[1] or e[2]:
                    lines.append(f"NVLink {link} errors: CRC {e[2]}, replay {e[0]}, recovery {e[1]}")
            for kind, label in ((0, "corrected"), (1, "uncorrected")):
                for counter, cname in ((0, "volatile"), (1, "aggregate")):
                    for loc_name, loc in fs.LOCATIONS.items():
                        if loc_name == "device_memory":
                            continue
                        if ft.ecc_added[kind][counter][loc]:
                            lines.append(f"ECC {label} {cname} {loc_name} +{ft.ecc_added[kind][counter][loc]}")
            if ft.remap_added[0] or ft.remap_added[1]:
                lines.append(f"remapped rows +{ft.remap_added[0]} correctable +{ft.remap_added[1]} uncorrectable")
            if ft.flags_set & state.const("MOKKA_GPU_REMAP_PENDING"):
                lines.append("row remap pending")
            if ft.flags_set & state.const("MOKKA_GPU_REMAP_FAILURE"):
                lines.append("row remap failure")
            if ft.retired_added[0] or ft.retired_added[1]:
                lines.append(f"retired pages +{ft.retired_added[0]} single-bit +{ft.retired_added[1]} double-bit")
            if ft.retired_pending:
                lines.append("page retirement pending")
            count, ring = int(g.events.count), state.const("MOKKA_EVENT_RING")
            recent = [g.events.ring[n % ring] for n in range(max(0, count - 5), count)]
            if recent:
                shown = ", ".join(
                    f"Xid {e.data}" if e.type == EVENT_XID else EVENT_NAMES.get(int(e.type), hex(e.type))
                    for e in recent
                )
                lines.append(f"events raised: {count} (latest: {shown})")
            if lines:
                out[gpu.index] = lines
    return out
