"""The GPU Operator as an add-on of the local cluster (``--gpu-operator``): its images built and
imported into every node, Mokka's NFD feature file on every node (as Mokka's chart writes it on a
real node), then ``helm install`` of its chart with the shipped values and the cluster's MIG
strategy. Up returns when the operator serves every node: the ClusterPolicy ready for the right
reason (``Reconciled``, not NFDLabelsMissing or NoGPUNodes), the validator's status files on every
node, every node's GPUs allocatable through the operator's device plugin and GFD's labels on it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from containers.cri.client import CriClient, CriError
from fetch import dcgm_exporter, debcache, gotool
from fetch import versions as tools
from fetch.kube import gpu_operator as build
from fetch.kube import versions
from virtualfleet.pool import real_nodes_affinity

from ...errors import ClusterError
from ..base import AddOn, Kit
from ..device_plugin import wait_allocatable
from ..nfd import write_feature_file
from . import (
    NAMESPACE,
    RELEASE,
    VALIDATIONS,
    VALUES,
    GpuOperatorUnavailable,
    image_names,
    images,
    mig_manager,
    operator,
    values,
)

if TYPE_CHECKING:
    from ...context import Context
    from ...node import Node

__all__ = [
    "TOOLKIT_SETTINGS",
    "GpuOperator",
    "cluster_policy",
    "import_images",
    "install",
    "missing",
    "policy_ready",
    "served",
    "toolkit_applied",
    "unready",
    "upgrade",
    "validations",
]

POLICY = "cluster-policy"  # the ClusterPolicy the chart creates
INSTALL_TO_READY = "gpu-operator: helm install -> every operand Ready, ClusterPolicy Reconciled"
GFD_LABEL = "nvidia.com/gpu.product"
MIG_MANAGER_LABEL = "nvidia.com/gpu.deploy.mig-manager"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
# The clients the MIG manager pauses for a change and starts again after it (it leaves nvsm paused).
RESTARTED_LABELS = tuple(
    f"nvidia.com/gpu.deploy.{c}" for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm")
)
READY_TIMEOUT = 300
# The toolkit operand on (``--container-toolkit``), in CDI mode: its runtime injects the devices of
# NVIDIA_VISIBLE_DEVICES from the CDI spec nvidia-ctk writes (the legacy mode needs
# libnvidia-container, which no source here builds).
TOOLKIT_SETTINGS = {"toolkit.enabled": "true", "cdi.enabled": "true", "cdi.default": "true"}


class GpuOperator(AddOn):
    def __init__(self, mig_strategy: str, toolkit: bool = False) -> None:
        self.mig_strategy = mig_strategy
        self.toolkit = toolkit
        self.helm: Path | None = None
        self.built: build.Operator | None = None

    def check(self, cache: Path) -> None:
        try:
            mig_manager(cache)
            image_names(values())
            dcgm_exporter.binary(cache / "dcgm-exporter")
        except GpuOperatorUnavailable as exc:
            raise ClusterError(str(exc)) from None
        except dcgm_exporter.ExporterMissing as exc:
            raise ClusterError(f"--gpu-operator: dcgm-exporter: {exc}") from None

    def fetch(self, cache: Path | None) -> None:
        self.helm = gotool.build(tools.HELM, cache) / "helm"
        self.built = build.ensure(cache)
        try:
            self.built = operator(self.built, cache or debcache.default_cache())
        except GpuOperatorUnavailable as exc:
            raise ClusterError(str(exc)) from None

    def up(self, ctx: Context, kit: Kit) -> None:
        assert self.helm is not None and self.built is not None, "fetch comes first"
        cache = ctx.cache or debcache.default_cache()
        with ctx.step(f"GPU Operator {versions.GPU_OPERATOR_RELEASE}: its images on every node"):
            inputs = images.Inputs(
                operator=self.built.operator,
                nfd=self.built.nfd,
                device_plugin=self.built.device_plugin,
                kubectl=kit.bins["kubectl"],
                nvidia_smi=kit.nvidia_smi,
                mig_manager=mig_manager(cache),
                cache=cache,
                toolkit=self.built.toolkit,
            )
            import_images(ctx, inputs)
            ctx.each("NFD feature file", lambda n: write_feature_file(ctx, n))
        t0 = time.monotonic()
        toolkit = ", the container toolkit operand" if self.toolkit else ""
        with ctx.step(f"GPU Operator: helm install (values {VALUES.name}, mig.strategy={self.mig_strategy}{toolkit})"):
            install(ctx, self.helm, self.built.chart, self.mig_strategy, toolkit=self.toolkit)
        with ctx.step("GPU Operator: NFD's and GFD's labels, the operands Ready, ClusterPolicy ready (Reconciled)"):
            served(ctx, self.mig_strategy, t0, toolkit=self.toolkit)


def import_images(ctx: Context, inputs: images.Inputs) -> None:
    """Every image the shipped values name, built and imported into every node."""
    try:
        for tarball in images.build_all(inputs, image_names(values()), ctx.layout.images):
            ctx.import_image(tarball)
            tarball.unlink()
    except (images.ImageError, GpuOperatorUnavailable) as exc:
        raise ClusterError(f"--gpu-operator: {exc}") from None


def served(ctx: Context, mig_strategy: str, since: float, toolkit: bool = False) -> None:
    """Wait until the operator serves every real node (see the module); the time from ``since``
    (the install) to the policy's ready is kept in the cluster's timings. With ``toolkit``, also
    until every node's containerd runs the toolkit operand's configuration: the operand has no
    readiness probe, so the policy can be ready before it has restarted containerd."""
    # GFD writes its labels into features.d; NFD's worker takes them up on its next pass (a
    # minute); a MIG-capable product then brings the MIG manager.
    ctx.wait_each("GFD's labels (through NFD)", lambda n: GFD_LABEL in n.labels(), timeout=READY_TIMEOUT)
    ctx.wait_each("the operator's labels", lambda n: labelled(n.labels()), timeout=READY_TIMEOUT)
    ctx.wait("every operand Ready", lambda: not unready(ctx), timeout=READY_TIMEOUT)
    ctx.wait("ClusterPolicy ready, reason Reconciled", lambda: policy_ready(ctx), timeout=READY_TIMEOUT)
    ctx.state.timings[INSTALL_TO_READY] = round(time.monotonic() - since, 2)
    ctx.wait_each("the validator's status files", lambda n: not missing(n), timeout=READY_TIMEOUT)
    wait_allocatable(ctx, mig_strategy, "allocatable GPUs (the operator's device plugin)", timeout=READY_TIMEOUT)
    if toolkit:
        what = "containerd started again with the toolkit operand's configuration"
        ctx.wait_each(what, toolkit_applied, timeout=READY_TIMEOUT)


def install(ctx: Context, helm: Path, chart: Path, mig_strategy: str, toolkit: bool = False) -> None:
    """``helm install`` of ``chart`` with the shipped values and ``mig.strategy`` (and with
    ``toolkit``, :data:`TOOLKIT_SETTINGS`); on a cluster with virtual nodes also
    :func:`off_virtual_nodes` (written to ``DIR/gpu-operator-values.yaml``)."""
    args = ["--create-namespace", "-f", str(VALUES), "--set", f"mig.strategy={mig_strategy}"]
    if toolkit:
        args += ["--set", ",".join(f"{k}={v}" for k, v in TOOLKIT_SETTINGS.items())]
    if ctx.state.virtual:
        extra = ctx.layout.base / "gpu-operator-values.yaml"
        extra.write_text(yaml.safe_dump(off_virtual_nodes(), sort_keys=False))
        args += ["-f", str(extra)]
    _helm(ctx, helm, "install", chart, *args)


def off_virtual_nodes() -> dict[str, Any]:
    """Values that keep the operator and NFD's master and garbage collector (Deployments, which
    must really run) off KWOK's nodes, whose pods only seem to run; the operator's DaemonSets
    and NFD's workers still go there, as onto any GPU node."""
    real = real_nodes_affinity()
    nfd = {"master": {"affinity": real}, "gc": {"affinity": real}}
    return {"operator": {"affinity": real}, "node-feature-discovery": nfd}


