"""What a container gets for a set of mock GPUs: ONE model, rendered two ways.

``container_edits(layout, gpus)`` computes device nodes, read-only mounts and environment
once. ``cdi/`` renders the result as CDI ``containerEdits``; the NRI plugin renders it
as a ``ContainerAdjustment``. Neither renderer decides anything, so the two paths cannot
drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .mig_devices import FABRIC_IMEX_MINOR, MigDevice
from .nodelayout import GpuNode, NodeLayout

READ_ONLY = ("ro", "nosuid", "nodev", "bind")
WRITABLE = ("rw", "nosuid", "nodev", "bind")

# Where Debian/Ubuntu images look for libraries, by the node's machine (``uname -m``);
# GB200/GB300 nodes are aarch64.
LIBDIRS_IN_CONTAINER = {"x86_64": "/usr/lib/x86_64-linux-gnu", "aarch64": "/usr/lib/aarch64-linux-gnu"}
SMI_IN_CONTAINER = "/usr/bin/nvidia-smi"
SHIM_IN_CONTAINER = "/usr/lib/mokka/libmokka-sysfs.so"
TREES_IN_CONTAINER = "/run/mokka/root"  # MOKKA_SYSFS_ROOT: the staged sys/ and proc/ trees
TREES = ("sys", "proc")  # the node root's trees mounted there
KERNEL_LOG_IN_CONTAINER = "/var/log/kern.log"  # the driver's Xid lines, where syslog puts kernel messages


@dataclass(frozen=True)
class DeviceNode:
    path: str  # inside the container
    major: int
    minor: int
    host_path: str  # the staged node on the host
    type: str = "c"
    file_mode: int = 0o666


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = READ_ONLY


@dataclass(frozen=True)
class Hook:
    """An OCI createContainer hook (runs in the container's mount namespace before pivot_root)."""

    path: str
    args: tuple[str, ...]  # argv, the program's name first


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()  # createContainer hooks

    def env_dict(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.env)

    def without_devices(self) -> ContainerEdits:
        return replace(self, device_nodes=())


def control_nodes(layout: NodeLayout) -> list[DeviceNode]:
    dev = layout.dev_root
    return [
        DeviceNode("/dev/nvidiactl", layout.gpu_major, 255, f"{dev}/nvidiactl"),
        DeviceNode("/dev/nvidia-uvm", layout.uvm_major, 0, f"{dev}/nvidia-uvm"),
        DeviceNode("/dev/nvidia-uvm-tools", layout.uvm_major, 1, f"{dev}/nvidia-uvm-tools"),
        DeviceNode("/dev/nvidia-modeset", layout.gpu_major, 254, f"{dev}/nvidia-modeset"),
    ]


def imex_nodes(layout: NodeLayout) -> list[DeviceNode]:
    """IMEX channel 0 (what the driver's NVreg_CreateImexChannel0 makes; a DRA driver hands out
    others by number) and the fabric-imex-mgmt capability, root's alone like the driver's."""
    if layout.imex_major is None or layout.imex_caps_major is None:
        return []
    dev = layout.dev_root
    channel = "nvidia-caps-imex-channels/channel0"
    cap = f"nvidia-caps/nvidia-cap{FABRIC_IMEX_MINOR}"
    return [
        DeviceNode(f"/dev/{channel}", layout.imex_major, 0, f"{dev}/{channel}"),
        DeviceNode(f"/dev/{cap}", layout.imex_caps_major, FABRIC_IMEX_MINOR, f"{dev}/{cap}", file_mode=0o400),
    ]


def gpu_node(layout: NodeLayout, gpu: GpuNode) -> DeviceNode:
    return DeviceNode(f"/dev/nvidia{gpu.minor}", layout.gpu_major, gpu.minor, f"{layout.dev_root}/nvidia{gpu.minor}")


def mig_cap_node(layout: NodeLayout, minor: int) -> DeviceNode:
    """``/dev/nvidia-caps/nvidia-cap<minor>``: a MIG capability (config 1 is root's alone, the
    rest read-only for all, as the driver's DeviceFileMode says)."""
    assert layout.caps_major is not None
    name = f"nvidia-caps/nvidia-cap{minor}"
    return DeviceNode(
        f"/dev/{name}", layout.caps_major, minor, f"{layout.dev_root}/{name}", file_mode=0o400 if minor == 1 else 0o444
    )


def libdir_in_container(layout: NodeLayout) -> str:
    """The library directory of the node's architecture inside a container."""
    return LIBDIRS_IN_CONTAINER[layout.machine]


def common_edits(layout: NodeLayout) -> ContainerEdits:
    """What every GPU container gets, whichever GPUs: control nodes, libraries, env.

    The library carries the node's state inside its own file, so mounting it is all a
    container needs to see the node (and its live changes)."""
    version = layout.driver_version
    lib = layout.library
    libdir = libdir_in_container(layout)
    mounts = [
        Mount(lib, f"{libdir}/libnvidia-ml.so.{version}"),
        Mount(lib, f"{libdir}/libnvidia-ml.so.1"),
    ]
    if layout.cuda_library:
        mounts.append(Mount(layout.cuda_library, f"{libdir}/libcuda.so.{version}"))
        mounts.append(Mount(layout.cuda_library, f"{libdir}/libcuda.so.1"))
    if layout.dcgm_library:
        # dcgm-exporter's images look for it there; it reads through the NVML beside it.
        mounts.append(Mount(layout.dcgm_library, f"{libdir}/libdcgm.so.4"))
    if layout.nvidia_smi:
        mounts.append(Mount(layout.nvidia_smi, SMI_IN_CONTAINER))
    kernel = kernel_view(layout)
    return ContainerEdits(
        env=kernel.env, device_nodes=tuple(control_nodes(layout)), mounts=tuple(mounts) + kernel.mounts
    )


def kernel_view(layout: NodeLayout) -> ContainerEdits:
    """What a GPU node's kernel shows a container that no runtime puts there: the GPUs' PCI
    sysfs and /proc/driver/nvidia (C tools such as lspci and nvidia-smi topo's hwloc read them;
    the sysfs shim redirects those lookups into the staged trees) and the kernel log with the
    driver's Xid lines."""
    log = (Mount(layout.kernel_log, KERNEL_LOG_IN_CONTAINER),) if layout.kernel_log else ()
    trees = sysfs_view(layout)
    return ContainerEdits(env=trees.env, mounts=log + trees.mounts)


def sysfs_view(layout: NodeLayout) -> ContainerEdits:
    """The node's staged sys/ and proc/ trees and the shim that shows them at the real paths
    (nothing when the node was staged without the shim): the PCI functions, the driver's files
    and the InfiniBand adapters' classes; and the subnet's relay directory (MADs between
    processes: ibping) on a node with adapters."""
    if not layout.sysfs_shim:
        return ContainerEdits()
    mounts = [Mount(layout.sysfs_shim, SHIM_IN_CONTAINER)]
    mounts += [Mount(f"{layout.root}/{tree}", f"{TREES_IN_CONTAINER}/{tree}") for tree in TREES]
    if layout.ib_relay:  # writable: a container serving a MAD class (ibping -S) listens there
        mounts.append(Mount(layout.ib_relay, f"{TREES_IN_CONTAINER}/ib-relay", WRITABLE))
    env = (f"LD_PRELOAD={SHIM_IN_CONTAINER}", f"MOKKA_SYSFS_ROOT={TREES_IN_CONTAINER}")
    return ContainerEdits(env=env, mounts=tuple(mounts))


def driver_procfs(layout: NodeLayout, *, modules: bool = False) -> tuple[Hook, ...]:
    """What a GPU node's kernel shows in /proc, for programs that read it with raw system calls
    (Go, out of the sysfs shim's reach): /proc/driver/nvidia and /proc/driver/nvidia-caps
    (NVIDIA's device plugin maps MIG capabilities through nvidia-caps/mig-minors) and, with
    ``modules``, /proc/modules (NVIDIA's mig-parted) and /proc/devices with the driver's majors
    (nvidia-ctk). Mokka's OCI hook makes them in the container's /proc (nothing when the node was
    staged without it)."""
    if not layout.proc_hook:
        return ()
    args: tuple[str, ...] = ("mokka-proc-hook", "--driver", f"{layout.root}/proc/driver")
    if modules:
        args += ("--proc", f"modules={layout.root}/proc/modules")
        if layout.proc_devices:  # nvidia-ctk (the MIG manager's, with CDI) finds the majors there
            args += ("--proc", f"devices={layout.proc_devices}")
    return (Hook(layout.proc_hook, args),)


def with_driver_procfs(layout: NodeLayout, edits: ContainerEdits, *, modules: bool = False) -> ContainerEdits:
    """``edits`` with Mokka's hook (:func:`driver_procfs`), which then also makes what ``edits``
    would otherwise list as mounts: each second name of a file already mounted in the same
    directory (``libnvidia-ml.so.1``, ``libcuda.so.1``) a symbolic link to the first, as it is on
    a GPU node; and the staged sys/ and proc/ trees' read-only mounts. The container sees the same
    files; its spec, which containerd 2.x decodes again at every status of every container in the
    pod, is smaller. Only where the edits themselves are applied: beside CDI references, whose
    spec brings those mounts, the hook is :func:`driver_procfs` alone."""
    hooks = driver_procfs(layout, modules=modules)
    if not hooks:
        return edits
    first: dict[tuple[str, str], str] = {}  # (host file, directory in the container) -> its first name there
    mounts: list[Mount] = []
    extra: list[str] = []
    for m in edits.mounts:
        directory, _, name = m.container_path.rpartition("/")
        if (m.host_path, directory) in first:
            extra += ["--link", f"{m.container_path}={first[m.host_path, directory]}"]
        elif m.options == READ_ONLY and directory == TREES_IN_CONTAINER and name in TREES:
            extra += ["--bind", f"{m.host_path}={m.container_path}"]
        else:
            first.setdefault((m.host_path, directory), name)
            mounts.append(m)
    hook = replace(hooks[0], args=hooks[0].args + tuple(extra))
    return replace(edits, mounts=tuple(mounts), hooks=(*edits.hooks, hook))


def mig_configuration(layout: NodeLayout, edits: ContainerEdits) -> ContainerEdits:
    """``edits`` for a container given the MIG configuration capability (NVIDIA's MIG manager):
    the library that carries the state mounted writable (MIG changes are writes to it; read-only,
    NVML answers NO_PERMISSION as it does an unprivileged caller); the hook then shows it
    /proc/modules beside the driver's procfs (:func:`with_driver_procfs` with ``modules``)."""
    writable = tuple(Mount(m.host_path, m.container_path, WRITABLE) if m.host_path == layout.state else m
                     for m in edits.mounts)  # fmt: skip
    return replace(edits, mounts=writable)


def mig_device_nodes(layout: NodeLayout, device: MigDevice) -> tuple[DeviceNode, ...]:
    """A MIG device's nodes, as the device plugin and the container toolkit hand them out: its
    parent's ``/dev/nvidiaN`` and the capabilities of its GPU and compute instance."""
    parent = next(g for g in layout.gpus if g.index == device.gpu)
    return (
        gpu_node(layout, parent),
        mig_cap_node(layout, device.gi_cap_minor),
        mig_cap_node(layout, device.ci_cap_minor),
    )


def container_edits(
    layout: NodeLayout, gpus: Sequence[GpuNode], mig_devices: Sequence[MigDevice] = ()
) -> ContainerEdits:
    """Everything a container needs to see exactly ``gpus`` and ``mig_devices``.

    ``NVIDIA_VISIBLE_DEVICES`` names whole GPUs by index, as ``docker run --gpus '"device=0,1"'``
    and the device plugin's index strategy do (a list of eight UUIDs is 330 bytes more of a spec
    containerd 2.x decodes again and again), and MIG devices by UUID, which outlives a change of
    the GPU's MIG layout."""
    common = common_edits(layout)
    names = [str(g.index) for g in gpus] + [d.uuid for d in mig_devices]
    visible = ",".join(names) if names else "void"
    nodes = [gpu_node(layout, g) for g in gpus]
    for d in mig_devices:
        nodes += [n for n in mig_device_nodes(layout, d) if n not in nodes]
    return ContainerEdits(
        env=(f"NVIDIA_VISIBLE_DEVICES={visible}", *common.env),
        device_nodes=tuple(nodes) + common.device_nodes,
        mounts=common.mounts,
    )
