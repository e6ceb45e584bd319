"""NVIDIA's GPU Operator on the local cluster (``mokka cluster up --gpu-operator``), installed as
its users install it: ``helm install`` of its own chart with the values file Mokka ships
(:data:`VALUES`, every key that differs from the chart's default with its reason), the operator
then deploying its operands (NFD through the chart, the validator, NVIDIA's device plugin and GFD,
dcgm-exporter, the MIG manager) onto the nodes NFD labels as GPU nodes. Mokka's host setup is the
pre-installed driver; Mokka's ``nvidia`` runtime handler and NRI plugin serve the operator's
``runtimeClassName: nvidia`` pods (the container toolkit operand is off).

What the operator and its chart need and no registry serves is built here: the operator, the
validator, NFD, the device plugin and GFD from the Go module proxy (:mod:`fetch.kube.gpu_operator`,
:mod:`fetch.kube.binaries`); dcgm-exporter and NVIDIA's MIG manager from the user's builds
(``$MOKKA_DCGM_DIR``, :data:`MIG_PARTED_ENV`, else beside a checkout in ``../shared/thirdparty``).
:mod:`.images` makes their images; :mod:`.install` brings it up and says when it serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fetch import thirdparty

__all__ = [
    "MIG_PARTED_ENV",
    "NAMESPACE",
    "RELEASE",
    "VALUES",
    "GpuOperatorUnavailable",
    "image_names",
    "mig_manager",
    "values",
]

NAMESPACE = "gpu-operator"  # the chart's usual release namespace
RELEASE = "gpu-operator"
VALUES = Path(__file__).resolve().parent / "values.yaml"
MIG_PARTED_ENV = "MOKKA_MIG_PARTED_DIR"
MIG_PROGRAMS = ("nvidia-mig-manager", "nvidia-mig-parted")
MIG_SCRIPT = "reconfigure-mig.sh"  # the manager runs it for every change of nvidia.com/mig.config
# The images the values pin (values key; gfd runs the device plugin's image).
IMAGE_KEYS = ("operator", "validator", "devicePlugin", "gfd", "dcgmExporter", "migManager", "node-feature-discovery")
# The validator's status files, one per check (in each node's /run/nvidia/validations).
VALIDATIONS = ("driver", "toolkit", "cuda", "plugin")


class GpuOperatorUnavailable(RuntimeError):
    """Something the operator needs is missing; the message says what and where."""


def values() -> dict[str, Any]:
    """The shipped values (:data:`VALUES`)."""
    return yaml.safe_load(VALUES.read_text()) or {}


def image_names(vals: dict[str, Any]) -> dict[str, str]:
    """values key -> the image reference the chart and the operator make of ``vals`` (the
    operator's ``repository/image:version``; NFD's subchart ``repository:tag``)."""
    names: dict[str, str] = {}
    for key in IMAGE_KEYS:
        v = vals.get(key) or {}
        if key == "node-feature-discovery":
            image = v.get("image") or {}
            names[key] = f"{image['repository']}:{image['tag']}"
        else:
            names[key] = f"{v['repository']}/{v['image']}:{v['version']}"
    if names["gfd"] != names["devicePlugin"]:
        raise GpuOperatorUnavailable(f"{VALUES}: gfd and devicePlugin must name one image (NVIDIA's holds both)")
    return names


def mig_manager(cache: Path) -> dict[str, Path]:
    """NVIDIA's MIG manager, the user's build: the two programs (unpacked into ``cache`` once)
    and its reconfigure script."""
    src = thirdparty.directory(MIG_PARTED_ENV, "mig-parted")
    if src is None:
        raise GpuOperatorUnavailable(
            f"--gpu-operator needs NVIDIA's MIG manager (github.com/NVIDIA/mig-parted v0.12.3): set {MIG_PARTED_ENV} "
            f"to a directory holding {', '.join(MIG_PROGRAMS)} and {MIG_SCRIPT}"
        )
    if not (src / MIG_SCRIPT).is_file():
        raise GpuOperatorUnavailable(f"{MIG_PARTED_ENV}={src}: no {MIG_SCRIPT} (mig-parted's deployments/container/)")
    try:
        programs = thirdparty.unpacked(src, MIG_PROGRAMS, cache / "mig-parted")
    except thirdparty.Missing as exc:
        raise GpuOperatorUnavailable(f"{MIG_PARTED_ENV}={src}: {exc}") from None
    return {**programs, MIG_SCRIPT: src / MIG_SCRIPT}
