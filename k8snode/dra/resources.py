"""The node's GPUs as ``resource.k8s.io/v1`` objects, under NVIDIA's names: pure functions.

Facts from NVIDIA's GPU DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin/deviceinfo.go`` and the chart's ``deviceclass-gpu.yaml``), kept so that
DeviceClasses and ResourceClaims written for a real cluster select these devices unchanged:

- driver ``gpu.nvidia.com``; one pool per node, named after the node; devices ``gpu-<minor>``;
- attributes in the driver's domain (a CEL selector reads them as
  ``device.attributes["gpu.nvidia.com"].productName``): ``type`` = ``gpu``, ``uuid``,
  ``productName``, ``brand``, ``architecture``, ``pcieBusID``, ``addressingMode`` (strings),
  ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` (versions, normalised by
  Masterminds/semver as the driver does: ``550.163.01`` -> ``550.163.1``, ``9.0`` -> ``9.0.0``),
  ``index`` and ``minor`` (ints, as the driver published them before it dropped them);
- ``resource.kubernetes.io/pcieRoot`` (the standard attribute) when sysfs resolves it;
- capacity ``memory``: the framebuffer size in bytes, as a binary quantity (``81559Mi``);
- DeviceClass ``gpu.nvidia.com``: ``device.driver == 'gpu.nvidia.com' &&
  device.attributes['gpu.nvidia.com'].type == 'gpu'``, with ``extendedResourceName:
  nvidia.com/gpu`` as the chart sets it for resource.k8s.io/v1.

The InfiniBand adapters are the project's own driver, ``nic.mokka.io`` (no NIC driver's names
fit an RDMA adapter without a network interface): devices ``mlx5-<n>``, attributes ``type`` =
``hca``, ``rdmaDevice`` (``mlx5_3``), ``hcaType``, ``firmwareVersion``, ``nodeGUID``,
``linkLayer``, ``rateGbps``, ``ports``, and Kubernetes' standard ``pcieRoot``, ``pciBusID`` and
``numaNode``; DeviceClass ``nic.mokka.io`` selects them all. A GPU and an adapter behind the same
PCIe switch share ``resource.kubernetes.io/pcieRoot``, so a claim's ``matchAttribute`` constraint
on it pairs a GPU with its adapter.

An :class:`Inventory` is what one driver publishes and prepares on a node: its devices, the CDI
device each one is, and its DeviceClass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .gpus import Gpu, GpuInfo
from .nics import Nic

__all__ = [
    "API_VERSION",
    "DEFAULT_DRIVER",
    "DEVICE_CLASS_SELECTOR",
    "NIC_DRIVER",
    "PCIE_ROOT",
    "Inventory",
    "device",
    "device_class",
    "gpu_inventory",
    "nic_device",
    "nic_device_class",
    "nic_inventory",
    "quantity",
    "semver",
    "slice_of",
]

API_VERSION = "resource.k8s.io/v1"
DEFAULT_DRIVER = "gpu.nvidia.com"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
NIC_DRIVER = "nic.mokka.io"
NIC_TYPE = "hca"
DEVICE_TYPE = "gpu"
DEVICE_CLASS_SELECTOR = "device.driver == '{driver}' && device.attributes['{driver}'].type == 'gpu'"
EXTENDED_RESOURCE = "nvidia.com/gpu"

Json = dict[str, Any]

_SEMVER = re.compile(
    r"^v?(\d+)(\.\d+)?(\.\d+)?(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
_BINARY_SUFFIXES = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def semver(version: str) -> str:
    """``semver.MustParse(v).String()`` of Masterminds/semver v1: missing parts 0, leading zeros dropped."""
    m = _SEMVER.match(version)
    if not m:
        raise ValueError(f"{version!r} is not a version")
    major, minor, patch = (int(p.lstrip(".")) if p else 0 for p in m.group(1, 2, 3))
    return f"{major}.{minor}.{patch}{m.group(4) or ''}{m.group(6) or ''}"


def quantity(n_bytes: int) -> str:
    """A byte count as Kubernetes writes a binary-SI quantity: the largest exact suffix, else plain."""
    for suffix, shift in _BINARY_SUFFIXES:
        if n_bytes and n_bytes % (1 << shift) == 0:
            return f"{n_bytes >> shift}{suffix}"
    return str(n_bytes)


def device(gpu: Gpu, info: GpuInfo) -> Json:
    """One ResourceSlice device for ``gpu``."""
    attributes: Json = {
        "type": {"string": DEVICE_TYPE},
        "uuid": {"string": gpu.uuid},
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "productName": {"string": gpu.product_name},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": semver(gpu.cuda_compute_capability)},
        "driverVersion": {"version": semver(info.driver_version)},
        "cudaDriverVersion": {"version": semver(info.cuda_driver_version)},
        "pcieBusID": {"string": gpu.pcie_bus_id},
        "addressingMode": {"string": gpu.addressing_mode},
    }
    if gpu.pcie_root:
        attributes[PCIE_ROOT] = {"string": gpu.pcie_root}
    return {
        "name": gpu.device_name,
        "attributes": attributes,
        "capacity": {"memory": {"value": quantity(gpu.memory_bytes)}},
    }


def slice_of(
    devices: list[Json], node: str, *, driver: str = DEFAULT_DRIVER, generation: int = 1, owner_uid: str | None = None
) -> Json:
    """The ResourceSlice of ``node``'s pool holding ``devices`` (:func:`device` dicts)."""
    meta: Json = {"generateName": f"{node}-{driver}-"}
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class(driver: str = DEFAULT_DRIVER) -> Json:
    """The DeviceClass NVIDIA's chart installs: every full GPU of ``driver``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {
            "selectors": [{"cel": {"expression": DEVICE_CLASS_SELECTOR.format(driver=driver)}}],
            "extendedResourceName": EXTENDED_RESOURCE,
        },
    }


# ---- the InfiniBand adapters ---------------------------------------------------------------


def nic_device(nic: Nic) -> Json:
    """One ResourceSlice device for the adapter ``nic``."""
    attributes: Json = {
        "type": {"string": NIC_TYPE},
        "rdmaDevice": {"string": nic.name},
        "hcaType": {"string": nic.hca_type},
        "nodeGUID": {"string": nic.node_guid},
        "linkLayer": {"string": nic.link_layer},
        "rateGbps": {"int": nic.rate_gbps},
        "ports": {"int": nic.ports},
        PCI_BUS_ID: {"string": nic.pcie_bus_id},
    }
    try:
        attributes["firmwareVersion"] = {"version": semver(nic.firmware)}
    except ValueError:
        attributes["firmwareVersion"] = {"string": nic.firmware}
    if nic.pcie_root:
        attributes[PCIE_ROOT] = {"string": nic.pcie_root}
    if nic.numa_node is not None:
        attributes[NUMA_NODE] = {"int": nic.numa_node}
    return {"name": nic.device_name, "attributes": attributes}


def nic_device_class(driver: str = NIC_DRIVER) -> Json:
    """The DeviceClass of every adapter of ``driver``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
    }


