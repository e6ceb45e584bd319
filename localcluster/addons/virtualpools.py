"""The cluster's virtual pools, made the way a user makes them on any cluster: the VirtualGPUPool
API (:mod:`virtualfleet.crd`), Mokka's fleet controller (``mokka fleet-controller``, the chart's
controller, run here as one of the cluster's processes) and one VirtualGPUPool per ``--virtual``
pool; KWOK (:mod:`.kwok`) keeps the nodes Ready. Faults reach the nodes through the fault
ConfigMap the controller watches (:func:`write_fault`), as the chart's do.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fetch.kube import binaries, versions
from gpumodel import profile as profiles
from virtualfleet import crd, faults
from virtualfleet.pool import MAX_VIRTUAL, Pool, VirtualSpec, profile_for

from ..errors import ClusterError, api_errors
from ..processes import READY_TIMEOUT
from . import kwok
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["FAULTS", "NAMESPACE", "Made", "VirtualPools", "find", "pool_status", "pools", "read_fault", "write_fault"]

NAMESPACE = "mokka-system"  # the pools' profile ConfigMaps and the fault ConfigMap
FAULTS = "mokka-faults"  # the fault ConfigMap (one key per node, its value a scenario), as the chart's


@dataclass(frozen=True)
class Made:
    """A pool as ``up`` asked for it (the controller makes its nodes; their facts are the API's)."""

    name: str
    spec: str
    profile: str
    product: str
    gpus: int
    count: int

    @property
    def nodes(self) -> list[str]:
        return Pool.node_names(self.name, self.count)


class VirtualPools(AddOn):
    """The add-on: KWOK (also for FGO's nodes), and with pools the API, the controller and the pools."""

    def __init__(self, specs: tuple[VirtualSpec, ...], mig_strategy: str, dra: bool, nfd: bool = False) -> None:
        self.specs = specs
        self.mig_strategy = mig_strategy
        self.dra = dra
        self.nfd = nfd  # the cluster runs NFD: its nodes carry NFD's PCI labels, the virtual ones too

    def up(self, ctx: Context, kit: Kit) -> None:
        with ctx.step(f"KWOK {versions.KWOK}"):
            kwok.write_configuration(ctx.layout)
            argv = kwok.argv(kit.bins.kwok, ctx.layout, binaries.KWOK_STAGES)
            ctx.processes.spawn(ctx.processes.holder, "kwok", argv, ctx.layout.logs / "kwok.log")
        if not self.specs:
            return
        made = [_made(s) for s in self.specs]
        ctx.state.virtual = [asdict(m) for m in made]
        ctx.save()
        api = _apis(ctx)  # one client (and its connections) for the whole step
        with ctx.step("the VirtualGPUPool API and Mokka's fleet controller"), api_errors("the VirtualGPUPool API"):
            _install_api(ctx, api)
            ctx.processes.spawn(
                ctx.processes.holder,
                "fleet-controller",
                self._controller_argv(ctx, kit),
                ctx.layout.logs / "fleet-controller.log",
            )
        total = sum(m.count for m in made)
        with ctx.step(f"{total} virtual node(s) of {len(made)} pool(s) Ready with their GPUs"):
            t0 = time.monotonic()
            with api_errors("the virtual pools"):
                for spec in self.specs:
                    _create_pool(api, spec, self.mig_strategy, self.dra)
            ctx.wait(
                f"{total} virtual nodes Ready (the fleet controller's log: {ctx.layout.logs / 'fleet-controller.log'})",
                lambda: _all_ready(api, made),
                timeout=max(READY_TIMEOUT, total * 0.1),
                poll=0.5,
            )
            ctx.state.timings["virtual nodes created"] = round(time.monotonic() - t0, 2)

    def _controller_argv(self, ctx: Context, kit: Kit) -> list[str]:
        return [
            sys.executable, "-m", "mokka.cli", "fleet-controller",
            "--kubeconfig", str(ctx.layout.admin_kubeconfig),
            "--gfd", str(kit.bins["gpu-feature-discovery"]),
            "--workdir", str(ctx.layout.base / "fleet"),
            "--nfd-labels" if self.nfd else "--no-nfd-labels",
            "--no-leader-elect",
            "--metrics-port", "0",
            "--faults-configmap", f"{NAMESPACE}/{FAULTS}",
        ]  # fmt: skip


def _made(spec: VirtualSpec) -> Made:
    prof = profile_for(spec)
    return Made(spec.pool, str(spec), prof.name, prof.gpu.name, prof.gpu_count, spec.count)


def _apis(ctx: Context) -> Any:
    api = ctx.apiserver.client()
    api.configuration.connection_pool_maxsize = 4
    return api


def _install_api(ctx: Context, api: Any) -> None:
    """The VirtualGPUPool definition, Established; the namespace of the pools' ConfigMaps."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

    client.ApiextensionsV1Api(api).create_custom_resource_definition(
        crd.definition(MAX_VIRTUAL), _preload_content=False
    )
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)

    ctx.wait("the VirtualGPUPool API established", lambda: ctx.apiserver.established(crd.NAME), timeout=60, poll=0.2)


def _create_pool(api: Any, spec: VirtualSpec, mig_strategy: str, dra: bool) -> None:
    """Pool ``spec`` as a VirtualGPUPool; a profile file goes to a ConfigMap of its own."""
    from kubernetes import client

    body: dict[str, Any] = {"replicas": spec.count, "migStrategy": mig_strategy}
    if spec.profile in profiles.builtin_names():
        body["profile"] = spec.profile
    else:
        name = f"profile-{spec.pool}"
        data = {"profile.yaml": Path(spec.profile).read_text()}  # a profile file (load() read it already)
        client.CoreV1Api(api).create_namespaced_config_map(
            NAMESPACE, {"metadata": {"name": name}, "data": data}, _preload_content=False
        )
        body["profileConfigMap"] = {"name": name, "namespace": NAMESPACE}
    if spec.gpus:
        body["gpusPerNode"] = spec.gpus
    if dra:
        body["allocator"] = "dra"
    obj = {"apiVersion": f"{crd.GROUP}/{crd.VERSION}", "kind": crd.KIND, "metadata": {"name": spec.pool}, "spec": body}
    client.CustomObjectsApi(api).create_cluster_custom_object(
        crd.GROUP, crd.VERSION, crd.PLURAL, obj, _preload_content=False
    )


def _pool_objects(api: Any) -> dict[str, dict[str, Any]]:
    from kubernetes import client

    raw = client.CustomObjectsApi(api).list_cluster_custom_object(
        crd.GROUP, crd.VERSION, crd.PLURAL, _preload_content=False
    )
    return {o["metadata"]["name"]: o for o in json.loads(raw.data).get("items") or []}


def _all_ready(api: Any, made: Sequence[Made]) -> bool:
    objects = _pool_objects(api)
    for m in made:
        status = (objects.get(m.name) or {}).get("status") or {}
        conditions = status.get("conditions") or []
        failed = [c for c in conditions if c.get("reason") not in (None, "NodesReady", "NodesNotReady")]
        if failed:
            raise ClusterError(f"virtual pool {m.name}: {failed[0]['reason']}: {failed[0].get('message', '')}")
        if status.get("readyReplicas") != m.count or status.get("replicas") != m.count:
            return False
    return True


def pools(ctx: Context) -> list[Made]:
    """The cluster's virtual pools, as ``up`` asked for them."""
    return [Made(**p) for p in ctx.state.virtual]


def find(made: Sequence[Made], node: str) -> Made | None:
    return next((p for p in made if node in set(p.nodes)), None)


def pool_status(ctx: Context, made: Sequence[Made]) -> list[dict[str, Any]]:
    """Per pool, from its VirtualGPUPool's status: nodes, Ready, GPUs and allocatable GPUs."""
    objects = _pool_objects(_apis(ctx))
    out = []
    for p in made:
        status = (objects.get(p.name) or {}).get("status") or {}
        nodes = int(status.get("replicas", 0))
        out.append(
            {
                "pool": p.name,
                "spec": p.spec,
                "product": p.product,
                "nodes": nodes,
                "wanted": p.count,
                "ready": int(status.get("readyReplicas", 0)),
                "adopted": int(status.get("adoptedNodes", 0)),  # made elsewhere (Karpenter's), decorated
                "gpus": nodes * int(status.get("gpusPerNode", p.gpus)),
                "allocatable_gpus": int(status.get("allocatableGPUs", 0)),
            }
        )
    return out


def read_fault(ctx: Context, node: str) -> tuple[tuple[str, str] | None, str | None]:
    """Virtual node ``node``'s entries in the fault ConfigMap: its rack's (rack name, scenario text),
    which applies first, and its own (a scenario's text); None where there is none."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

    from virtualfleet.pool import RACK_LABEL

    core = client.CoreV1Api(_apis(ctx))
    entries = faults.read_entries(core, NAMESPACE, FAULTS)
    with api_errors(f"node {node}"):
        raw = json.loads(core.read_node(node, _preload_content=False).data)
    rack = raw["metadata"].get("labels", {}).get(RACK_LABEL)
    return ((rack, entries[rack]) if rack in entries else None), entries.get(node)


def write_fault(ctx: Context, node: str, entry: str | None, health: faults.Health) -> None:
    """Node ``node``'s fault entry set (None: removed); returns once the controller has remade the
    node showing ``health``, or raises a ClusterError naming what it waited for."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from virtualfleet.pool import shows

    core = client.CoreV1Api(_apis(ctx))
    with api_errors(f"the fault ConfigMap {NAMESPACE}/{FAULTS}"):
        try:
            core.patch_namespaced_config_map(FAULTS, NAMESPACE, {"data": {node: entry}}, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
            if entry is not None:  # the first entry makes the ConfigMap
                body = {"metadata": {"name": FAULTS}, "data": {node: entry}}
                core.create_namespaced_config_map(NAMESPACE, body, _preload_content=False)

    def applied() -> bool:
        return shows(json.loads(core.read_node(node, _preload_content=False).data), health)

    with api_errors(f"node {node}"):
        ctx.wait(f"the fleet controller to remake node {node} with its faults", applied, timeout=60, poll=0.2)
