"""NVIDIA's DRA driver as an add-on of the local cluster (``--allocator nvidia-dra``), and
:func:`install`, which puts it on any cluster whose nodes are staged at /var/lib/mokka (by ``up``,
or by Mokka's chart): its image built and imported into every node, its chart rendered with
:func:`~. values` and applied; returns when every node's GPUs and IMEX channels are in
ResourceSlices and its pods are Ready."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fetch import debcache, gotool
from fetch import versions as tools
from fetch.kube import versions

from ...errors import ClusterError
from ...nodewatch import ready
from ..base import AddOn, Kit
from . import (
    COMPONENT,
    COMPUTE_DOMAIN_DRIVER,
    GPU_DRIVER,
    NAMESPACE,
    NvidiaDraUnavailable,
    find,
    image,
    namespace,
    render,
)

if TYPE_CHECKING:
    from ...context import Context

__all__ = ["NvidiaDra", "install"]


class NvidiaDra(AddOn):
    def __init__(self) -> None:
        self.helm: Path | None = None

    def check(self, cache: Path) -> None:
        find(cache)  # NvidiaDraUnavailable says what is missing and where

    def fetch(self, cache: Path | None) -> None:
        self.helm = gotool.build(tools.HELM, cache) / "helm"  # renders NVIDIA's chart

    def up(self, ctx: Context, kit: Kit) -> None:
        """NVIDIA's driver, on nodes NFD has labelled (:mod:`..nfd` comes first: the chart's node
        affinity asks for NFD's PCI labels)."""
        assert self.helm is not None, "fetch comes first"
        with ctx.step("NVIDIA's DRA driver: its chart, the kubelet plugins on every node, the controller"):
            install(ctx, kit.bins["nvidia-cdi-hook"], self.helm, ctx.cache or debcache.default_cache())


def install(ctx: Context, hook: Path, helm: Path, cache: Path) -> None:
    """NVIDIA's DRA driver on the nodes of ``ctx`` (see the module); ``hook``: nvidia-cdi-hook;
    ``helm``: helm."""
    try:
        brought = find(cache)
        values = ctx.layout.base / "nvidia-dra-values.yaml"
        manifests = render(helm, brought.chart, versions.KUBERNETES, values)
        tarball = image.build(ctx.layout.images, brought.programs, hook, brought.chart, cache)
    except (NvidiaDraUnavailable, image.ImageError) as exc:
        raise ClusterError(str(exc)) from None
    ctx.import_image(tarball)
    tarball.unlink()
    ctx.apiserver.post("/api/v1/namespaces", namespace())
    ctx.apiserver.kubectl("apply", "--server-side", "-f", "-", input=manifests)
    ctx.wait_each("NVIDIA's GPU ResourceSlices", lambda n: n.slice_devices(GPU_DRIVER) >= n.gpus, timeout=120)
    ctx.wait_each("NVIDIA's IMEX channel ResourceSlices", lambda n: n.slice_devices(COMPUTE_DOMAIN_DRIVER) > 0)
    ctx.wait("NVIDIA's DRA driver pods Ready (the controller, a kubelet plugin per node)", lambda: _ready(ctx))


def _ready(ctx: Context) -> bool:
    pods = ctx.apiserver.get(f"/api/v1/namespaces/{NAMESPACE}/pods").get("items", [])
    components = [p["metadata"].get("labels", {}).get(COMPONENT) for p in pods if ready(p)]
    return components.count("kubelet-plugin") == len(ctx.nodes) and "controller" in components
