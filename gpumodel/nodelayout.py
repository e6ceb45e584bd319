"""Where host setup staged a mock node: the layout written as ``<root>/node.json``.

Host setup is its one writer; the NRI plugin, the CDI generator and the Kubernetes plugins read
it. It names paths and GPUs only: what a container gets is :mod:`gpumodel.edits`' job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

MACHINES = ("x86_64", "aarch64")


class LayoutError(ValueError):
    """node.json is missing, unreadable or not a node layout; the message names the file."""


@dataclass(frozen=True)
class GpuNode:
    index: int
    uuid: str
    bus_id: str
    minor: int


@dataclass(frozen=True)
class NodeLayout:
    """Where host setup staged the mock node; written as ``<root>/node.json``."""

    root: str
    profile: str
    driver_version: str
    libdir: str  # host directory holding libnvidia-ml.so.<version> and its links
    state: str  # host path of the file carrying the state (the staged libnvidia-ml itself)
    dev_root: str  # host directory holding the staged device nodes
    gpu_major: int
    uvm_major: int
    gpus: tuple[GpuNode, ...]
    nvidia_smi: str | None = None  # staged nvidia-smi binary, when the user provided one
    sysfs_shim: str | None = None  # LD_PRELOAD library redirecting /sys and /proc lookups
    cuda_library: str | None = None  # staged libcuda.so.<version> (None: staged by an older Mokka)
    dcgm_library: str | None = None  # staged libdcgm.so.4 (None: staged by an older Mokka)
    machine: str = "x86_64"  # the node's architecture (uname -m): picks the library directory in containers
    caps_major: int | None = None  # /dev/nvidia-caps (MIG); None: no MIG-capable GPU, or an older Mokka's layout
    kernel_log: str | None = None  # staged kernel log (Xid lines of injected faults); None: an older Mokka
    # IMEX: the nvidia-caps-imex-channels major of /dev/nvidia-caps-imex-channels/channel<N>, the
    # nvidia-caps major of fabric-imex-mgmt (/dev/nvidia-caps/nvidia-cap4323), the staged
    # /proc/devices naming both (NVIDIA's DRA driver reads it as ALT_PROC_DEVICES_PATH) and the
    # mock nvidia-imex, nvidia-imex-ctl; None: an older Mokka's layout
    imex_major: int | None = None
    imex_caps_major: int | None = None
    proc_devices: str | None = None
    imex_tools: str | None = None  # the directory holding nvidia-imex and nvidia-imex-ctl
    # The OCI hook putting the staged procfs files into a container's /proc, for programs that read
    # them with raw system calls (edits.driver_procfs); None: not built, or an older Mokka
    proc_hook: str | None = None
    # The InfiniBand subnet's relay directory (<root>/ib-relay, itself or a link to the one every node of
    # a cluster shares): the sysfs shim passes MADs no agent of the node answers (ibping's) to the
    # process serving them there; None: a node without adapters, or an older Mokka's layout
    ib_relay: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def sysfs(self) -> Path:
        """The node's sysfs: the tree staged under its root when there is one, else ``/sys``."""
        staged = Path(self.root) / "sys"
        return staged if (staged / "bus" / "pci" / "devices").is_dir() else Path("/sys")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> NodeLayout:
        """Parse node.json; LayoutError (a ValueError) names what is wrong."""
        try:
            data = json.loads(text)
            data["gpus"] = tuple(GpuNode(**g) for g in data["gpus"])
            layout = cls(**data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise LayoutError(f"not a node layout ({type(exc).__name__}: {exc})") from None
        if layout.machine not in MACHINES:
            raise LayoutError(f"machine {layout.machine!r} is not one of {', '.join(MACHINES)}")
        return layout

    @classmethod
    def load(cls, root: Path) -> NodeLayout:
        """``<root>/node.json``; FileNotFoundError when absent, LayoutError when unusable."""
        path = root / "node.json"
        try:
            text = path.read_bytes().decode()
        except FileNotFoundError:
            raise
        except UnicodeDecodeError:
            raise LayoutError(f"{path}: not a node layout (not UTF-8 text)") from None
        except OSError as exc:
            raise LayoutError(f"{path}: cannot read: {exc.strerror or exc}") from None
        try:
            return cls.from_json(text)
        except LayoutError as exc:
            raise LayoutError(f"{path}: {exc}") from None

    def select(self, wanted: Iterable[str]) -> list[GpuNode]:
        """GPUs by index or UUID ("all" for every GPU); unknown names raise KeyError."""
        wanted = list(wanted)
        if wanted == ["all"]:
            return list(self.gpus)
        chosen: list[GpuNode] = []
        for name in wanted:
            match = [g for g in self.gpus if str(g.index) == name or g.uuid == name]
            if not match:
                raise KeyError(name)
            if match[0] not in chosen:
                chosen.append(match[0])
        return sorted(chosen, key=lambda g: g.index)

    @property
    def library(self) -> str:
        return f"{self.libdir}/libnvidia-ml.so.{self.driver_version}"
