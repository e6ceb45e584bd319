"""MIG devices as the node shows them, and their capability numbers: plain data, no third-party
imports (the NRI plugin process uses them; the profile tables and rules are in ``mig``, the state
reader in ``mig_state``)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_GI_ID = 14  # /proc/driver/nvidia-caps/mig-minors enumerates gi0..gi14
MAX_CI_ID = 7
MAX_GPUS_IN_MINORS = 32  # mig-minors enumerates gpu0..gpu31
# The fabric-imex-mgmt capability (IMEX daemons): the minor after every MIG one, 3 + 135 * 32.
FABRIC_IMEX_MINOR = 4323


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The minor of a MIG capability (``/proc/driver/nvidia-caps/mig-minors``): ``config`` is 1,
    ``monitor`` 2, then 135 per GPU minor: the GI's access file, followed by its 8 CIs'."""
    base = 3 + 135 * gpu_minor + 9 * gi
    return base if ci is None else base + 1 + ci


def mig_minors_text() -> str:
    """``/proc/driver/nvidia-caps/mig-minors``: every capability the driver could hand out."""
    lines = ["config 1", "monitor 2"]
    for g in range(MAX_GPUS_IN_MINORS):
        for i in range(MAX_GI_ID + 1):
            lines.append(f"gpu{g}/gi{i}/access {cap_minor(g, i)}")
            lines.extend(f"gpu{g}/gi{i}/ci{c}/access {cap_minor(g, i, c)}" for c in range(MAX_CI_ID + 1))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance) as NVML numbers it on the node."""

    gpu: int  # the parent's index on the node
    gpu_minor: int
    index: int  # nvmlDeviceGetMigDeviceHandleByIndex index under the parent
    gi: int
    ci: int
    uuid: str
    profile: str  # nvidia-smi's name: "3g.40gb", "1c.3g.40gb"
    gi_profile_id: int
    ci_profile_id: int
    placement: tuple[int, int]  # GI memory slices (start, size)

    @property
    def gi_cap_minor(self) -> int:
        return cap_minor(self.gpu_minor, self.gi)

    @property
    def ci_cap_minor(self) -> int:
        return cap_minor(self.gpu_minor, self.gi, self.ci)


@dataclass(frozen=True)
class GpuMig:
    gpu: int
    uuid: str
    minor: int
    capable: bool
    current: bool
    pending: bool
    devices: tuple[MigDevice, ...]
    gpu_instances: tuple[tuple[int, int], ...]  # (GI id, profile ID), ascending id
