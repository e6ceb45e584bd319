"""Device numbers for the staged ``/dev/nvidia*`` nodes.

The real driver registers major 195 for the GPUs (minors 0..n, nvidia-modeset 254,
nvidiactl 255) and asks the kernel for a *dynamic* major for nvidia-uvm. The kernel hands
those out from 254 down to 234, then from 511 down to 384 (``find_dynamic_major`` in
fs/char_dev.c; a slot in the first range counts as taken when any registered major lands
on it modulo 255), so "real" numbers take the uvm major the host would give a new driver
now, read from ``/proc/devices``. The MIG capability nodes (``/dev/nvidia-caps``) have a
dynamic major of their own (nvidia-caps; the next one after nvidia-uvm's), and so do the IMEX
channels (``/dev/nvidia-caps-imex-channels``; the next one after that). On a node where a
real NVIDIA driver is loaded Mokka must not hand out its numbers: "safe" uses majors of Linux's
local/experimental range (devices.txt: 120-127), which no driver allocates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GPU_MAJOR = 195
SAFE_GPU_MAJOR = 120
SAFE_UVM_MAJOR = 121
SAFE_CAPS_MAJOR = 122
SAFE_IMEX_MAJOR = 123
DYNAMIC_RANGES = (range(254, 233, -1), range(511, 383, -1))
HASH_SLOTS = 255  # CHRDEV_MAJOR_HASH_SIZE


class MajorError(Exception):
    """No device number can be chosen; the message says why."""


@dataclass(frozen=True)
class Majors:
    gpu: int
    uvm: int
    mode: str  # "real" | "safe"
    caps: int = SAFE_CAPS_MAJOR  # nvidia-caps: MIG capability nodes, fabric-imex-mgmt
    imex: int = SAFE_IMEX_MAJOR  # nvidia-caps-imex-channels: IMEX channel nodes


def char_majors(proc_devices: Path) -> dict[int, str]:
    """The character device majors the kernel has registered, from ``/proc/devices``."""
    try:
        text = proc_devices.read_text()
    except OSError as exc:
        raise MajorError(f"{proc_devices}: cannot read: {exc.strerror or exc}") from None
    out: dict[int, str] = {}
    section = None
    for line in text.splitlines():
        if line.endswith(":"):
            section = line
            continue
        words = line.split()
        if section == "Character devices:" and len(words) == 2 and words[0].isdigit():
            out[int(words[0])] = words[1]
    return out


def real_driver_loaded(majors: dict[int, str]) -> bool:
    return any(name in ("nvidia", "nvidia-frontend", "nvidia-uvm", "nvidia-caps") for name in majors.values())


def next_dynamic_major(taken: set[int]) -> int:
    """The major the kernel would give the next driver that asks for a dynamic one."""
    first, extended = DYNAMIC_RANGES
    for slot in first:
        if not any(m % HASH_SLOTS == slot for m in taken):
            return slot
    for major in extended:
        if major not in taken:
            return major
    raise MajorError("no free dynamic character device major (254..234 and 511..384 are all taken)")


def choose(mode: str, proc_devices: Path = Path("/proc/devices")) -> Majors:
    """``mode``: "real", "safe" or "auto" (safe when a real NVIDIA driver is loaded, else real)."""
    if mode == "safe":
        return Majors(SAFE_GPU_MAJOR, SAFE_UVM_MAJOR, "safe")
    registered = char_majors(proc_devices)
    if mode == "auto" and real_driver_loaded(registered):
        return Majors(SAFE_GPU_MAJOR, SAFE_UVM_MAJOR, "safe")
    uvm = next_dynamic_major(set(registered))
    caps = next_dynamic_major(set(registered) | {uvm})
    return Majors(GPU_MAJOR, uvm, "real", caps, next_dynamic_major(set(registered) | {uvm, caps}))


def proc_devices_text(numbers: Majors) -> str:
    """The node's ``/proc/devices`` as the loaded driver leaves it (the driver's majors among a
    minimal kernel's): what NVIDIA's DRA driver reads through ALT_PROC_DEVICES_PATH, never the
    host's own ``/proc``."""
    chars = [(1, "mem"), (4, "tty"), (5, "/dev/tty"), (10, "misc"), (136, "pts")]
    chars += [(numbers.gpu, "nvidia"), (numbers.gpu, "nvidiactl")]
    chars += [(numbers.uvm, "nvidia-uvm"), (numbers.caps, "nvidia-caps"), (numbers.imex, "nvidia-caps-imex-channels")]
    lines = ["Character devices:"] + [f"{major:3d} {name}" for major, name in sorted(chars, key=lambda c: c[0])]
    lines += ["", "Block devices:", "  7 loop", "  8 sd", "259 blkext"]
    return "\n".join(lines) + "\n"
