"""The node's GPU stack: the staged mock node and what NVIDIA's tools see of it, the NRI plugin,
NVIDIA's device plugin (or the hook for a DRA driver) and GPU Feature Discovery.

NVIDIA's tools run as host processes in the cluster's mount namespace, with their ordinary flags:
``--driver-root`` names :attr:`NodeLayout.driver_root`, the staged node's ``driver``, which holds
the driver's ``usr`` (library, nvidia-smi), ``dev`` (device nodes: the device plugin looks for them
inside the driver root) and ``proc`` (what NVIDIA's DRA driver reads there), real directories all,
so that what NVIDIA's tools resolve (e.g. libcuda's directory, by EvalSymlinks) stays inside it.
The staged sysfs entries appear at the real ``/sys`` paths inside the namespace (see
:func:`namespace_entries`): PCI functions under ``/sys/bus/pci/devices`` as symlinks into
``/sys/devices/pci<domain>:<bus>`` (so a ``readlink`` names the PCI root), the ``nvidia`` driver
and modules, and DMI's ``product_name`` (GFD's ``gpu.machine``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gpumodel import nodelayout
from gpumodel.profile import Profile
from hostsetup import node as hostnode

from .layout import NodeLayout

ALLOCATORS = ("device-plugin", "dra", "nvidia-dra", "none")
MIG_STRATEGIES = ("none", "single", "mixed")  # the device plugin's and GFD's --mig-strategy
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")


def stage_node(layout: NodeLayout, profile: Profile, nvidia_smi: Path) -> nodelayout.NodeLayout:
    """``mokka host setup`` under the node's ``node/``."""
    plan = hostnode.plan(profile, hostnode.Options(root=layout.node_root, nvidia_smi=nvidia_smi))
    hostnode.apply(plan)
    return nodelayout.NodeLayout.load(layout.node_root)


def unstage_node(layout: NodeLayout) -> list[str]:
    """Undo :func:`stage_node` (host cleanup restores the node's ``node/``); returns problems."""
    problems: list[str] = []
    if (layout.node_root / "node.json").exists() or (layout.node_root / ".mokka").exists():
        try:
            hostnode.cleanup(layout.node_root)
        except Exception as exc:  # the journal's own errors: report, keep tearing down
            problems.append(f"host cleanup {layout.node_root}: {exc}")
    return problems


def namespace_entries(layout: NodeLayout) -> tuple[list[list[str]], list[list[str]]]:
    """(binds, links) inside the namespace: the staged sysfs at the real /sys paths."""
    sys_root = layout.node_root / "sys"
    binds: list[list[str]] = []
    links: list[list[str]] = []
    devices = sys_root / "bus" / "pci" / "devices"
    for entry in sorted(devices.iterdir()):
        links.append([os.readlink(entry), f"/sys/bus/pci/devices/{entry.name}"])
    for entry in sorted((sys_root / "devices").iterdir()):
        binds.append([str(entry), f"/sys/devices/{entry.name}"])
    binds.append([str(sys_root / "bus" / "pci" / "drivers" / "nvidia"), "/sys/bus/pci/drivers/nvidia"])
    for entry in sorted((sys_root / "module").iterdir()):
        binds.append([str(entry), f"/sys/module/{entry.name}"])
    # MIG: the device plugin and the container toolkit map capabilities to /dev/nvidia-caps nodes
    # through /proc/driver/nvidia-caps/mig-minors (NVIDIA's procfs file; nothing else of it)
    caps = layout.node_root / "proc" / "driver" / "nvidia-caps"
    if caps.is_dir():
        binds.append([str(caps), "/proc/driver/nvidia-caps"])
    dmi = sys_root / "class" / "dmi" / "id"
    if dmi.is_dir():
        real = Path("/sys/class/dmi/id")
        binds.append([str(dmi), str(real.resolve()) if real.exists() else str(real)])
    # Not /proc/driver/nvidia: a container's fresh procfs cannot show it, and NVIDIA's CDI hook
    # (disable-device-node-modification) that finds the host's params file mounts over the
    # container's, failing where that is absent.
    return binds, links


def nri_plugin_argv(layout: NodeLayout, health_port: int, external: bool) -> list[str]:
    """``mokka nri-plugin`` on the namespace's NRI socket; ``external``: a device plugin or DRA
    driver hands out the GPUs (containers without an allocation get none)."""
    argv = [sys.executable, "-m", "mokka.cli", "nri-plugin", "--root", str(layout.node_root)]
    argv += ["--socket", "/var/run/nri/nri.sock", "--health-addr", f"127.0.0.1:{health_port}"]
    if external:
        argv += ["--allocator", "external"]
    return argv


def device_plugin_argv(
    binary: Path, layout: NodeLayout, strategy: str, hook: Path, mig_strategy: str = "none"
) -> list[str]:
    root = str(layout.driver_root)
    return [
        str(binary),
        f"--driver-root={root}",
        f"--driver-root-ctr-path={root}",
        f"--dev-root={root}",
        f"--device-list-strategy={strategy}",
        "--device-id-strategy=uuid",
        "--fail-on-init-error=true",
        f"--nvidia-cdi-hook-path={hook}",
        f"--mig-strategy={mig_strategy}",
    ]


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


def nvml_env(layout: NodeLayout) -> dict[str, str]:
    """Where NVIDIA's Go tools dlopen ``libnvidia-ml.so.1`` from (go-nvlib's platform check looks
    only on the library path; in their pods the container toolkit puts the library there)."""
    return {"LD_LIBRARY_PATH": str(layout.driver_root / "usr" / "lib64")}


def runtime_env(layout: NodeLayout) -> dict[str, str]:
    """The environment of the node's container runtime: the staged node's procfs and sysfs files
    at the real paths for the C programs it runs (Mokka's LD_PRELOAD redirect), as the kernel of
    a GPU node shows them to every process there. NVIDIA's runtime wrappers (the toolkit operand's)
    run ``cat /proc/modules`` and use runc directly when no nvidia module shows."""
    shim = layout.node_root / "lib" / "libmokka-sysfs.so"
    if not shim.is_file():
        return {}
    return {"LD_PRELOAD": str(shim), "MOKKA_SYSFS_ROOT": str(layout.node_root)}


def gfd_argv(binary: Path, layout: NodeLayout, mig_strategy: str = "none") -> list[str]:
    return [
        str(binary),
        "--oneshot",
        "--no-timestamp",
        "--use-node-feature-api=false",
        f"--output-file={layout.gfd / 'labels'}",
        f"--driver-root-ctr-path={layout.driver_root}",
        f"--mig-strategy={mig_strategy}",
    ]


def parse_labels(text: str) -> dict[str, str]:
    """GFD's output file: one ``key=value`` per line."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key:
            labels[key] = value
    return labels


def dra_driver_argv(layout: NodeLayout) -> Sequence[str] | None:
    """The DRA kubelet plugin ``--allocator dra`` runs (``mokka dra-plugin``), started in the
    namespace after the node is Ready as process ``dra-driver`` and stopped at ``down``."""
    return [
        sys.executable,
        "-m",
        "mokka.cli",
        "dra-plugin",
        "--root",
        str(layout.node_root),
        "--kubeconfig",
        str(layout.cluster.admin_kubeconfig),
        "--node-name",
        layout.name,
    ]
