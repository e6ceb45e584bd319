"""The VirtualGPUPool API (``mokka.io/v1alpha1``): its CustomResourceDefinition, written here once.

The chart ships it as ``templates/fleet-crd.yaml``, generated from :func:`definition` by
``charts/mokka/update-generated.py`` (a test fails when they drift); ``mokka cluster up --virtual``
applies :func:`definition` itself. Both therefore offer the same fields and the same validation:
the built-in profiles and their GPUs per node come from :mod:`gpumodel.profile`.

Choices are CEL rules, not enums: a value outside an enum stops the API server before the rules
run, and kubectl then prints a second line ("some validation rules were not checked"); a rule's
message is one line.
"""

from __future__ import annotations

from typing import Any

from gpumodel import profile as profiles

__all__ = ["GROUP", "KIND", "NAME", "PLURAL", "VERSION", "definition", "rack_size_rule"]

GROUP, VERSION, KIND, PLURAL = "mokka.io", "v1alpha1", "VirtualGPUPool", "virtualgpupools"
NAME = f"{PLURAL}.{GROUP}"
DEFAULT_MAX_REPLICAS = 100000

Json = dict[str, Any]


def _choice(values: list[str], message: str) -> list[Json]:
    listed = ", ".join(f"'{v}'" for v in values)
    return [{"rule": f"self in [{listed}]", "message": message}]


def rack_size_rule(gpus: dict[str, int]) -> str:
    """CEL: ``spec.rackSize`` is a multiple of the GPUs per node (``spec.gpusPerNode``, else the
    built-in profile's, else 1: a ConfigMap profile's count is checked by the controller)."""
    table = "{" + ", ".join(f"'{n}': {g}" for n, g in gpus.items()) + "}"
    builtin = f"has(self.profile) && self.profile in {table} ? {table}[self.profile] : 1"
    per_node = f"has(self.gpusPerNode) ? self.gpusPerNode : {builtin}"
    return f"!has(self.rackSize) || self.rackSize % ({per_node}) == 0"


def _spec(names: list[str], gpus: dict[str, int], max_replicas: int) -> Json:
    listed = ", ".join(names)
    return {
        "type": "object",
        "x-kubernetes-validations": [
            {
                "rule": "has(self.profile) != has(self.profileConfigMap)",
                "message": "give exactly one of spec.profile (a built-in profile) and spec.profileConfigMap "
                "(a profile of your own)",
            },
            {
                "rule": rack_size_rule(gpus),
                "message": "spec.rackSize (GPUs in one NVLink domain) must be a whole number of nodes, a multiple "
                "of the GPUs per node (spec.gpusPerNode, else the profile's)",
                "fieldPath": ".rackSize",
            },
        ],
        "properties": {
            "profile": {
                "type": "string",
                "maxLength": 63,
                "description": f"A built-in profile ({listed}).",
                "x-kubernetes-validations": _choice(
                    names, f"not a built-in profile ({listed}); a profile of your own goes in spec.profileConfigMap"
                ),
            },
            "profileConfigMap": {
                "type": "object",
                "description": "A profile of your own (`mokka profile import` writes one) in a ConfigMap.",
                "required": ["name", "namespace"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "namespace": {"type": "string", "minLength": 1},
                    "key": {"type": "string", "default": "profile.yaml", "description": "The key holding the profile."},
                },
            },
            "gpusPerNode": {
                "type": "integer",
                "minimum": 1,
                "maximum": 16,
                "description": "GPUs on each node; default the profile's (the server a user means by its name).",
            },
            "replicas": {
                "type": "integer",
                "minimum": 0,
                "maximum": max_replicas,
                "default": 1,
                "description": "Nodes in the pool (the scale subresource's).",
            },
            "rackSize": {
                "type": "integer",
                "minimum": 1,
                "maximum": 576,
                "description": "GPUs in one NVLink domain (72 for an NVL72 rack); the pool's nodes fill racks in "
                "order and each node's nvidia.com/gpu.clique names its rack. Default the profile's (72 for a board "
                "built into racks, none otherwise).",
            },
            "allocator": {
                "type": "string",
                "maxLength": 16,
                "default": "device-plugin",
                "x-kubernetes-validations": _choice(["device-plugin", "dra"], "must be device-plugin or dra"),
                "description": "How the GPUs are advertised, nvidia.com/gpu resources (device plugin) or a "
                "ResourceSlice (DRA, driver gpu.nvidia.com).",
            },
            "migStrategy": {
                "type": "string",
                "maxLength": 16,
                "default": "none",
                "x-kubernetes-validations": _choice(["none", "single", "mixed"], "must be none, single or mixed"),
                "description": "GFD's and the device plugin's MIG strategy.",
            },
            "labels": {
                "type": "object",
                "description": "Extra labels on every node (never the ones the profile sets).",
                "additionalProperties": {"type": "string"},
            },
            "taints": {
                "type": "array",
                "description": "Taints on every node.",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "required": ["key", "effect"],
                    "properties": {
                        "key": {"type": "string", "minLength": 1, "maxLength": 316},
                        "value": {"type": "string", "maxLength": 63},
                        "effect": {
                            "type": "string",
                            "maxLength": 16,
                            "x-kubernetes-validations": _choice(
                                ["NoSchedule", "PreferNoSchedule", "NoExecute"],
                                "must be NoSchedule, PreferNoSchedule or NoExecute",
                            ),
                        },
                    },
                },
            },
        },
    }


