"""What NVIDIA's device plugin advertises for a mock node's GPUs (its resources, GPU by GPU), as
the local cluster checks its real nodes and as every virtual node carries it.

The plugin names whole GPUs ``nvidia.com/gpu``; with MIG strategy ``mixed`` each MIG profile
``nvidia.com/mig-<name>`` (go-nvlib's name from the memory, ``+`` as ``.``); with ``single`` the
MIG devices as ``nvidia.com/gpu``. A profile's MIG GPUs are counted in their declared layout.
"""

from __future__ import annotations

from gpumodel.profile import Profile

__all__ = ["allocatable_by_gpu", "expected_allocatable"]


def expected_allocatable(profile: Profile, mig_strategy: str) -> dict[str, int]:
    """What the device plugin advertises for ``profile`` as staged (its declared MIG layout):
    whole GPUs as nvidia.com/gpu; with ``mixed`` each MIG profile as nvidia.com/mig-<name>
    (go-nvlib's name from the memory, ``+`` as ``.``), with ``single`` MIG devices as
    nvidia.com/gpu."""
    out: dict[str, int] = {}
    for resources in allocatable_by_gpu(profile, mig_strategy):
        for name, count in resources.items():
            out[name] = out.get(name, 0) + count
    return out


def allocatable_by_gpu(profile: Profile, mig_strategy: str) -> list[dict[str, int]]:
    """:func:`expected_allocatable` GPU by GPU (index order): what each GPU adds, and what an
    unhealthy GPU takes away."""
    from gpumodel import mig, mig_state

    out: list[dict[str, int]] = []
    for device in profile.devices():
        mine: dict[str, int] = {}
        out.append(mine)
        gis = mig_state.initial_layout(device.spec) if device.spec.modes.mig else []
        if not device.spec.modes.mig or mig_strategy == "none":
            mine["nvidia.com/gpu"] = 1
            continue
        for gi in gis:
            for ci in gi.compute:
                if mig_strategy == "single":
                    name = "nvidia.com/gpu"
                else:
                    suffix = "+me" if gi.profile.index == mig.GI_INDEX["1+me"] else ""
                    memory = device.spec.memory.total_mib
                    profile_name = mig.nvlib_profile_name(
                        gi.profile.slices, ci.profile.slices, gi.profile.memory_mib, memory, suffix
                    )
                    name = "nvidia.com/mig-" + profile_name.replace("+", ".")
                mine[name] = mine.get(name, 0) + 1
    return out
