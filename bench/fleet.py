"""`mokka bench fleet`: the chart's fleet (``fleet.enabled``: the VirtualGPUPool API, the fleet
controller and KWOK) measured on the cluster it runs on — any cluster, through its API.

One pool of ``--nodes`` nodes is applied and followed through one watch of its nodes: the seconds
until every node exists (and the rate they were made at) and until every node is Ready; then the
pool is deleted and the seconds until every node is gone (the garbage collector's work). The
controller's own figures are read from its ``/metrics`` through the API server's proxy to the
pod holding its Lease; with ``prometheus`` (the chart's ``integrations.prometheus`` Service, or one's
own in the namespace) the figures Prometheus scraped during the run are read back through the API
server's service proxy. Targets (issue 31, two cores): node creation >= 500 nodes/s; 10,000 nodes
Ready <= 120 s. Figures are printed with their targets, a missed one marked MISSED; nothing
asserts on them. Held nodes (``--hold``): :mod:`bench.fleet_hold`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from virtualfleet.crd import GROUP, PLURAL, VERSION
from virtualfleet.pool import POOL_LABEL

from . import fleet_fgo
from .fleet_nodes import BenchError, Follower, Side, schedule_pods, wait_until

__all__ = [
    "Result",
    "create_pool",
    "leader_metrics_path",
    "metrics_text",
    "no_pool",
    "pod_metrics_path",
    "pool_selector",
    "rate_target",
    "ratio_target",
    "ready_target",
    "run",
]

TARGET_RATE = 500.0  # nodes/s
TARGET_READY_S = 120.0  # for 10,000 nodes
TARGET_NODES = 10_000
LEASE = "mokka-fleet-controller"
PEER = "fake-gpu-operator"


def rate_target(rate: float) -> str:
    """The creation rate's target, MISSED when ``rate`` (nodes/s) falls short."""
    return f">= {TARGET_RATE:.0f} nodes/s{'' if rate >= TARGET_RATE else ' MISSED'}"


def ready_target(seconds: float) -> str:
    """The Ready time's target (for :data:`TARGET_NODES` nodes), MISSED when ``seconds`` exceeds it."""
    return f"<= {TARGET_READY_S:.0f} s{'' if seconds <= TARGET_READY_S else ' MISSED'}"


def ratio_target(ratio: float) -> str:
    """A Mokka / fake-gpu-operator ratio's target: no slower than the peer; MISSED above 1."""
    return f"<= 1{'' if ratio <= 1 else ' MISSED'}"


@dataclass
class Result:
    """Mokka's side (the pool's nodes and, with ``pods``, the one-GPU pods scheduled on them), the
    controller's and Prometheus' figures, and where compared (``--fgo``) fake-gpu-operator's side on
    as many nodes (``peer``, FGO's pool ``peer_pool``)."""

    mokka: Side
    pods: int = 0
    peer: Side | None = None
    peer_pool: str = ""
    controller: dict[str, float] = field(default_factory=dict)
    scraped: dict[str, float] = field(default_factory=dict)  # what Prometheus saw of the run

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, value, target) lines; a missed target says MISSED."""
        m = self.mokka
        rows = [
            (f"{m.nodes} nodes made", f"{m.made_s:.1f} s", ""),
            ("node creation", f"{m.rate:.0f} nodes/s", rate_target(m.rate)),
        ]
        target = ready_target(m.ready_s) if m.nodes == TARGET_NODES else ""
        rows.append((f"{m.nodes} nodes Ready", f"{m.ready_s:.1f} s", target))
        rows += self._pod_rows("", m)
        if m.deleted_s is not None:
            rows.append(("pool deleted -> every node gone", f"{m.deleted_s:.1f} s", ""))
        for name, value in sorted(self.controller.items()):
            rows.append((f"controller: {name}", f"{value:g}", ""))
        for name, value in sorted(self.scraped.items()):
            rows.append((f"prometheus: {name}", f"{value:g}", ""))
        if (p := self.peer) is None:
            return rows
        rows.append((f"{PEER}: {p.nodes} nodes made (pool {self.peer_pool})", f"{p.made_s:.1f} s", ""))
        rows.append((f"{PEER}: {p.nodes} nodes Ready with GPUs", f"{p.ready_s:.1f} s", ""))
        rows += self._pod_rows(f"{PEER}: ", p)
        if p.deleted_s is not None:
            rows.append((f"{PEER}: nodes deleted -> every node gone", f"{p.deleted_s:.1f} s", ""))
        for what, ours, theirs in self._compared():
            if ours is not None and theirs:
                rows.append((f"ratio {what} (Mokka / FGO)", f"{ours / theirs:.2f}", ratio_target(ours / theirs)))
        return rows

    def _pod_rows(self, prefix: str, side: Side) -> list[tuple[str, str, str]]:
        if side.bound_s is None or side.running_s is None:
            return []
        return [
            (f"{prefix}{self.pods} one-GPU pods bound", f"{side.bound_s:.1f} s", ""),
            (f"{prefix}{self.pods} one-GPU pods Running", f"{side.running_s:.1f} s", ""),
        ]

    def _compared(self) -> list[tuple[str, float | None, float | None]]:
        m, p = self.mokka, self.peer
        assert p is not None
        return [
            (f"{m.nodes} nodes Ready", m.ready_s, p.ready_s),
            (f"{self.pods} pods bound", m.bound_s, p.bound_s),
            (f"{self.pods} pods Running", m.running_s, p.running_s),
        ]

    def times(self) -> dict[str, dict[str, float]]:
        """What the plot shows: each time (s) beside its peer's, where both were measured."""
        if self.peer is None:
            return {}
        return {what: {"Mokka": ours, PEER: theirs} for what, ours, theirs in self._compared() if ours and theirs}


