"""The node's GPUs as NVIDIA's DRA driver sees them: read through NVML, like the real driver.

NVIDIA's ``gpu-kubelet-plugin`` (k8s-dra-driver-gpu, ``cmd/gpu-kubelet-plugin/nvlib.go``) asks NVML
for each GPU's minor number, UUID, name, brand, architecture, compute capability, memory, PCI bus
id and addressing mode, and the system's driver and CUDA driver versions; go-nvlib turns the
enums into strings. This module asks the node's (mock) ``libnvidia-ml.so`` the same questions
through ``nvidia-ml-py``, so the ResourceSlice says what NVIDIA's driver would publish for the
same library. The PCIe root comes from sysfs as ``k8s.io/dynamic-resource-allocation``'s
``deviceattribute`` package resolves it: the first directory under ``/sys/devices`` on the path
``/sys/bus/pci/devices/<bus id>`` links to.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ARCHITECTURES", "BRANDS", "Gpu", "GpuInfo", "NvmlError", "bus_id", "pcie_root", "read"]


class NvmlError(Exception):
    """The library could not be loaded or answered an error; the message says which call."""


# go-nvlib's GetArchitectureAsString / GetBrandAsString (pkg/nvlib/device/device.go), keyed by the
# NVML enum values of nvml.h.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
    0xFFFFFFFF: "Unknown",
}
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
# nvmlDeviceAddressingModeType_t: NONE, HMM, ATS (go-nvlib's GetAddressingModeAsString).
ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
_LONG_DOMAIN = re.compile(r"^0{4}[0-9a-f]{4}:")


@dataclass(frozen=True)
class Gpu:
    """One GPU, with the facts the ResourceSlice publishes."""

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "9.0"
    memory_bytes: int
    pcie_bus_id: str  # "0000:53:00.0"
    pcie_root: str | None  # "pci0000:53"; None when sysfs does not say
    addressing_mode: str  # "", "None", "HMM", "ATS"

    @property
    def device_name(self) -> str:
        """The device's name in the ResourceSlice: ``gpu-<minor>`` as NVIDIA's driver names it."""
        return f"gpu-{self.minor}"


@dataclass(frozen=True)
class GpuInfo:
    driver_version: str  # "550.163.01", as NVML says it
    cuda_driver_version: str  # "12.4"
    gpus: tuple[Gpu, ...]
    lost: tuple[int, ...] = ()  # indices of GPUs NVML reports lost: not published


def bus_id(nvml_bus_id: str) -> str:
    """go-nvlib's GetPCIBusID: lowercase, an 8-digit ``0000xxxx`` domain shortened to 4 digits."""
    value = nvml_bus_id.lower()
    return value[4:] if _LONG_DOMAIN.match(value) else value


def pcie_root(bus: str, sysfs: Path) -> str | None:
    """The PCIe root complex (``pci<domain>:<bus>``) of ``bus`` under the sysfs tree ``sysfs``.

    Follows ``sysfs/bus/pci/devices/<bus>`` to its target under ``sysfs/devices/`` and returns the
    first path component there, or None when the link is missing or points elsewhere.
    """
    if not _BDF.match(bus):
        return None
    link = sysfs / "bus" / "pci" / "devices" / bus
    try:
        target = os.readlink(link)
    except OSError:
        return None
    resolved = Path(os.path.normpath(link.parent / target))
    devices = Path(os.path.normpath(sysfs / "devices"))
    try:
        rel = resolved.relative_to(devices)
    except ValueError:
        return None
    if resolved.name != bus or not rel.parts or not rel.parts[0].startswith("pci"):
        return None
    return rel.parts[0]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_lock = threading.Lock()


def _load(nvml: Any, library: Path) -> None:
    """Make ``library`` the NVML that nvidia-ml-py calls.

    nvidia-ml-py opens ``libnvidia-ml.so.1`` through the loader's search path, once per process,
    and caches its function pointers; the node's library is named by path instead, and a
    different library than last time replaces the old one and its cached pointers.
    """
    try:
        handle = ctypes.CDLL(str(library))  # local: two libraries loaded never bind to each other
    except OSError as exc:
        raise NvmlError(f"cannot load {library}: {exc}") from None
    current = getattr(nvml, "nvmlLib", None)
    if current is None or current._handle != handle._handle:
        nvml.nvmlLib = handle
        getattr(nvml, "_nvmlGetFunctionPointer_cache", {}).clear()


@contextlib.contextmanager
def _node_view() -> Iterator[None]:
    """The node's GPU list, not a container's: no NVIDIA_VISIBLE_DEVICES or device-node filter.

    The mock library reads both when NVML is initialised; the process environment is restored after.
    """
    saved = {k: os.environ.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "MOKKA_IGNORE_DEVICE_NODES")}
    os.environ.pop("NVIDIA_VISIBLE_DEVICES", None)
    os.environ["MOKKA_IGNORE_DEVICE_NODES"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def read(library: Path, sysfs: Path = Path("/sys")) -> GpuInfo:
    """Every GPU NVML reports through ``library``, with the system's driver and CUDA versions.

    A GPU NVML calls lost (``NVML_ERROR_GPU_IS_LOST``) is left out and listed in ``lost``.
    """
    import pynvml

    with _lock, _node_view():
        _load(pynvml, library)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlError(f"nvmlInit through {library}: {exc}") from None
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
            found: list[Gpu] = []
            lost: list[int] = []
            for index in range(int(pynvml.nvmlDeviceGetCount())):
                try:
                    found.append(_gpu(pynvml, index, sysfs))
                except pynvml.NVMLError as exc:
                    if exc.value != pynvml.NVML_ERROR_GPU_IS_LOST:
                        raise
                    lost.append(index)  # fell off the bus: nothing to allocate
        except pynvml.NVMLError as exc:
            raise NvmlError(f"NVML through {library}: {exc}") from None
        finally:
            pynvml.nvmlShutdown()
    return GpuInfo(
        driver_version=driver,
        cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}",
        gpus=tuple(found),
        lost=tuple(lost),
    )


def _gpu(nvml: Any, index: int, sysfs: Path) -> Gpu:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    cc_major, cc_minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
    bus = bus_id(_text(nvml.nvmlDeviceGetPciInfo(h).busId))
    return Gpu(
        index=index,
        minor=int(nvml.nvmlDeviceGetMinorNumber(h)),
        uuid=_text(nvml.nvmlDeviceGetUUID(h)),
        product_name=_text(nvml.nvmlDeviceGetName(h)),
        brand=BRANDS.get(int(nvml.nvmlDeviceGetBrand(h)), "Unknown"),
        architecture=ARCHITECTURES.get(int(nvml.nvmlDeviceGetArchitecture(h)), "Unknown"),
        cuda_compute_capability=f"{cc_major}.{cc_minor}",
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total),
        pcie_bus_id=bus,
        pcie_root=pcie_root(bus, sysfs),
        addressing_mode=_addressing_mode(nvml, h),
    )


def _addressing_mode(nvml: Any, handle: Any) -> str:
    """go-nvlib's GetAddressingModeAsString: "" where the library lacks the call or the platform the mode."""
    if not hasattr(nvml, "nvmlDeviceGetAddressingMode"):
        return ""
    try:
        return ADDRESSING_MODES.get(int(nvml.nvmlDeviceGetAddressingMode(handle)), "")
    except nvml.NVMLError as exc:
        if exc.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return ""
        raise
