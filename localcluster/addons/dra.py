"""Mokka's own DRA driver on every real node (``--allocator dra``: ``mokka dra-plugin``, speaking
the kubelet's plugin APIs from Python); up returns once every node's GPUs, and its InfiniBand
adapters where it has any, are in its ResourceSlices."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fetch import kubelet_api
from k8snode.dra import nics
from k8snode.dra.resources import DEFAULT_DRIVER, NIC_DRIVER

from .. import gpustack
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["MokkaDra"]


class MokkaDra(AddOn):
    def fetch(self, cache: Path | None) -> None:
        kubelet_api.generate(cache=cache)  # the kubelet plugin API bindings `mokka dra-plugin` speaks

    def up(self, ctx: Context, kit: Kit) -> None:
        with ctx.step("DRA driver (mokka dra-plugin): a ResourceSlice per node"):
            ctx.each("DRA driver", lambda n: n.spawn("dra-driver", gpustack.dra_driver_argv(n.layout) or []))
            ctx.wait_each("the DRA driver's ResourceSlice", lambda n: n.slice_devices(DEFAULT_DRIVER) == n.gpus)
            ctx.wait_each(
                "the adapters' ResourceSlice",
                lambda n: n.slice_devices(NIC_DRIVER) == len(nics.read(Path(n.layout.node_root) / "sys")),
            )