STATUS: Json = {
    "type": "object",
    "properties": {
        "observedGeneration": {"type": "integer"},
        "replicas": {"type": "integer", "description": "Nodes that exist."},
        "readyReplicas": {"type": "integer", "description": "Nodes Ready with their GPUs allocatable."},
        "adoptedNodes": {
            "type": "integer",
            "description": "Nodes someone else made (a user, an autoscaler's KWOK provider) with the label "
            "mokka.io/virtual-pool=<pool>, decorated by the pool; not among its replicas.",
        },
        "gpusPerNode": {"type": "integer"},
        "allocatableGPUs": {"type": "integer"},
        "racks": {"type": "integer"},
        "selector": {
            "type": "string",
            "description": "The label selector of the pool's nodes (the scale subresource's).",
        },
        "conditions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "observedGeneration": {"type": "integer"},
                },
            },
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    },
}

COLUMNS = [
    {"name": "Profile", "type": "string", "jsonPath": ".spec.profile"},
    {"name": "GPUs/node", "type": "integer", "jsonPath": ".status.gpusPerNode"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {
        "name": "Allocatable",
        "type": "integer",
        "jsonPath": ".status.allocatableGPUs",
        "description": "GPUs allocatable over the pool's nodes",
    },
    {"name": "Racks", "type": "integer", "jsonPath": ".status.racks", "priority": 1},
    {"name": "Adopted", "type": "integer", "jsonPath": ".status.adoptedNodes", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def definition(max_replicas: int = DEFAULT_MAX_REPLICAS, labels: dict[str, str] | None = None) -> Json:
    """The CustomResourceDefinition; a pool holds at most ``max_replicas`` nodes."""
    names = profiles.builtin_names()
    gpus = {n: profiles.load(n).gpu_count for n in names}
    schema = {
        "description": "A pool of virtual GPU nodes: Node objects without a kubelet (KWOK keeps them Ready) that "
        "carry what a real node of the profile carries (GFD's and NFD's labels, GPUs as the device plugin or the "
        "DRA driver advertises them, the NVLink clique of their rack), made and kept by Mokka's fleet controller. "
        "Named virtual-<pool>-<i>.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    # virtual-<pool>-<index> (and its rack names) stay a valid node name
                    "name": {"type": "string", "maxLength": 40, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                },
            },
            "spec": _spec(names, gpus, max_replicas),
            "status": STATUS,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": NAME,
            "labels": dict(labels or {"app.kubernetes.io/part-of": "mokka"}),
            # Deleting the definition deletes every pool, and the controller then every virtual node.
            "annotations": {"helm.sh/resource-policy": "keep"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["vgp"],
                "categories": ["mokka"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        # `kubectl scale virtualgpupool/<name> --replicas=N` (and autoscalers) change spec.replicas.
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": COLUMNS,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
