"""NVIDIA's DRA driver for GPUs on the local cluster (``mokka cluster up --allocator nvidia-dra``),
installed as NVIDIA installs it: its own Helm chart, rendered by helm and applied unchanged, its
pods running the driver's image built here (:mod:`.image`) from the user's binaries.

- The kubelet-plugin DaemonSet runs ``gpu-kubelet-plugin`` (driver ``gpu.nvidia.com``: the GPUs as
  ResourceSlices with NVIDIA's attributes, NVIDIA's CDI specs) and ``compute-domain-kubelet-plugin``
  (``compute-domain.nvidia.com``: the IMEX channels and the daemon device, from the IMEX surface
  host setup staged) on every real node.
- The controller Deployment turns each ComputeDomain into a DaemonSet of IMEX daemons (the same
  image's ``compute-domain-daemon``, driving the node's mock ``nvidia-imex``) and the claim
  templates of its daemons and workloads.
- The chart's CRDs, DeviceClasses, RBAC and admission policy come with it.

What the mock node gives the chart (:func:`values`): every node's driver root at one path,
:data:`DRIVER_ROOT` (the staged node is at /var/lib/mokka in each node's namespace, where Mokka's
chart stages it on a real node; its ``driver`` holds ``usr``, ``dev`` and ``proc``, as a driver
container's root does), its ``/proc/devices`` as ``altProcDevices`` (never the host's), and NFD's
PCI labels on the node (NFD itself runs: :mod:`..nfd`), which the chart's node affinity asks for. The cluster
runs no device plugin beside it, which the chart wants said (``gpuResourcesEnabledOverride``).

NVIDIA's binaries and chart come from its repository (no registry serves them):
``$MOKKA_NVIDIA_DRA_DIR`` names a directory holding the four programs (plain or ``.xz``) and
``chart/``, else the checkout's ``../shared/thirdparty/k8s-dra-driver-gpu``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fetch import thirdparty

from ...layout import MOKKA_ROOT
from . import image

ENV_DIR = "MOKKA_NVIDIA_DRA_DIR"
NAMESPACE = "nvidia-dra-driver-gpu"  # the chart's usual release namespace
RELEASE = "nvidia-dra"
GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
DRIVER_ROOT = f"{MOKKA_ROOT}/driver"  # the staged node's driver root, as Mokka's chart stages it
COMPONENT = "nvidia-dra-driver-gpu-component"  # the chart's pod label: controller | kubelet-plugin
DAEMON_LABEL = "resource.nvidia.com/computeDomain"  # the controller's label on a domain's daemons


class NvidiaDraUnavailable(RuntimeError):
    """NVIDIA's DRA driver is not where it was looked for, or its chart does not render; the message
    says which."""


@dataclass(frozen=True)
class Brought:
    """What the user brought: NVIDIA's programs (unpacked) and its chart."""

    programs: dict[str, Path]
    chart: Path


def source_dir() -> Path | None:
    return thirdparty.directory(ENV_DIR, "k8s-dra-driver-gpu")


def find(cache: Path) -> Brought:
    """NVIDIA's programs (unpacked into ``cache`` once) and chart."""
    src = source_dir()
    if src is None:
        raise NvidiaDraUnavailable(
            f"--allocator nvidia-dra needs NVIDIA's DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu): "
            f"set {ENV_DIR} to a directory holding {', '.join(image.PROGRAMS)} and its chart/"
        )
    if not (src / "chart" / "Chart.yaml").is_file():
        raise NvidiaDraUnavailable(f"{ENV_DIR}={src}: no chart/Chart.yaml (NVIDIA's Helm chart belongs there)")
    try:
        programs = thirdparty.unpacked(src, image.PROGRAMS, cache / "nvidia-dra")
    except thirdparty.Missing as exc:
        raise NvidiaDraUnavailable(f"{ENV_DIR}={src}: {exc}") from None
    return Brought(programs, src / "chart")


def values() -> dict[str, Any]:
    """The chart's values for mock nodes (see the module's docstring)."""
    return {
        "nvidiaDriverRoot": DRIVER_ROOT,
        "altProcDevices": f"{DRIVER_ROOT}/proc/devices",
        "gpuResourcesEnabledOverride": True,
    }


def render(helm: Path, chart: Path, kube_version: str, out: Path) -> str:
    """NVIDIA's chart rendered by helm for this cluster (its Kubernetes version, DRA's v1 API) with
    :func:`values`, its CRDs included; the values file is written to ``out``."""
    out.write_text(yaml.safe_dump(values(), sort_keys=False))
    argv = [str(helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--include-crds"]
    argv += ["--kube-version", kube_version.lstrip("v"), "--api-versions", "resource.k8s.io/v1", "-f", str(out)]
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        why = " ".join(res.stderr.split())[:400]
        raise NvidiaDraUnavailable(f"helm template {chart}: {why}")
    return res.stdout


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def compute_domain(name: str, num_nodes: int, template: str, namespace: str = "default") -> dict[str, Any]:
    """A ComputeDomain of ``num_nodes`` nodes whose workloads claim a channel through the
    ResourceClaimTemplate ``template`` (made by NVIDIA's controller)."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": template}}},
    }
