"""Karpenter's KWOK provider as the virtual pools' autoscaler (``--karpenter``,
:mod:`virtualfleet.karpenter`): its CRDs, a node class, one NodePool per virtual pool, and the
provider itself as one of the cluster's processes (a controller, as in its chart, without leader
election). It provisions KWOK nodes for pending GPU pods that select a pool; the fleet controller
(:mod:`.virtualpools`) decorates them as the pool's; consolidation removes them when their pods go."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fetch.kube import binaries, gobuild, versions
from virtualfleet import karpenter

from ..errors import ClusterError, api_errors
from . import virtualpools
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["Karpenter"]

# Karpenter's feature gates, each given (its binary reads only what it is told; the chart sets them all).
FEATURE_GATES = "StaticCapacity=false,SpotToSpotConsolidation=false,NodeRepair=false,CapacityBuffer=false,PodDeletionCostManagement=false"  # noqa: E501


class Karpenter(AddOn):
    """The add-on; needs the virtual pools up (it comes after :class:`.virtualpools.VirtualPools`)."""

    def __init__(self) -> None:
        self.built: Path | None = None

    def fetch(self, cache: Path | None) -> None:
        try:
            self.built = gobuild.build(binaries.KARPENTER, cache)
        except gobuild.BuildError as exc:
            raise ClusterError(f"--karpenter: {exc}") from None

    def up(self, ctx: Context, kit: Kit) -> None:
        assert self.built is not None, "fetch comes first"
        made = virtualpools.pools(ctx)
        with ctx.step(f"Karpenter {versions.KARPENTER}'s KWOK provider: a NodePool for each of {len(made)} pool(s)"):
            api = ctx.apiserver.client()
            with api_errors("Karpenter's API"):
                _install_crds(ctx, api, [*sorted((self.built / "crds").glob("*.yaml")),
                                         *sorted((self.built / "nodeclass-crds").glob("*.yaml"))])  # fmt: skip
            folder = ctx.layout.base / "karpenter"
            folder.mkdir(exist_ok=True)
            types = folder / "instance-types.json"
            types.write_text(
                json.dumps(karpenter.instance_types([(m.name, m.product, m.gpus) for m in made]), indent=1)
            )
            with api_errors("Karpenter's NodePools"):
                from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

                custom = client.CustomObjectsApi(api)
                custom.create_cluster_custom_object(
                    "karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", karpenter.NODE_CLASS, _preload_content=False
                )
                for m in made:
                    body = karpenter.node_pool(m.name)
                    custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", body, _preload_content=False)
            env = {
                "KUBECONFIG": str(ctx.layout.admin_kubeconfig),
                "SYSTEM_NAMESPACE": virtualpools.NAMESPACE,
                "KUBERNETES_MIN_VERSION": "1.19.0-0",
                "DISABLE_LEADER_ELECTION": "true",
                "INSTANCE_TYPES_FILE_PATH": str(types),
                "FEATURE_GATES": FEATURE_GATES,
                "METRICS_PORT": "0",  # any free port: nothing here scrapes it
                "HEALTH_PROBE_PORT": "0",
                "LOG_LEVEL": "info",
            }
            log = ctx.layout.logs / "karpenter.log"
            ctx.processes.spawn(ctx.processes.holder, "karpenter", [str(self.built / "kwok")], log, env=env)
            ctx.wait(
                f"every NodePool Ready (Karpenter's log: {log})",
                lambda: _pools_ready(custom, [m.name for m in made]),
                timeout=120,
                poll=0.5,
            )


def _install_crds(ctx: Context, api: Any, files: Sequence[Path]) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            try:
                ext.create_custom_resource_definition(doc, _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            names.append(doc["metadata"]["name"])

    ctx.wait(
        "Karpenter's CRDs established", lambda: all(ctx.apiserver.established(n) for n in names), timeout=60, poll=0.2
    )


def _pools_ready(custom: Any, names: Sequence[str]) -> bool:
    for name in names:
        raw = custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", name, _preload_content=False)
        conditions = json.loads(raw.data).get("status", {}).get("conditions") or []
        if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return False
    return True
