"""NVIDIA's GPU Feature Discovery, one-shot on every real node against its mock NVML, its labels
applied to the Node (NFD's job on a real cluster); :func:`relabel` runs it again, as GFD's daemon
does every minute."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fetch.kube import binaries

from ..errors import ClusterError
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["Gfd", "relabel"]


class Gfd(AddOn):
    def __init__(self, mig_strategy: str) -> None:
        self.mig_strategy = mig_strategy

    def up(self, ctx: Context, kit: Kit) -> None:
        with ctx.step("GPU Feature Discovery (one-shot): node labels"):
            gfd, mig_strategy = kit.bins["gpu-feature-discovery"], self.mig_strategy
            ctx.each("GFD", lambda n: n.label(n.run_gfd(gfd, mig_strategy)))


def relabel(ctx: Context) -> dict[str, dict[str, str]]:
    """GFD one-shot again on every node, its labels applied; each node's labels."""
    bins = binaries.cached(ctx.cache)
    if bins is None:
        raise ClusterError("GFD is not in the cache (mokka cluster up builds it)")
    mig_strategy = str(ctx.options.get("mig_strategy", "none"))
    out = {}
    for n in ctx.nodes:
        labels = n.run_gfd(bins["gpu-feature-discovery"], mig_strategy)
        n.label(labels)
        out[n.name] = labels
    return out
