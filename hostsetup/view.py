"""The staged node as its kernel would show it: the mock sysfs (and NVIDIA's MIG procfs file) at
the real ``/sys`` and ``/proc`` paths, as a mount namespace's view (:mod:`containers.mounts`).

NVIDIA's Go tools (GFD, the device plugin, the container toolkit) read ``/sys`` with raw system
calls, past the LD_PRELOAD shim the C programs get: they need the files where the kernel puts
them. Host setup writes the files; this names where a namespace shows them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["sysfs_view"]


def sysfs_view(node_root: Path) -> dict[str, Any]:
    """``binds`` and ``links`` placing the node staged at ``node_root`` at the real paths."""
    sys_root = node_root / "sys"
    binds: list[list[str]] = []
    links: list[list[str]] = []
    for entry in sorted((sys_root / "bus" / "pci" / "devices").iterdir()):
        links.append([os.readlink(entry), f"/sys/bus/pci/devices/{entry.name}"])
    for entry in sorted((sys_root / "devices").iterdir()):
        binds.append([str(entry), f"/sys/devices/{entry.name}"])
    binds.append([str(sys_root / "bus" / "pci" / "drivers" / "nvidia"), "/sys/bus/pci/drivers/nvidia"])
    for entry in sorted((sys_root / "module").iterdir()):
        binds.append([str(entry), f"/sys/module/{entry.name}"])
    # MIG: the device plugin and the container toolkit map capabilities to /dev/nvidia-caps nodes
    # through /proc/driver/nvidia-caps/mig-minors (NVIDIA's procfs file; nothing else of it)
    caps = node_root / "proc" / "driver" / "nvidia-caps"
    if caps.is_dir():
        binds.append([str(caps), "/proc/driver/nvidia-caps"])
    dmi = sys_root / "class" / "dmi" / "id"
    if dmi.is_dir():
        real = Path("/sys/class/dmi/id")
        binds.append([str(dmi), str(real.resolve()) if real.exists() else str(real)])
    # Not /proc/driver/nvidia: a container's fresh procfs cannot show it, and NVIDIA's CDI hook
    # (disable-device-node-modification) that finds the host's params file mounts over the
    # container's, failing where that is absent.
    return {"binds": binds, "links": links}
