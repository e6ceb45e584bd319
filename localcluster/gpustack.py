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

import sys
from collections.abc import Sequence
from pathlib import Path

from gpumodel import nodelayout
from gpumodel.profile import Profile
from hostsetup import infiniband
from hostsetup import node as hostnode
from hostsetup.view import sysfs_view
from k8snode import gfd

from .layout import NodeLayout

ALLOCATORS = ("device-plugin", "dra", "nvidia-dra", "none")
MIG_STRATEGIES = ("none", "single", "mixed")  # the device plugin's and GFD's --mig-strategy
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")


def stage_node(layout: NodeLayout, profile: Profile, nvidia_smi: Path) -> nodelayout.NodeLayout:
    """``mokka host setup`` under the node's ``node/``, in the cluster's InfiniBand subnet (one relay
    directory for every node)."""
    relay = layout.cluster.ib_relay
    relay.mkdir(exist_ok=True)
    relay.chmod(hostnode.RELAY_MODE)
    options = hostnode.Options(root=layout.node_root, nvidia_smi=nvidia_smi, ib_relay=relay)
    plan = hostnode.plan(profile, options)
    hostnode.apply(plan)
    return nodelayout.NodeLayout.load(layout.node_root)


def stage_fabric(nodes: Sequence[tuple[str, Profile, NodeLayout]]) -> None:
    """The cluster's InfiniBand subnet in every node's tree: each node's adapters on their rail's
    leaf switch (the tools that walk the fabric see the other nodes; gpumodel/fabric.py)."""
    infiniband.write_fabric([(name, prof, layout.node_root) for name, prof, layout in nodes])


def sync_fabric(layouts: Sequence[NodeLayout]) -> None:
    """Every node's view of the subnet with the links as the nodes' ports are now (after a port
    fault on one of them)."""
    infiniband.sync_fabric([layout.node_root for layout in layouts])


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
    view = sysfs_view(layout.node_root)
    return view["binds"], view["links"]


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
    return gfd.oneshot_argv(binary, layout.gfd / "labels", layout.driver_root, mig_strategy)


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
