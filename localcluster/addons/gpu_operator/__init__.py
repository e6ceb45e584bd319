"""NVIDIA's GPU Operator on the local cluster (``mokka cluster up --gpu-operator``), installed as
its users install it: ``helm install`` of its own chart with the values file Mokka ships
(:data:`VALUES`, every key that differs from the chart's default with its reason), the operator
then deploying its operands (NFD through the chart, the validator, NVIDIA's device plugin and GFD,
dcgm-exporter, the MIG manager) onto the nodes NFD labels as GPU nodes. Mokka's host setup is the
pre-installed driver; Mokka's ``nvidia`` runtime handler and NRI plugin serve the operator's
``runtimeClassName: nvidia`` pods, or, with ``--container-toolkit``, NVIDIA's container toolkit
operand installs its own runtime as that handler (:data:`.install.TOOLKIT_SETTINGS`).

What the operator and its chart need and no registry serves is built here: the operator, the
validator, NFD, the device plugin and GFD, the container toolkit from the Go module proxy
(:mod:`fetch.kube.gpu_operator`, :mod:`fetch.kube.binaries`); dcgm-exporter and NVIDIA's MIG
manager from the user's builds (``$MOKKA_DCGM_DIR``, :data:`MIG_PARTED_ENV`, else beside a checkout
in ``../shared/thirdparty``).
A user's own operator (another release, a branch) replaces the built one where :data:`OPERATOR_ENV`
names it (:func:`operator`).
:mod:`.images` makes their images; :mod:`.install` brings it up and says when it serves.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from fetch import thirdparty
from fetch.kube import gpu_operator as build

__all__ = [
    "MIG_PARTED_ENV",
    "NAMESPACE",
    "OPERATOR_ENV",
    "RELEASE",
    "VALUES",
    "GpuOperatorUnavailable",
    "image_names",
    "mig_manager",
    "operator",
    "values",
]

NAMESPACE = "gpu-operator"  # the chart's usual release namespace
RELEASE = "gpu-operator"
VALUES = Path(__file__).resolve().parent / "values.yaml"
MIG_PARTED_ENV = "MOKKA_MIG_PARTED_DIR"
OPERATOR_ENV = "MOKKA_GPU_OPERATOR_DIR"  # a user's own GPU Operator (chart and programs)
OPERATOR_PROGRAMS = ("gpu-operator", "validator")
WORKLOAD_MANIFESTS = ("cuda-workload-validation.yaml", "plugin-workload-validation.yaml")
MIG_PROGRAMS = ("nvidia-mig-manager", "nvidia-mig-parted")
MIG_SCRIPT = "reconfigure-mig.sh"  # the manager runs it for every change of nvidia.com/mig.config
# The images the values pin (values key; gfd runs the device plugin's image).
IMAGE_KEYS = (
    "operator", "validator", "devicePlugin", "gfd", "dcgmExporter", "migManager", "node-feature-discovery", "toolkit",
)  # fmt: skip
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


def operator(built: build.Operator, cache: Path) -> build.Operator:
    """The operator to run: the one built from the Go module proxy, or the user's own where
    :data:`OPERATOR_ENV` names its directory (its ``chart/``, ``assets/`` and ``manifests/``, the
    programs ``gpu-operator`` and ``validator``, plain or ``.xz``, and optionally the validator's
    workload manifests) — the same shipped values, the same operands, only the operator changes.
    The user's pieces are gathered in the cache under the build's names."""
    src = os.environ.get(OPERATOR_ENV)
    if not src:
        return built
    root = Path(src)
    missing = [d for d in ("chart/Chart.yaml", "assets", "manifests/state-driver") if not (root / d).exists()]
    if missing:
        raise GpuOperatorUnavailable(
            f"{OPERATOR_ENV}={root}: no {missing[0]} (the operator's chart/ is its deployments/gpu-operator; "
            "assets/ and manifests/ are the operator's own)"
        )
    try:
        programs = thirdparty.unpacked(root, OPERATOR_PROGRAMS, cache / "gpu-operator-user")
    except thirdparty.Missing as exc:
        raise GpuOperatorUnavailable(f"{OPERATOR_ENV}={root}: {exc}") from None
    gathered = programs[OPERATOR_PROGRAMS[0]].parent
    for other in gathered.parent.iterdir():  # one user's operator at a time: earlier ones go
        if other != gathered and not other.name.startswith("."):
            shutil.rmtree(other, ignore_errors=True)
    for name in ("chart", "assets", "manifests", *WORKLOAD_MANIFESTS):
        link = gathered / name
        if link.is_symlink() or link.exists():
            link.unlink()
        source = root / name if (root / name).exists() else built.operator / name  # the manifests: optional
        link.symlink_to(source.absolute())
    return build.Operator(gathered, built.nfd, built.device_plugin, built.toolkit)


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
