"""What NVIDIA's GPU Operator runs, built from the Go module proxy into the cache: the operator's
manager and validator with the operator's own assets, its Helm chart and the validator's workload
manifests (:data:`OPERATOR`), and NFD built as NFD's image builds it, reading the host under
``/host-`` where its pods mount it (:data:`NFD_IMAGE`). The images are made of these by
:mod:`localcluster.addons.gpu_operator.images`."""

from __future__ import annotations

from pathlib import Path

from fetch.kube import gobuild, versions

__all__ = ["GO_BUILDS", "NFD_IMAGE", "OPERATOR", "Operator", "cached", "ensure"]

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

GO_BUILDS = (OPERATOR, NFD_IMAGE)


class Operator:
    """The built pieces: ``operator`` (gpu-operator, nvidia-validator, assets/, manifests/, the chart
    chart/, the workload manifests) and ``nfd`` (nfd-master, nfd-worker, nfd-gc)."""

    def __init__(self, operator: Path, nfd: Path) -> None:
        self.operator = operator
        self.nfd = nfd

    @property
    def chart(self) -> Path:
        return self.operator / "chart"


def cached(cache: Path | None = None) -> Operator | None:
    op, nfd = (gobuild.cached(spec, cache) for spec in GO_BUILDS)
    return Operator(op, nfd) if op is not None and nfd is not None else None


def ensure(cache: Path | None = None, progress: gobuild.Progress = gobuild.stderr_progress) -> Operator:
    return Operator(gobuild.build(OPERATOR, cache, progress), gobuild.build(NFD_IMAGE, cache, progress))
