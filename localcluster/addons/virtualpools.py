"""The cluster's virtual pools (:mod:`.virtual`) against its API server: each pool computed once
from its staged profile, its nodes (and their ResourceSlices) created, counted, kept in step
with faults, and summarised for ``status``. KWOK (:mod:`.kwok`), which
:class:`VirtualPools` starts, does the rest.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fetch.kube import binaries, versions
from virtualfleet import pool as virtual
from virtualfleet import template
from virtualfleet.pool import Pool, VirtualSpec

from ..errors import ClusterError, api_errors
from ..nodewatch import NodeWatch, ready
from ..processes import READY_TIMEOUT
from . import kwok
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["VirtualPools", "apply_fault", "build", "create", "fault", "find", "pool_status", "pools", "watch"]


class VirtualPools(AddOn):
    """The add-on: the pools computed, then KWOK (also for FGO's nodes) and every pool's nodes."""

    def __init__(self, specs: tuple[VirtualSpec, ...], mig_strategy: str, dra: bool, nfd: bool = False) -> None:
        self.specs = specs
        self.mig_strategy = mig_strategy
        self.dra = dra
        self.nfd = nfd  # the cluster runs NFD: its nodes carry NFD's PCI labels, the virtual ones too

    def up(self, ctx: Context, kit: Kit) -> None:
        specs = self.specs
        made: list[Pool] = []
        if specs:
            with ctx.step(f"virtual pools computed ({', '.join(map(str, specs))}): GFD's labels, GPUs"):
                gfd = kit.bins["gpu-feature-discovery"]
                made = [build(ctx, s, gfd, self.mig_strategy, self.nfd, self.dra) for s in specs]
                ctx.state.virtual = [p.to_json() for p in made]
                ctx.save()
        total = sum(p.count for p in made)
        with ctx.step(f"KWOK {versions.KWOK}: {total} virtual node(s) Ready with their GPUs"):
            kwok.write_configuration(ctx.layout)
            argv = kwok.argv(kit.bins.kwok, ctx.layout, binaries.KWOK_STAGES)
            ctx.processes.spawn(ctx.processes.holder, "kwok", argv, ctx.layout.logs / "kwok.log")
            t0 = time.monotonic()
            with api_errors("virtual nodes"):
                create(ctx, made, dra=self.dra)
            ctx.state.timings["virtual nodes created"] = round(time.monotonic() - t0, 2)
            ctx.wait(f"{total} virtual nodes Ready", watch(ctx, made).poll, timeout=max(READY_TIMEOUT, total * 0.1))


def pools(ctx: Context) -> list[Pool]:
    """The cluster's virtual pools, as made at ``up`` (faults applied since)."""
    return [Pool(**p) for p in ctx.state.virtual]


def fault(ctx: Context, node: str, gpus: Sequence[int], reason: str | None) -> list[str]:
    """GPUs of virtual node ``node`` unhealthy for ``reason`` (None: healthy again); a note per GPU."""
    made = pools(ctx)
    pool = find(made, node)
    if pool is None:
        raise ClusterError(f"no virtual node {node!r} in this cluster")
    if bad := [i for i in gpus if not 0 <= i < pool.gpus]:
        raise ClusterError(f"node {node} has GPUs 0-{pool.gpus - 1}, not {bad[0]}")
    with api_errors(f"node {node}"):
        notes = apply_fault(ctx, pool, node, gpus, reason)
    ctx.state.virtual = [pool.to_json() if p.name == pool.name else p.to_json() for p in made]
    ctx.save()
    return notes


def build(
    ctx: Context, spec: VirtualSpec, gfd: Path, mig_strategy: str, with_nfd: bool = False, dra: bool = False
) -> Pool:
    """Pool ``spec`` from its template (:func:`virtualfleet.template.compute`: the profile staged,
    labelled by NVIDIA's GFD, read through NVML); GFD's output in ``logs/template-<pool>/gfd.log``.
    With ``with_nfd`` its nodes also carry the PCI labels NFD gives a real node of the profile."""
    prof = virtual.profile_for(spec)
    workdir = ctx.layout.node(f"template-{spec.pool}", 0).base
    try:
        made = template.compute(prof, spec.pool, gfd, workdir, mig_strategy, with_nfd)
    except template.TemplateError as exc:
        raise ClusterError(str(exc)) from None
    finally:
        logs = ctx.layout.logs / f"template-{spec.pool}"
        if (workdir / "gfd.log").exists():
            logs.mkdir(parents=True, exist_ok=True)
            shutil.move(workdir / "gfd.log", logs / "gfd.log")
        shutil.rmtree(workdir, ignore_errors=True)
    return Pool(
        name=spec.pool,
        spec=str(spec),
        profile=prof.name,
        product=prof.gpu.name,
        gpus=prof.gpu_count,
        count=spec.count,
        labels=made.labels,
        per_gpu=made.per_gpu,
        devices=made.devices,
        racked=made.racked,
        dra=dra,
    )


def _apis(ctx: Context) -> tuple[Any, Any]:
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

    api = ctx.apiserver.client()
    api.configuration.connection_pool_maxsize = 16
    return client.CoreV1Api(api), client.ResourceV1Api(api)


def create(ctx: Context, pools: Sequence[Pool], dra: bool) -> None:
    """Every pool's nodes (and with ``dra`` each node's ResourceSlice, owned by the node)."""
    from k8snode.dra import resources

    core, resource = _apis(ctx)

    def make(item: tuple[Pool, int]) -> None:
        pool, i = item
        created = json.loads(core.create_node(virtual.node_body(pool, i), _preload_content=False).data)
        if dra:
            node = pool.nodes[i]
            body = resources.slice_of(pool.slice_devices(node), node, owner_uid=created["metadata"]["uid"])
            resource.create_resource_slice(body, _preload_content=False)

    virtual.parallel(make, [(p, i) for p in pools for i in range(p.count)])


def _virtual_nodes(ctx: Context) -> list[dict[str, Any]]:
    core, _ = _apis(ctx)
    # From the API server's watch cache (resourceVersion 0): no read of etcd for thousands of nodes.
    found = core.list_node(label_selector=f"{virtual.VIRTUAL_LABEL}=true", resource_version="0", _preload_content=False)
    return list(json.loads(found.data).get("items") or [])


def watch(ctx: Context, pools: Sequence[Pool]) -> NodeWatch:
    """A watch that is done once every virtual node is Ready with its GPUs allocatable."""
    want = {n: p.resources(n, allocatable=True) for p in pools for n in p.nodes}

    def done(node: dict[str, Any]) -> bool:
        allocatable = node.get("status", {}).get("allocatable", {})
        resources = want[node["metadata"]["name"]]
        return ready(node) and all(allocatable.get(k) == v for k, v in resources.items())

    return NodeWatch(ctx.apiserver, f"{virtual.VIRTUAL_LABEL}=true", want, done)


def pool_status(ctx: Context, pools: Sequence[Pool]) -> list[dict[str, Any]]:
    """Per pool: nodes, Ready, GPUs (capacity) and allocatable GPUs, as the API server has them."""
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for item in _virtual_nodes(ctx):
        by_pool.setdefault(item["metadata"].get("labels", {}).get(virtual.POOL_LABEL, ""), []).append(item)
    out = []
    for p in pools:
        items = by_pool.get(p.name, [])
        out.append(
            {
                "pool": p.name,
                "spec": p.spec,
                "product": p.product,
                "nodes": len(items),
                "wanted": p.count,
                "ready": sum(1 for i in items if ready(i)),
                "gpus": sum(int(i["status"].get("capacity", {}).get("nvidia.com/gpu", 0)) for i in items),
                "allocatable_gpus": sum(
                    int(i["status"].get("allocatable", {}).get("nvidia.com/gpu", 0)) for i in items
                ),
                "unhealthy_gpus": sum(len(f) for f in p.faults.values()),
            }
        )
    return out


def find(pools: Sequence[Pool], node: str) -> Pool | None:
    return next((p for p in pools if node in set(p.nodes)), None)


def apply_fault(ctx: Context, pool: Pool, node: str, gpus: Sequence[int], reason: str | None) -> list[str]:
    """GPUs ``gpus`` of virtual node ``node`` unhealthy for ``reason`` (None: healthy again), shown as
    the device plugin (allocatable) or the DRA driver (the ResourceSlice) would show it; one note
    per GPU. The caller saves the cluster's state."""
    from k8snode.dra import resources

    bad = pool.faults.setdefault(node, {})
    notes = []
    for i in gpus:
        if reason is None:
            was = bad.pop(str(i), None)
            notes.append(f"GPU {i}: healthy again" if was else f"GPU {i}: healthy")
        else:
            bad.setdefault(str(i), reason)
            notes.append(f"GPU {i}: unhealthy ({bad[str(i)]})")
    if not bad:
        pool.faults.pop(node, None)
    allocator = ctx.options.get("allocator")
    core, resource = _apis(ctx)
    if allocator == "device-plugin":
        body = {"status": {"allocatable": pool.resources(node, allocatable=True)}}
        core.patch_node_status(node, body, _preload_content=False)
    elif allocator == "dra":
        selector = f"spec.nodeName={node},spec.driver={resources.DEFAULT_DRIVER}"
        items = json.loads(resource.list_resource_slice(field_selector=selector, _preload_content=False).data)["items"]
        for item in items:
            generation = int(item["spec"]["pool"].get("generation", 1)) + 1
            owner = (item["metadata"].get("ownerReferences") or [{}])[0].get("uid")
            body = resources.slice_of(pool.slice_devices(node), node, generation=generation, owner_uid=owner)
            body["metadata"] = item["metadata"]
            resource.replace_resource_slice(item["metadata"]["name"], body, _preload_content=False)
    return notes
