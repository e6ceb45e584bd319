"""NVIDIA's device plugin on every real node (``--allocator device-plugin``, the default): its
unmodified build against the node's mock NVML, registering with that node's kubelet; up returns
once every node advertises its profile's GPUs (or MIG devices) as allocatable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fetch.kube import versions
from k8snode import deviceplugin

from .. import gpustack
from ..processes import READY_TIMEOUT
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context
    from ..node import Node

__all__ = ["DevicePlugin", "wait_allocatable"]


class DevicePlugin(AddOn):
    def __init__(self, device_list_strategy: str, mig_strategy: str) -> None:
        self.device_list_strategy = device_list_strategy
        self.mig_strategy = mig_strategy

    def up(self, ctx: Context, kit: Kit) -> None:
        with ctx.step(f"NVIDIA device plugin {versions.DEVICE_PLUGIN} ({self.device_list_strategy})"):
            binary, hook = kit.bins["nvidia-device-plugin"], kit.bins["nvidia-cdi-hook"]
            strategy, mig_strategy = self.device_list_strategy, self.mig_strategy
            ctx.each(
                "device plugin",
                lambda n: n.spawn(
                    "nvidia-device-plugin",
                    gpustack.device_plugin_argv(binary, n.layout, strategy, hook, mig_strategy),
                    env=gpustack.nvml_env(n.layout),
                ),
            )
            wait_allocatable(ctx, mig_strategy)


def wait_allocatable(
    ctx: Context, mig_strategy: str, what: str = "allocatable GPUs", timeout: float = READY_TIMEOUT
) -> None:
    """Wait until every node advertises its profile's GPUs (or MIG devices) as allocatable."""
    wants = {n.name: deviceplugin.expected_allocatable(ctx.profiles[n.name], mig_strategy) for n in ctx.nodes}

    def advertised(n: Node) -> bool:
        return all(n.allocatable(k) == v for k, v in wants[n.name].items())

    ctx.wait_each(what, advertised, timeout=timeout)
