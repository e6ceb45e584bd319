"""What NVIDIA's GPU Operator runs, built from the Go module proxy into the cache: the operator's
manager and validator with the operator's own assets, its Helm chart and the validator's workload
manifests (:data:`OPERATOR`), and NFD built as NFD's image builds it, reading the host under
``/host-`` where its pods mount it (:data:`NFD_IMAGE`), NVIDIA's device plugin and GFD at the
version the chart deploys (:data:`DEVICE_PLUGIN`), and NVIDIA's container toolkit
(:data:`TOOLKIT`). The images are made of these by
:mod:`localcluster.addons.gpu_operator.images`."""

from __future__ import annotations

from pathlib import Path

from fetch.kube import gobuild, versions

__all__ = [
    "DEVICE_PLUGIN",
    "GO_BUILDS",
    "NFD_IMAGE",
    "OPERATOR",
    "TOOLKIT",
    "TOOLKIT_INSTALLED",
    "Operator",
    "cached",
    "ensure",
]

_OPERATOR_MODULE = "github.com/NVIDIA/gpu-operator"

OPERATOR = gobuild.GoBuild(
    name="gpu-operator",
    module=_OPERATOR_MODULE,
    version=versions.GPU_OPERATOR,
    commands=(f"{_OPERATOR_MODULE}/cmd/gpu-operator", f"{_OPERATOR_MODULE}/validator"),
    ldflags=(f"-X {_OPERATOR_MODULE}/internal/info.version={versions.GPU_OPERATOR_RELEASE}",),
    files=(
        "assets",  # the operand manifests the operator reads at /opt/gpu-operator
        "manifests",  # the NVIDIADriver controller's (it refuses to start without them)
        ("deployments/gpu-operator", "chart"),  # the Helm chart, NFD's as a subchart
        "validator/cuda-workload-validation.yaml",
        "validator/plugin-workload-validation.yaml",
    ),
)

# NFD as its published image has it: master, worker and garbage collector, reading the host's
# /sys, /etc, /usr, ... under /host- (the chart mounts them there).
NFD_IMAGE = gobuild.GoBuild(
    name="node-feature-discovery-image",
    module="sigs.k8s.io/node-feature-discovery",
    version=versions.NFD,
    commands=tuple(f"sigs.k8s.io/node-feature-discovery/cmd/{c}" for c in ("nfd-master", "nfd-worker", "nfd-gc")),
    ldflags=(
        f"-X sigs.k8s.io/node-feature-discovery/pkg/version.version={versions.NFD}",
        "-X sigs.k8s.io/node-feature-discovery/pkg/utils/hostpath.pathPrefix=/host-",
    ),
    requires=(("sigs.k8s.io/node-feature-discovery/api/nfd", versions.NFD),),
)

# NVIDIA's device plugin and GFD at the version the operator's chart deploys (the cluster's own
# build, :data:`fetch.kube.binaries.DEVICE_PLUGIN`, is newer: what an upgrade of the operand moves to).
DEVICE_PLUGIN = gobuild.GoBuild(
    name="k8s-device-plugin",
    module="github.com/NVIDIA/k8s-device-plugin",
    version=versions.GPU_OPERATOR_DEVICE_PLUGIN,
    commands=(
        "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin",
        "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery",
    ),
    ldflags=(f"-X github.com/NVIDIA/k8s-device-plugin/internal/info.version={versions.GPU_OPERATOR_DEVICE_PLUGIN}",),
    cgo=True,  # go-nvml dlopens libnvidia-ml through cgo
    # GFD's NFD client: v0.15.7 is not served, its patch release v0.15.4 (the same API) is.
    replaces=(("sigs.k8s.io/node-feature-discovery", "v0.15.4"),),
)

_TOOLKIT_MODULE = "github.com/NVIDIA/nvidia-container-toolkit"

# NVIDIA's container toolkit as its installer image carries it: the installer (the operand's
# program, ``nvidia-toolkit``) and what it installs on the node -- nvidia-ctk, the CDI hook, the
# runtimes and the legacy hook. libnvidia-container (C, nvidia-container-cli) has no source here:
# the runtime runs in CDI mode, which does not use it.
TOOLKIT_INSTALLED = (  # what the installer installs on the node (its image's /usr/bin)
    "nvidia-ctk",
    "nvidia-cdi-hook",
    "nvidia-container-runtime",
    "nvidia-container-runtime.cdi",
    "nvidia-container-runtime.legacy",
    "nvidia-container-runtime-hook",
)
TOOLKIT = gobuild.GoBuild(
    name="nvidia-container-toolkit",
    module=_TOOLKIT_MODULE,
    version=versions.CONTAINER_TOOLKIT,
    commands=(
        f"{_TOOLKIT_MODULE}/tools/container/nvidia-toolkit",
        *(f"{_TOOLKIT_MODULE}/cmd/{c}" for c in TOOLKIT_INSTALLED),
    ),
    ldflags=(f"-X {_TOOLKIT_MODULE}/internal/info.version={versions.CONTAINER_TOOLKIT.lstrip('v')}",),
    cgo=True,  # nvidia-ctk's CDI generation loads the driver's NVML through go-nvml
)

GO_BUILDS = (OPERATOR, NFD_IMAGE, DEVICE_PLUGIN, TOOLKIT)


class Operator:
    """The built pieces: ``operator`` (gpu-operator, nvidia-validator, assets/, manifests/, the chart
    chart/, the workload manifests), ``nfd`` (nfd-master, nfd-worker, nfd-gc), ``device_plugin``
    (nvidia-device-plugin, gpu-feature-discovery at the chart's version) and ``toolkit`` (NVIDIA's
    container toolkit: the installer and what it installs)."""

    def __init__(self, operator: Path, nfd: Path, device_plugin: Path, toolkit: Path) -> None:
        self.operator = operator
        self.nfd = nfd
        self.device_plugin = device_plugin
        self.toolkit = toolkit

    @property
    def chart(self) -> Path:
        return self.operator / "chart"


def cached(cache: Path | None = None) -> Operator | None:
    built = [gobuild.cached(spec, cache) for spec in GO_BUILDS]
    return Operator(*built) if all(b is not None for b in built) else None  # type: ignore[arg-type]


def ensure(cache: Path | None = None, progress: gobuild.Progress = gobuild.stderr_progress) -> Operator:
    return Operator(*(gobuild.build(spec, cache, progress) for spec in GO_BUILDS))