def upgrade(
    ctx: Context, helm: Path, chart: Path, settings: dict[str, str], files: dict[str, Path] | None = None
) -> None:
    """``helm upgrade`` of the release to ``chart`` with the values it has, ``settings``
    (``--set key=value`` each) and ``files`` (``--set-file key=path``: a value that is a file's
    text); its hooks run (the operator's CRD upgrade Job)."""
    args = [f"--set={k}={v}" for k, v in settings.items()]
    args += [f"--set-file={k}={path}" for k, path in (files or {}).items()]
    _helm(ctx, helm, "upgrade", chart, "--reuse-values", *args)


def _helm(ctx: Context, helm: Path, verb: str, chart: Path, *args: str) -> None:
    argv = [str(helm), verb, RELEASE, str(chart), "--namespace", NAMESPACE, "--kubeconfig"]
    argv += [str(ctx.layout.admin_kubeconfig), *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if res.returncode != 0:
        raise ClusterError(f"helm {verb} {chart}: {' '.join(res.stderr.split())[:400]}")


def labelled(labels: dict[str, str]) -> bool:
    """The operator has labelled a GPU node for its operands, and where GFD says the GPUs are
    MIG-capable the MIG manager has run once (it applies the default layout at start, pausing
    the node's GPU clients meanwhile) and says how it went."""
    if labels.get("nvidia.com/gpu.present") != "true":
        return False
    if labels.get("nvidia.com/mig.capable") != "true":
        return True
    paused = [k for k in RESTARTED_LABELS if labels.get(k, "").startswith("paused")]
    return MIG_MANAGER_LABEL in labels and labels.get(MIG_STATE_LABEL) in ("success", "failed") and not paused


def unready(ctx: Context) -> list[str]:
    """The operator's DaemonSets (and the chart's) whose pods are not all scheduled and Ready."""
    items = ctx.apiserver.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets").get("items", [])
    late = []
    for ds in items:
        st = ds.get("status") or {}
        want = st.get("desiredNumberScheduled", 0)
        if st.get("numberReady", 0) != want or st.get("updatedNumberScheduled", 0) != want:
            late.append(ds["metadata"]["name"])
    return late


def cluster_policy(ctx: Context) -> dict[str, Any]:
    """The chart's ClusterPolicy as the API server has it."""
    return ctx.apiserver.get(f"/apis/nvidia.com/v1/clusterpolicies/{POLICY}")


def policy_ready(ctx: Context) -> bool:
    """``status.state`` ready, and its Ready condition's reason ``Reconciled``: the operator also
    says ready when no node is a GPU node (NoGPUNodes) or NFD labelled none (NFDLabelsMissing)."""
    try:
        status = cluster_policy(ctx).get("status") or {}
    except ClusterError:
        return False
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return status.get("state") == "ready" and bool(ready) and ready[0].get("reason") == "Reconciled"


def toolkit_applied(n: Node) -> bool:
    """containerd on ``n`` runs with the toolkit operand's ``nvidia`` runtime as its default: the
    operand writes the configuration file, then SIGHUPs containerd, which the node's supervisor
    starts again. Asked of containerd's CRI, since the file alone says nothing of what it loaded."""
    try:
        with CriClient(n.layout.containerd_socket, timeout=5, cache=n.ctx.cache) as cri:
            config = cri.runtime_config()
    except CriError:
        return False
    return bool(config.get("containerd", {}).get("defaultRuntimeName") == "nvidia")


def validations(n: Node) -> Path:
    """The node's /run/nvidia/validations (its private directory)."""
    return n.layout.private("/run/nvidia") / "validations"


def missing(n: Node) -> list[str]:
    """The validator's status files not (yet) written on ``n``."""
    return [v for v in VALIDATIONS if not (validations(n) / f"{v}-ready").is_file()]
