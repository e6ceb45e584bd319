"""NVIDIA's DRA driver for GPUs on the local cluster (``mokka cluster up --allocator nvidia-dra``).

NVIDIA's own kubelet plugins run on every real node as host processes in the node's namespace,
with the flags and environment NVIDIA's chart gives its DaemonSet, pointed at the node's mock
driver root:

- ``gpu-kubelet-plugin`` (driver ``gpu.nvidia.com``) reads the GPUs through the mock NVML,
  publishes them as ResourceSlices with NVIDIA's attributes and writes NVIDIA's CDI specs (with
  ``nvidia-cdi-hook``, built from the Go module proxy) into the node's private ``/var/run/cdi``.
- NVIDIA's CRDs (ComputeDomain, ComputeDomainClique) from its chart, and its DeviceClasses.
- ``compute-domain-kubelet-plugin`` (driver ``compute-domain.nvidia.com``) reads the IMEX surface
  host setup staged: the node's ``/proc/devices`` through ``ALT_PROC_DEVICES_PATH`` (never the
  host's), the fabric-imex-mgmt capability under the driver root, and each GPU's fabric clique;
  it publishes the IMEX channels and the daemon device.

The binaries come from NVIDIA's repository (no registry serves them): ``$MOKKA_NVIDIA_DRA_DIR``
names a directory holding ``gpu-kubelet-plugin`` and ``compute-domain-kubelet-plugin`` (plain or
``.xz``), else the checkout's ``../shared/thirdparty/k8s-dra-driver-gpu``. The DeviceClasses are
the ones NVIDIA's chart installs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed import thirdparty

from .config import NodeLayout

ENV_DIR = "MOKKA_NVIDIA_DRA_DIR"
KUBELET_PLUGINS = ("gpu-kubelet-plugin", "compute-domain-kubelet-plugin")
NAMESPACE = "nvidia-dra-driver-gpu"  # the chart's usual release namespace
GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
CDI_ROOT = "/var/run/cdi"  # the node's private CDI directory (containerd reads it)


class NvidiaDraUnavailable(RuntimeError):
    """NVIDIA's DRA driver binaries are not where they were looked for; the message says where."""


def source_dir() -> Path | None:
    return thirdparty.directory(ENV_DIR, "k8s-dra-driver-gpu")


def binaries(cache: Path) -> dict[str, Path]:
    """The kubelet plugins' executables (unpacked into ``cache`` once)."""
    src = source_dir()
    if src is None:
        raise NvidiaDraUnavailable(
            f"--allocator nvidia-dra needs NVIDIA's {', '.join(KUBELET_PLUGINS)} "
            f"(github.com/NVIDIA/k8s-dra-driver-gpu): set {ENV_DIR} to the directory holding them"
        )
    try:
        return thirdparty.unpacked(src, KUBELET_PLUGINS, cache / "nvidia-dra")
    except thirdparty.Missing as exc:
        raise NvidiaDraUnavailable(f"{ENV_DIR}={src}: {exc}") from None


def _common(layout: NodeLayout, hook: Path) -> list[str]:
    root = str(layout.driver_root)
    return [
        f"--node-name={layout.name}",
        f"--kubeconfig={layout.cluster.admin_kubeconfig}",
        f"--nvidia-driver-root={root}",
        f"--container-driver-root={root}",  # a host process: NVML and nvidia-smi are found there
        f"--cdi-root={CDI_ROOT}",
        f"--nvidia-cdi-hook-path={hook}",
        f"--namespace={NAMESPACE}",
    ]


def gpu_plugin_argv(binary: Path, layout: NodeLayout, hook: Path) -> list[str]:
    # --image-name is used only for the MPS control daemon's pods (MPS is off): any name does.
    return [str(binary), *_common(layout, hook), "--image-name=localhost/mokka/nvidia-dra:unused"]


def compute_domain_plugin_argv(binary: Path, layout: NodeLayout, hook: Path) -> list[str]:
    return [str(binary), *_common(layout, hook)]


def env(layout: NodeLayout) -> dict[str, str]:
    """NVML on the library path (as in NVIDIA's pods), and the node's /proc/devices (the chart's
    ``altProcDevices``) instead of the host's."""
    out = {"LD_LIBRARY_PATH": str(layout.driver_root / "usr" / "lib64")}
    out["ALT_PROC_DEVICES_PATH"] = str(layout.driver_root / "proc" / "devices")
    return out


def crds() -> list[dict[str, Any]]:
    """NVIDIA's CustomResourceDefinitions (ComputeDomain, ComputeDomainClique), from its chart
    beside the binaries (``chart/crds``)."""
    src = source_dir()
    found = sorted((src / "chart" / "crds").glob("*.yaml")) if src else []
    if not found:
        raise NvidiaDraUnavailable(f"no chart/crds/*.yaml in {src} ({ENV_DIR}): NVIDIA's chart holds them")
    return [doc for path in found for doc in yaml.safe_load_all(path.read_text()) if doc]


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def device_classes() -> list[dict[str, Any]]:
    """NVIDIA's DeviceClasses (its chart's selectors): whole GPUs, the default IMEX channel, the
    ComputeDomain daemon's device."""

    def cls(name: str, expression: str) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    cd = f"device.attributes['{COMPUTE_DOMAIN_DRIVER}']"
    return [
        cls(GPU_DRIVER, f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'gpu'"),
        cls(
            "compute-domain-default-channel.nvidia.com",
            f"device.driver == '{COMPUTE_DOMAIN_DRIVER}' && {cd}.type == 'channel' && {cd}.id == 0",
        ),
        cls("compute-domain-daemon.nvidia.com", f"device.driver == '{COMPUTE_DOMAIN_DRIVER}' && {cd}.type == 'daemon'"),
    ]
