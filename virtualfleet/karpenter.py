"""Karpenter's KWOK provider (sigs.k8s.io/karpenter ``kwok/``) as the virtual pools' autoscaler: one
GPU instance type and one NodePool per pool, so that a pending GPU pod that selects a pool (its
``mokka.io/virtual-pool`` label, or the GPU product) gets a node of that pool's profile, and
consolidation removes the node once its pods are gone.

Karpenter makes a bare KWOK node (``kwok.x-k8s.io/node=fake``) carrying the pool's label and the
instance type's GPU count; the fleet controller decorates it like any node labelled with the pool
(GFD's labels, its GPUs, the rack's clique: :func:`virtualfleet.pool.split`), and never deletes it.

- :func:`instance_types`: the provider's instance-types file (``INSTANCE_TYPES_FILE_PATH``): the
  pool's GPUs as ``nvidia.com/gpu``, KWOK's own node size for the rest, one on-demand offering
  whose requirements name the pool and the GPU product (single-value requirements become the
  node's labels and keys a pod may select on);
- :func:`node_pool` and :data:`NODE_CLASS`: the objects that point Karpenter at them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .pool import NODE_RESOURCES, POOL_LABEL

__all__ = ["NODE_CLASS", "PRODUCT_LABEL", "ZONE", "instance_type", "instance_types", "node_pool"]

Json = dict[str, Any]

ZONE = "mokka-zone-a"  # every offering's (KWOK knows no zones)
PRODUCT_LABEL = "nvidia.com/gpu.product"
PRICE_PER_GPU = 1.0  # the fewest GPUs that fit are the cheapest: Karpenter's choice among pools
NODE_CLASS: Json = {
    "apiVersion": "karpenter.kwok.sh/v1alpha1",
    "kind": "KWOKNodeClass",
    "metadata": {"name": "mokka"},
}


def type_name(pool: str) -> str:
    return f"mokka-{pool}"


def instance_type(pool: str, product: str, gpus: int) -> Json:
    """Pool ``pool``'s instance type: ``gpus`` GPUs of ``product`` (its name as GFD labels it)."""
    requirements = {
        "topology.kubernetes.io/zone": ZONE,
        "karpenter.sh/capacity-type": "on-demand",
        POOL_LABEL: pool,
        PRODUCT_LABEL: product.replace(" ", "-"),
    }
    return {
        "name": type_name(pool),
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {**NODE_RESOURCES, "nvidia.com/gpu": str(gpus)},
        "offerings": [
            {
                "Price": PRICE_PER_GPU * gpus,
                "Available": True,
                "Requirements": [{"key": k, "operator": "In", "values": [v]} for k, v in requirements.items()],
            }
        ],
    }


def instance_types(pools: Sequence[tuple[str, str, int]]) -> list[Json]:
    """The instance-types file for pools ``(name, product, GPUs per node)``."""
    return [instance_type(*p) for p in pools]


def node_pool(pool: str, consolidate_after: str = "5s") -> Json:
    """The NodePool that provisions pool ``pool``'s nodes: its instance type only, the pool's label
    on every node, empty nodes removed ``consolidate_after`` after their last pod went."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool},
        "spec": {
            "template": {
                "metadata": {"labels": {POOL_LABEL: pool}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "mokka"},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [type_name(pool)]}
                    ],
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": consolidate_after,
                "budgets": [{"nodes": "100%"}],
            },
        },
    }