# ---- what one driver publishes ---------------------------------------------------------------


@dataclass(frozen=True)
class Inventory:
    """One driver's devices on a node: what its ResourceSlice holds, the CDI device each one is
    (by device name), its DeviceClass, and a line for the logs."""

    driver: str
    devices: tuple[Json, ...]
    cdi_ids: Mapping[str, str]
    device_class: Json
    summary: str


def gpu_inventory(info: GpuInfo, *, driver: str = DEFAULT_DRIVER, cdi_kind: str) -> Inventory:
    """The GPUs, each the CDI device ``<cdi_kind>=<UUID>`` of the project's spec."""
    products = ", ".join(sorted({g.product_name for g in info.gpus})) or "no GPUs"
    return Inventory(
        driver=driver,
        devices=tuple(device(g, info) for g in info.gpus),
        cdi_ids={g.device_name: f"{cdi_kind}={g.uuid}" for g in info.gpus},
        device_class=device_class(driver),
        summary=f"{len(info.gpus)} GPUs ({products})",
    )


def nic_inventory(nics: tuple[Nic, ...], *, driver: str = NIC_DRIVER, cdi_kind: str) -> Inventory:
    """The adapters, each the CDI device ``<cdi_kind>=<name>`` of the adapters' spec."""
    types = ", ".join(sorted({n.hca_type for n in nics})) or "no adapters"
    return Inventory(
        driver=driver,
        devices=tuple(nic_device(n) for n in nics),
        cdi_ids={n.device_name: f"{cdi_kind}={n.name}" for n in nics},
        device_class=nic_device_class(driver),
        summary=f"{len(nics)} adapters ({types})",
    )
