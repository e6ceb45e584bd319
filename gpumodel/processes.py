"""Workloads as GPU processes: entries in the running-process lists of a live state.

A container that was given GPUs shows in NVML's ``nvmlDeviceGetComputeRunningProcesses`` of
each of them, as a real workload would: its host PIDs, its process name and the GPU memory it
uses (``memory_mib`` per process and GPU). ``add`` lists them, ``remove`` takes them off by PID;
each GPU's memory used rises and falls with them. Both are one :func:`gpumodel.state.update`
(readers see all of a change or none of it).

A GPU lists at most ``MOKKA_MAX_PROCS`` processes (native/mokka_state.h): entries past that
are dropped with a warning, never an error. Removing subtracts exactly what adding added, so
the profile's own memory used (its baseline) comes back; it never goes below zero.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from . import state
from .profile import MIB

__all__ = ["COMPUTE", "DEFAULT_MEMORY_MIB", "add", "remove"]

DEFAULT_MEMORY_MIB = 1024  # a workload's memory per GPU when it does not say
COMPUTE = 0  # mokka_process_t.type: a compute process (nvmlDeviceGetComputeRunningProcesses)


def _warn(message: str) -> None:
    sys.stderr.write(f"mokka: warning: {message}\n")


def _slots(gpus: Any, count: int, indices: Sequence[int]) -> list[int]:
    """The records of GPUs ``indices`` (NVML indices); ValueError names one the state lacks."""
    by_index = {int(gpus[i].index): i for i in range(count)}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise ValueError(f"no GPU {missing[0]} in the state ({count} GPUs)")
    return [by_index[i] for i in dict.fromkeys(indices)]


def _gpu_count(path: Path) -> int:
    f = state.ffi()
    with state.locked(path) as mm:
        h = f.cast("mokka_header_t *", f.from_buffer(mm))
        count = int(h.gpu_count)
        del h
        return count


def add(path: Path, gpus: Sequence[int], pids: Sequence[int], name: str, memory_mib: int = DEFAULT_MEMORY_MIB) -> int:
    """List ``pids`` (named ``name``, using ``memory_mib`` each) on GPUs ``gpus``; return how many
    entries were added. A PID a GPU lists already is listed once (its entry is replaced).
    ValueError (nothing changed) for a GPU the state lacks or a negative memory size."""
    if memory_mib < 0:
        raise ValueError(f"memory must not be negative, not {memory_mib} MiB")
    limit = state.const("MOKKA_MAX_PROCS")
    count = _gpu_count(path)
    added = 0
    dropped: list[str] = []
    raw_name = name.encode(errors="replace")[:63]

    def change(_node: Any, records: Any) -> None:
        nonlocal added
        for slot in _slots(records, count, gpus):
            g = records[slot]
            _take_off(g, set(pids))
            for pid in pids:
                n = int(g.n_procs)
                if n >= limit:
                    dropped.append(f"pid {pid} on GPU {int(g.index)}")
                    continue
                p = g.procs[n]
                p.pid = pid
                p.type = COMPUTE
                p.used_memory = memory_mib * MIB
                state.ffi().memmove(p.name, raw_name + b"\0", len(raw_name) + 1)
                g.n_procs = n + 1
                g.mem_used += memory_mib * MIB
                added += 1

    state.update(path, change)
    if dropped:
        _warn(f"{path}: a GPU lists at most {limit} processes; not listed: {', '.join(dropped)}")
    return added


def remove(path: Path, pids: Collection[int]) -> int:
    """Take every entry of ``pids`` off every GPU, with the memory it used; return how many."""
    wanted = set(pids)
    if not wanted:
        return 0
    count = _gpu_count(path)
    removed = 0

    def change(_node: Any, records: Any) -> None:
        nonlocal removed
        for slot in range(count):
            removed += _take_off(records[slot], wanted)

    state.update(path, change)
    return removed


def _take_off(g: Any, pids: Collection[int]) -> int:
    """Drop ``pids``' entries from GPU record ``g`` (keeping the others in order) and their memory."""
    n = min(int(g.n_procs), state.const("MOKKA_MAX_PROCS"))
    keep = [i for i in range(n) if int(g.procs[i].pid) not in pids]
    if len(keep) == n:
        return 0
    freed = sum(int(g.procs[i].used_memory) for i in range(n) if i not in keep)
    f = state.ffi()
    size = f.sizeof("mokka_process_t")
    for to, i in enumerate(keep):
        if to != i:
            f.memmove(f.addressof(g.procs, to), f.addressof(g.procs, i), size)
    for i in range(len(keep), n):
        f.memmove(f.addressof(g.procs, i), bytes(size), size)
    g.n_procs = len(keep)
    g.mem_used = max(0, int(g.mem_used) - freed)
    return n - len(keep)