def pool_selector(pool: str) -> str:
    """The label selector of VirtualGPUPool ``pool``'s nodes."""
    return f"{POOL_LABEL}={pool}"


def metrics_text(api: Any, path: str) -> str:
    """The /metrics text at API path ``path``."""
    raw = api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False)
    return str(raw.data.decode())


def pod_metrics_path(namespace: str, pod: Any) -> str | None:
    """The API path of ``pod``'s /metrics through the pod proxy (its container port named ``metrics``)."""
    port = next((p.container_port for c in pod.spec.containers for p in c.ports or [] if p.name == "metrics"), None)
    if port is None:
        return None
    return f"/api/v1/namespaces/{namespace}/pods/{pod.metadata.name}:{port}/proxy/metrics"


def leader_metrics_path(api: Any, namespace: str) -> str | None:
    """The API path of the /metrics of the controller pod holding the Lease (None: none found)."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
        pod = client.CoreV1Api(api).read_namespaced_pod(lease.spec.holder_identity, namespace)
    except (ApiException, AttributeError):
        return None
    return pod_metrics_path(namespace, pod)


def controller_metrics(api: Any, namespace: str) -> dict[str, float]:
    """The leading controller's reconcile and template figures, from its /metrics."""
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]
    from prometheus_client.parser import text_string_to_metric_families

    path = leader_metrics_path(api, namespace)
    try:
        text = metrics_text(api, path) if path else ""
    except ApiException:
        return {}
    got: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ("mokka_fleet_reconcile_seconds_count", "mokka_fleet_reconcile_seconds_sum"):
                got[s.name.removeprefix("mokka_fleet_")] = round(s.value, 3)
            if s.name == "mokka_fleet_template_seconds_sum":
                got["template_seconds_sum"] = round(s.value, 3)
    return got


# What is read back from Prometheus over the run (PromQL over the pool's series; RUN: the run's length).
QUERIES = {
    "nodes Ready (max)": 'max_over_time(mokka_fleet_pool_nodes_ready{{pool="{pool}"}}[{run}s])',
    "allocatable GPUs (max)": 'max_over_time(mokka_fleet_pool_allocatable_gpus{{pool="{pool}"}}[{run}s])',
    "reconciles during the run": "sum(increase(mokka_fleet_reconcile_seconds_count[{run}s]))",
}


def prometheus_query(api: Any, namespace: str, service: str, query: str) -> list[Any]:
    """``query``'s instant vector from Prometheus Service ``service`` (``NAME[:PORT]``) in ``namespace``,
    through the API server's service proxy."""
    name, _, port = service.partition(":")
    path = f"/api/v1/namespaces/{namespace}/services/{name}:{port or 9090}/proxy/api/v1/query"
    raw = api.call_api(
        path, "GET", query_params=[("query", query)], auth_settings=["BearerToken"], _preload_content=False
    )
    answer = json.loads(raw.data)
    if answer.get("status") != "success":
        raise BenchError(f"Prometheus {namespace}/{service}: {answer.get('error', answer)}")
    return list(answer["data"]["result"])


