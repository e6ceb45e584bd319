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
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from virtualfleet.crd import GROUP, PLURAL, VERSION
from virtualfleet.pool import POOL_LABEL

__all__ = [
    "BenchError",
    "Follower",
    "Result",
    "create_pool",
    "leader_metrics_path",
    "metrics_text",
    "no_pool",
    "pod_metrics_path",
    "rate_target",
    "ready_target",
    "run",
    "wait_until",
]

TARGET_RATE = 500.0  # nodes/s
TARGET_READY_S = 120.0  # for 10,000 nodes
TARGET_NODES = 10_000
LEASE = "mokka-fleet-controller"


class BenchError(Exception):
    """The bench cannot run here; the message says what to do."""


def rate_target(rate: float) -> str:
    """The creation rate's target, MISSED when ``rate`` (nodes/s) falls short."""
    return f">= {TARGET_RATE:.0f} nodes/s{'' if rate >= TARGET_RATE else ' MISSED'}"


def ready_target(seconds: float) -> str:
    """The Ready time's target (for :data:`TARGET_NODES` nodes), MISSED when ``seconds`` exceeds it."""
    return f"<= {TARGET_READY_S:.0f} s{'' if seconds <= TARGET_READY_S else ' MISSED'}"


@dataclass
class Result:
    nodes: int
    made_s: float = 0.0
    ready_s: float = 0.0
    deleted_s: float | None = None
    controller: dict[str, float] = field(default_factory=dict)
    scraped: dict[str, float] = field(default_factory=dict)  # what Prometheus saw of the run

    @property
    def rate(self) -> float:
        return self.nodes / self.made_s if self.made_s else 0.0

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, value, target) lines; a missed target says MISSED."""
        rows = [
            (f"{self.nodes} nodes made", f"{self.made_s:.1f} s", ""),
            ("node creation", f"{self.rate:.0f} nodes/s", rate_target(self.rate)),
        ]
        target = ready_target(self.ready_s) if self.nodes == TARGET_NODES else ""
        rows.append((f"{self.nodes} nodes Ready", f"{self.ready_s:.1f} s", target))
        if self.deleted_s is not None:
            rows.append(("pool deleted -> every node gone", f"{self.deleted_s:.1f} s", ""))
        for name, value in sorted(self.controller.items()):
            rows.append((f"controller: {name}", f"{value:g}", ""))
        for name, value in sorted(self.scraped.items()):
            rows.append((f"prometheus: {name}", f"{value:g}", ""))
        return rows


def _ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Follower:
    """One watch of the pool's nodes: when each was first seen and first Ready (seconds from t0)."""

    def __init__(self, core: Any, pool: str, t0: float) -> None:
        self.core, self.pool, self.t0 = core, pool, t0
        self.seen: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        listed = json.loads(core.list_node(label_selector=self.selector, _preload_content=False).data)
        self.version = listed["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True, name="follower")
        self.thread.start()

    @property
    def selector(self) -> str:
        return f"{POOL_LABEL}={self.pool}"

    def _run(self) -> None:
        from virtualfleet.watch import WatchExpired, watch_events

        def stream(**kw: Any) -> Any:
            return self.core.list_node(label_selector=self.selector, **kw)

        while not self.stop.is_set():
            try:
                for event in watch_events(stream, self.version, timeout=60):
                    obj = event["object"]
                    self.version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    self._saw(event["type"], obj)
                    if self.stop.is_set():
                        return
            except WatchExpired:  # too old: the nodes as they are now, and on from there
                listed = json.loads(self.core.list_node(label_selector=self.selector, _preload_content=False).data)
                names = {obj["metadata"]["name"] for obj in listed["items"]}
                with self.lock:
                    for gone in set(self.seen) - names:
                        self.seen.pop(gone, None)
                        self.ready.pop(gone, None)
                for obj in listed["items"]:
                    self._saw("ADDED", obj)
                self.version = listed["metadata"]["resourceVersion"]
            except Exception:  # a dropped watch: resume from the last version seen
                time.sleep(0.5)

    def _saw(self, kind: str, obj: dict[str, Any]) -> None:
        now, name = time.monotonic() - self.t0, obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.seen.pop(name, None)
                self.ready.pop(name, None)
                return
            self.seen.setdefault(name, now)
            if _ready(obj):
                self.ready.setdefault(name, now)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.seen), len(self.ready)

    def last(self) -> tuple[float, float]:
        with self.lock:
            return max(self.seen.values(), default=0.0), max(self.ready.values(), default=0.0)


def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


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
) -> Result:
    """Apply a pool of ``nodes`` nodes of ``profile`` named ``pool``, follow it to Ready, delete it
    (unless ``keep``); ``namespace`` is the chart's release's (the controller's Lease; ``prometheus``,
    a Prometheus Service there to read the run back from)."""
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    no_pool(custom, pool)
    result = Result(nodes)
    t0 = time.monotonic()
    follower = Follower(core, pool, t0)
    try:
        create_pool(custom, pool, profile, nodes)
    except BenchError:
        follower.stop.set()
        raise
    try:
        wait_until(f"{nodes} nodes made", lambda: follower.counts()[0] >= nodes, timeout)
        wait_until(f"{nodes} nodes Ready", lambda: follower.counts()[1] >= nodes, timeout)
        result.made_s, result.ready_s = follower.last()
        result.controller = controller_metrics(api, namespace)
        if prometheus:
            seconds = time.monotonic() - t0
            result.scraped = scraped(api, namespace, prometheus, pool, nodes, seconds, min(timeout, 120))
    finally:
        if not keep:
            t1 = time.monotonic()
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, pool)
            wait_until("every node of the pool gone", lambda: follower.counts()[0] == 0, timeout)
            result.deleted_s = time.monotonic() - t1
        follower.stop.set()
    return result
