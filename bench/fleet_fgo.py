"""`mokka bench fleet --fgo POOL`: run:ai's fake-gpu-operator (FGO) on the same pool size, in the same
run on the same cluster — the peer Mokka's virtual nodes are measured against.

FGO makes no nodes of its own: its users create KWOK nodes labelled with its node-pool key and
annotated ``kwok.x-k8s.io/node=fake`` (a KWOK keeps them Ready: the chart's ``fleet.kwok``, which
manages exactly those, or one's own), and FGO's status-updater, kwok-gpu-device-plugin and
status-exporter-kwok (its chart's defaults) give them GPUs and GPU labels. The bench does what such a
user does: it reads FGO's topology (ConfigMap ``topology`` in FGO's namespace) to check that the pool
is served by the ``fake`` backend, creates the nodes (those ``mokka cluster up --fgo`` makes,
:func:`localcluster.addons.fgo.node_body`, also labelled :data:`BENCH_LABEL`), follows them until each
is Ready with FGO's GPUs (allocatable ``nvidia.com/gpu`` and the ``nvidia.com/gpu.product`` label),
and deletes them after.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from localcluster.addons import fgo
from virtualfleet.pool import parallel

from .fleet_nodes import BenchError, Follower, Side, is_ready, schedule_pods, wait_until

__all__ = ["BENCH_LABEL", "Peer", "find", "gpus_served", "run"]

BENCH_LABEL = "mokka.io/bench-fgo"  # value: the bench's --pool, so that a run finds its own nodes


@dataclass(frozen=True)
class Peer:
    """FGO's node pool ``pool`` (its topology in ``namespace``), served from FGO profile ``profile``;
    the bench's nodes for it are named after the bench's pool ``bench``."""

    pool: str
    namespace: str
    profile: str
    bench: str

    @property
    def selector(self) -> str:
        return f"{BENCH_LABEL}={self.bench}"

    def names(self, count: int) -> list[str]:
        return [f"{self.bench}-fgo-{i}" for i in range(count)]


def _topology(core: Any, namespace: str, pool: str) -> dict[str, Any]:
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    where = f"ConfigMap {namespace}/{fgo.TOPOLOGY}"
    try:
        cm = core.read_namespaced_config_map(fgo.TOPOLOGY, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise BenchError(
                f"--fgo {pool}: no fake-gpu-operator topology here ({where}): install its chart, "
                "or name its namespace with --fgo-namespace"
            ) from None
        raise BenchError(f"--fgo {pool}: {where}: {exc.reason}") from None
    try:
        topology = yaml.safe_load((cm.data or {}).get("topology.yml") or "")
    except yaml.YAMLError:
        topology = None
    if not isinstance(topology, dict) or not isinstance(topology.get("nodePools"), dict):
        raise BenchError(f"--fgo {pool}: {where} holds no nodePools under topology.yml")
    return topology


def find(core: Any, namespace: str, pool: str, bench: str) -> Peer:
    """FGO's pool ``pool`` as its topology in ``namespace`` serves it (BenchError naming what is wrong:
    no topology, no such pool, a backend that serves no KWOK nodes, nodes of an earlier run left)."""
    pools = _topology(core, namespace, pool)["nodePools"]
    if pool not in pools:
        raise BenchError(f"--fgo {pool}: fake-gpu-operator's topology has no pool {pool} (it has: {', '.join(pools)})")
    entry: dict[str, Any] = pools[pool] if isinstance(pools[pool], dict) else {}
    gpu: dict[str, Any] = entry["gpu"] if isinstance(entry.get("gpu"), dict) else {}
    backend = gpu.get("backend") or entry.get("backend")  # FGO 0.2.0's shape, or the earlier one
    if backend != "fake":
        raise BenchError(f"--fgo {pool}: its backend is {backend or 'not set'}; FGO serves KWOK nodes with 'fake'")
    peer = Peer(pool, namespace, str(gpu.get("profile") or entry.get("gpuProfile") or ""), bench)
    if core.list_node(label_selector=peer.selector, limit=1).items:
        raise BenchError(f"--fgo {pool}: nodes of an earlier run are here: kubectl delete nodes -l {peer.selector}")
    return peer


def gpus_served(node: dict[str, Any]) -> bool:
    """Whether FGO has served KWOK node ``node``: Ready, with GPUs allocatable and its product label."""
    gpus = int((node.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", "0") or 0)
    return is_ready(node) and gpus > 0 and "nvidia.com/gpu.product" in (node["metadata"].get("labels") or {})


def _delete(core: Any, name: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        core.delete_node(name, _preload_content=False)
    except ApiException as exc:
        if exc.status != 404:
            raise


def run(
    api: Any,
    peer: Peer,
    nodes: int,
    pods: int,
    settle: float,
    keep: bool,
    timeout: float,
    progress: Callable[[str], None],
) -> Side:
    """FGO's side: ``nodes`` KWOK nodes in ``peer``'s pool made, followed until served, ``pods``
    one-GPU pods scheduled on them ``settle`` seconds later, the nodes deleted (unless ``keep``)."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    core = client.CoreV1Api(api)
    spec = fgo.FgoSpec(peer.pool, peer.profile, nodes)
    names = peer.names(nodes)
    side = Side(nodes)
    t0 = time.monotonic()
    follower = Follower(core, peer.selector, t0, done=gpus_served)

    def body(name: str) -> dict[str, Any]:
        node = fgo.node_body(spec, name)
        node["metadata"]["labels"][BENCH_LABEL] = peer.bench
        return node

    try:
        progress(f"fake-gpu-operator: making {nodes} KWOK nodes in its pool {peer.pool}")
        try:
            parallel(lambda name: core.create_node(body(name), _preload_content=False), names)
        except ApiException as exc:
            raise BenchError(
                f"fake-gpu-operator: a node of pool {peer.pool}: {exc.reason}: {str(exc.body)[:300]}"
            ) from None
        wait_until(f"fake-gpu-operator: {nodes} nodes made", lambda: follower.counts()[0] >= nodes, timeout)
        wait_until(
            f"fake-gpu-operator: {nodes} nodes Ready with GPUs (are its status-updater, kwok-gpu-device-plugin "
            "and status-exporter-kwok running, and a KWOK managing nodes annotated kwok.x-k8s.io/node=fake?)",
            lambda: follower.counts()[1] >= nodes,
            timeout,
        )
        side.made_s, side.ready_s = follower.last()
        progress(f"fake-gpu-operator: {nodes} nodes Ready with GPUs in {side.ready_s:.1f} s")
        selector = {fgo.POOL_KEY: peer.pool, BENCH_LABEL: peer.bench}
        schedule_pods(api, side, selector, pods, settle, timeout, progress, "fake-gpu-operator")
    finally:
        if not keep:
            t1 = time.monotonic()
            parallel(lambda name: _delete(core, name), names)
            wait_until("fake-gpu-operator: every node gone", lambda: follower.counts()[0] == 0, timeout)
            side.deleted_s = time.monotonic() - t1
        follower.stop.set()
    return side