def scraped(
    api: Any, namespace: str, service: str, pool: str, nodes: int, seconds: float, timeout: float
) -> dict[str, float]:
    """The run's figures as Prometheus scraped them, once it has seen every node Ready."""
    from kubernetes.client.rest import ApiException

    run = max(10, round(seconds) + 10)
    got: dict[str, float] = {}

    def seen() -> bool:
        try:
            for name, q in QUERIES.items():
                result = prometheus_query(api, namespace, service, q.format(pool=pool, run=run))
                got[name] = round(float(result[0]["value"][1]), 3) if result else 0.0
        except ApiException as exc:
            raise BenchError(f"Prometheus {namespace}/{service}: {exc.reason}") from None
        return got.get("nodes Ready (max)", 0) >= nodes

    wait_until(f"Prometheus {namespace}/{service} scraping {nodes} Ready nodes", seen, timeout)
    return got


def no_pool(custom: Any, pool: str) -> None:
    """BenchError unless the VirtualGPUPool API is served and has no pool ``pool``."""
    from kubernetes.client.rest import ApiException

    try:
        custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, pool)
    except ApiException as exc:
        if exc.status == 404 and "the server could not find the requested resource" in str(exc.body).lower():
            raise BenchError("no VirtualGPUPool API here: install the chart with --set fleet.enabled=true") from None
        if exc.status != 404:
            raise BenchError(f"VirtualGPUPool {pool}: {exc.reason}") from None
    else:
        raise BenchError(f"a VirtualGPUPool {pool} exists already: delete it or give --pool another name")


def create_pool(custom: Any, pool: str, profile: str, nodes: int) -> None:
    """Apply VirtualGPUPool ``pool`` of ``nodes`` nodes of ``profile`` (BenchError when refused)."""
    from kubernetes.client.rest import ApiException

    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualGPUPool", "metadata": {"name": pool}}
    body["spec"] = {"profile": profile, "replicas": nodes}
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    except ApiException as exc:
        raise BenchError(f"VirtualGPUPool {pool}: {exc.reason}: {str(exc.body)[:300]}") from None


def run(
    api: Any,
    nodes: int,
    profile: str = "h100",
    pool: str = "bench-fleet",
    namespace: str = "mokka-system",
    keep: bool = False,
    timeout: float = 900,
    prometheus: str | None = None,
    pods: int = 0,
    settle: float = 30.0,
    fgo: str | None = None,
    fgo_namespace: str = "gpu-operator",
    progress: Callable[[str], None] = lambda message: None,
) -> Result:
    """Apply a pool of ``nodes`` nodes of ``profile`` named ``pool``, follow it to Ready, schedule
    ``pods`` one-GPU pods on it ``settle`` seconds later, delete it (unless ``keep``); ``namespace`` is
    the chart's release's (the controller's Lease; ``prometheus``, a Prometheus Service there to read
    the run back from). With ``fgo``, then the same on as many nodes of fake-gpu-operator's pool
    ``fgo`` (its topology in ``fgo_namespace``), checked before anything is made."""
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    no_pool(custom, pool)
    peer = fleet_fgo.find(core, fgo_namespace, fgo, pool) if fgo else None
    result = Result(Side(nodes), pods)
    side = result.mokka
    t0 = time.monotonic()
    follower = Follower(core, pool_selector(pool), t0)
    try:
        create_pool(custom, pool, profile, nodes)
    except BenchError:
        follower.stop.set()
        raise
    progress(f"VirtualGPUPool {pool} applied: {nodes} nodes of {profile}")
    try:
        wait_until(f"{nodes} nodes made", lambda: follower.counts()[0] >= nodes, timeout)
        wait_until(f"{nodes} nodes Ready", lambda: follower.counts()[1] >= nodes, timeout)
        side.made_s, side.ready_s = follower.last()
        progress(f"{nodes} nodes Ready in {side.ready_s:.1f} s")
        result.controller = controller_metrics(api, namespace)
        if prometheus:
            seconds = time.monotonic() - t0
            result.scraped = scraped(api, namespace, prometheus, pool, nodes, seconds, min(timeout, 120))
        schedule_pods(api, side, {POOL_LABEL: pool}, pods, settle, timeout, progress, f"VirtualGPUPool {pool}")
    finally:
        if not keep:
            t1 = time.monotonic()
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, pool)
            wait_until("every node of the pool gone", lambda: follower.counts()[0] == 0, timeout)
            side.deleted_s = time.monotonic() - t1
        follower.stop.set()
    if peer is not None:
        result.peer_pool = peer.pool
        result.peer = fleet_fgo.run(api, peer, nodes, pods, settle, keep, timeout, progress)
    return result
