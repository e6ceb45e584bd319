"""Karpenter's KWOK provider autoscaling the virtual pools (``mokka cluster up --virtual h100=0
--virtual t4:1=0 --karpenter``; the provider built from sigs.k8s.io/karpenter): a pending 8-GPU pod
and a pending 1-GPU pod each get a node of the pool they select, which the fleet controller decorates
as the pool's (GFD's labels, its GPUs, counted in the pool's status as adopted); both pods run; once
they are gone consolidation removes the nodes, and the pools are empty again."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_fixtures import pod_manifest, start_cluster, wait_for

from localcluster.cluster import Cluster
from virtualfleet.pool import POOL_LABEL, VirtualSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

POOLS = {"h100": 8, "t4-1": 1}  # pool -> its nodes' GPUs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    virtual = (VirtualSpec("h100", None, 0), VirtualSpec("t4", 1, 0))
    with start_cluster(tmp_path_factory.mktemp("karpenter"), profile="t4", virtual=virtual, karpenter=True) as c:
        yield c


def nodes(cluster: Cluster, selector: str) -> dict[str, dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "nodes", "-l", selector, "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n for n in items}


def pool_status(cluster: Cluster, pool: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "vgp", pool, "-o", "json").stdout).get("status") or {}  # type: ignore[no-any-return]


def test_up_makes_a_node_pool_per_virtual_pool_and_no_node(cluster: Cluster) -> None:
    pools = json.loads(cluster.kubectl("get", "nodepools", "-o", "json").stdout)["items"]
    assert sorted(p["metadata"]["name"] for p in pools) == sorted(POOLS)
    assert nodes(cluster, POOL_LABEL) == {}
    types = json.loads((cluster.layout.base / "karpenter" / "instance-types.json").read_text())
    assert {t["name"]: t["resources"]["nvidia.com/gpu"] for t in types} == {"mokka-h100": "8", "mokka-t4-1": "1"}


def diagnosis(cluster: Cluster) -> str:
    """What the cluster says happened: its recent events and the tail of Karpenter's log."""
    events = cluster.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout
    log = (cluster.layout.logs / "karpenter.log").read_text(errors="replace").splitlines()[-40:]
    return "events:\n" + "\n".join(events.splitlines()[-40:]) + "\nkarpenter.log:\n" + "\n".join(log)


def test_pending_gpu_pods_get_nodes_of_their_pools_and_consolidation_removes_them(cluster: Cluster) -> None:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    real = cluster.node()
    real_gfd = {
        k: v
        for k, v in nodes(cluster, f"kubernetes.io/hostname={real.name}")[real.name]["metadata"]["labels"].items()
        if k.startswith("nvidia.com/")
    }
    names = []
    for pool, gpus in POOLS.items():
        manifest = pod_manifest(f"wants-{pool}", ["sleep", "3600"], gpus=gpus)
        manifest["spec"]["nodeSelector"] = {POOL_LABEL: pool}
        core.create_namespaced_pod("default", manifest)
        names.append(manifest["metadata"]["name"])
    try:

        def placed() -> dict[str, str] | None:
            try:
                pods = {n: core.read_namespaced_pod(n, "default") for n in names}
            except client.exceptions.ApiException as exc:  # once seen under load: a pod gone (404) in seconds
                pytest.fail(f"a pending pod vanished ({exc.status}): {diagnosis(cluster)}")
            running = {n: p.spec.node_name for n, p in pods.items() if p.status.phase == "Running"}
            return running if len(running) == len(names) else None

        where = wait_for("both pods Running on nodes Karpenter made", placed, 240)
        made = nodes(cluster, "karpenter.sh/nodepool")
        assert sorted(where.values()) == sorted(made)
        for pool, gpus in POOLS.items():
            node = made[where[f"wants-{pool}"]]
            labels = node["metadata"]["labels"]
            assert labels[POOL_LABEL] == pool and labels["karpenter.sh/nodepool"] == pool
            assert labels["node.kubernetes.io/instance-type"] == f"mokka-{pool}"
            assert labels["nvidia.com/gpu.count"] == str(gpus)  # GFD's, from the fleet controller
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(gpus)
            assert node["spec"]["providerID"].startswith("kwok://")
            if pool == "t4-1":  # the real node is a t4 of one GPU less or more: the same product
                assert labels["nvidia.com/gpu.product"] == real_gfd["nvidia.com/gpu.product"]
            wait_for(
                f"pool {pool}'s status counting the node",
                lambda pool=pool: pool_status(cluster, pool).get("adoptedNodes") == 1,
                60,
            )
        status = subprocess.run(
            [sys.executable, "-m", "mokka.cli", "cluster", "status", "--dir", str(cluster.layout.base)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        rows = {
            ln.split()[0]: ln.split() for ln in status.stdout.splitlines() if ln.split()[:1] in (["h100"], ["t4-1"])
        }
        assert rows["h100"][2:] == ["0", "0", "0", "8", "1"], status.stdout  # its own nodes 0, Karpenter's 1
        assert rows["t4-1"][-1] == "1", status.stdout
    finally:
        for name in names:  # one may be gone already (see placed): the failure above is the news
            try:
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            except client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
    wait_for("consolidation removing the nodes", lambda: not nodes(cluster, "karpenter.sh/nodepool"), 240)
    for pool in POOLS:
        wait_for(f"pool {pool} empty again", lambda pool=pool: pool_status(cluster, pool).get("adoptedNodes") == 0, 60)
