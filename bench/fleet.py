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
asserts on them.

With ``hold`` (steps, e.g. 10000,15000,20000) the pool is grown step by step instead: at each step,
once its nodes are Ready and ``settle`` seconds have passed, the CPU (cores: the change of
``process_cpu_seconds_total`` over ``window`` seconds) and RSS (``process_resident_memory_bytes``) of
the API server (its own ``/metrics``), the fleet controller and KWOK's controller (their pods'
``metrics`` ports through the API server's pod proxy) are sampled — also once before the pool, at 0
nodes. Least squares over the samples give each figure's slope per 1000 nodes and its projection to
:data:`PROJECTED` nodes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from virtualfleet.crd import GROUP, PLURAL, VERSION
from virtualfleet.pool import POOL_LABEL

__all__ = ["BenchError", "Hold", "Result", "fit", "hold", "process_figures", "run"]

TARGET_RATE = 500.0  # nodes/s
TARGET_READY_S = 120.0  # for 10,000 nodes
TARGET_NODES = 10_000
LEASE = "mokka-fleet-controller"
PROJECTED = 100_000  # nodes: the scale the held figures are projected to
COMPONENTS = ("API server", "fleet controller", "KWOK")


class BenchError(Exception):
    """The bench cannot run here; the message says what to do."""


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
        rate_ok = self.rate >= TARGET_RATE
        rows = [
            (f"{self.nodes} nodes made", f"{self.made_s:.1f} s", ""),
            (
                "node creation",
                f"{self.rate:.0f} nodes/s",
                f">= {TARGET_RATE:.0f} nodes/s{'' if rate_ok else ' MISSED'}",
            ),
        ]
        target = ""
        if self.nodes == TARGET_NODES:
            target = f"<= {TARGET_READY_S:.0f} s{'' if self.ready_s <= TARGET_READY_S else ' MISSED'}"
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


class _Follower:
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
        from virtualfleet.controller import WatchExpired, watch_events

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


def _wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def controller_metrics(api: Any, namespace: str) -> dict[str, float]:
    """The leading controller's reconcile and template figures, from its /metrics."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]
    from prometheus_client.parser import text_string_to_metric_families

    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
        pod = lease.spec.holder_identity
        core = client.CoreV1Api(api)
        port = next(
            p.container_port
            for c in core.read_namespaced_pod(pod, namespace).spec.containers
            for p in c.ports or []
            if p.name == "metrics"
        )
        text = core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod}:{port}", namespace, "metrics", _preload_content=False
        )
    except (ApiException, StopIteration, AttributeError):
        return {}
    got: dict[str, float] = {}
    for family in text_string_to_metric_families(text.data.decode()):
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

    _wait(f"Prometheus {namespace}/{service} scraping {nodes} Ready nodes", seen, timeout)
    return got


def _absent(custom: Any, pool: str) -> None:
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
    from kubernetes.client.rest import ApiException

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    _absent(custom, pool)
    result = Result(nodes)
    t0 = time.monotonic()
    follower = _Follower(core, pool, t0)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualGPUPool", "metadata": {"name": pool}}
    body["spec"] = {"profile": profile, "replicas": nodes}
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    except ApiException as exc:
        follower.stop.set()
        raise BenchError(f"VirtualGPUPool {pool}: {exc.reason}: {str(exc.body)[:300]}") from None
    try:
        _wait(f"{nodes} nodes made", lambda: follower.counts()[0] >= nodes, timeout)
        _wait(f"{nodes} nodes Ready", lambda: follower.counts()[1] >= nodes, timeout)
        result.made_s, result.ready_s = follower.last()
        result.controller = controller_metrics(api, namespace)
        if prometheus:
            seconds = time.monotonic() - t0
            result.scraped = scraped(api, namespace, prometheus, pool, nodes, seconds, min(timeout, 120))
    finally:
        if not keep:
            t1 = time.monotonic()
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, pool)
            _wait("every node of the pool gone", lambda: follower.counts()[0] == 0, timeout)
            result.deleted_s = time.monotonic() - t1
        follower.stop.set()
    return result


# ---------------------------------------------------------------------- held nodes (--hold)


def process_figures(text: str) -> tuple[float, float] | None:
    """(``process_cpu_seconds_total``, ``process_resident_memory_bytes``) from a ``/metrics`` text;
    None where either is missing (a process whose metrics leave them out)."""
    got: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes"):
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                rest = line.rsplit("}", 1)[-1] if "{" in line else line[len(name) :]
                got[name] = float(rest.split()[0])  # a timestamp may follow
    if len(got) != 2:
        return None
    return got["process_cpu_seconds_total"], got["process_resident_memory_bytes"]


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points; a single point: slope 0."""
    n = len(xs)
    if n == 0:
        raise ValueError("no points to fit")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


@dataclass
class Sample:
    """One component's figures at one pool size: cores used over the window, RSS at its end."""

    cores: float
    rss: float  # bytes


@dataclass
class Step:
    nodes: int
    made_s: float = 0.0  # from the step's scale to its last node seen
    ready_s: float = 0.0  # from the step's scale to its last node Ready
    samples: dict[str, Sample] = field(default_factory=dict)  # component -> figures


@dataclass
class Hold:
    steps: list[Step]  # the first: 0 nodes, before the pool
    window: float = 0.0
    settle: float = 0.0

    def grown(self, k: int) -> int:
        """Nodes step ``k`` added."""
        return self.steps[k].nodes - self.steps[k - 1].nodes if k else self.steps[0].nodes

    def slopes(self) -> dict[str, tuple[tuple[float, float], tuple[float, float]]]:
        """component -> ((cores per 1000 nodes, cores at 0), (bytes per 1000 nodes, bytes at 0)),
        for components sampled at two sizes or more."""
        got = {}
        for component in COMPONENTS:
            points = [(s.nodes / 1000, s.samples[component]) for s in self.steps if component in s.samples]
            if len({x for x, _ in points}) < 2:
                continue
            xs = [x for x, _ in points]
            got[component] = (fit(xs, [p.cores for _, p in points]), fit(xs, [p.rss for _, p in points]))
        return got

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, value, target) lines: each step's creation and Ready, its samples, the slopes and
        the projection to :data:`PROJECTED` nodes."""
        rows: list[tuple[str, str, str]] = []
        for k, step in enumerate(self.steps):
            if step.nodes:
                grown = self.grown(k)
                rate = grown / step.made_s if step.made_s else 0.0
                rate_ok = rate >= TARGET_RATE
                rows.append((f"{step.nodes} nodes: {grown} made", f"{step.made_s:.1f} s", ""))
                rows.append(
                    (
                        f"{step.nodes} nodes: node creation",
                        f"{rate:.0f} nodes/s",
                        f">= {TARGET_RATE:.0f} nodes/s{'' if rate_ok else ' MISSED'}",
                    )
                )
                target = ""
                if k == 1 and step.nodes == TARGET_NODES:  # from the pool's creation
                    ok = step.ready_s <= TARGET_READY_S
                    target = f"<= {TARGET_READY_S:.0f} s{'' if ok else ' MISSED'}"
                rows.append((f"{step.nodes} nodes: {grown} Ready", f"{step.ready_s:.1f} s", target))
            for component in COMPONENTS:
                if component in step.samples:
                    s = step.samples[component]
                    value = f"{s.cores:.3f} cores {s.rss / 2**20:.0f} MiB"
                    rows.append((f"{step.nodes} nodes held: {component}", value, ""))
        for component, ((cpu, cpu0), (rss, rss0)) in self.slopes().items():
            value = f"{cpu:+.4f} cores {rss / 2**20:+.1f} MiB"
            rows.append((f"per 1000 nodes: {component}", value, ""))
            at = PROJECTED / 1000
            value = f"{cpu0 + cpu * at:.2f} cores {(rss0 + rss * at) / 2**30:.1f} GiB"
            rows.append((f"projected at {PROJECTED} nodes: {component}", value, ""))
        return rows


def _metrics_text(api: Any, path: str) -> str:
    raw = api.call_api(path, "GET", auth_settings=["BearerToken"], _preload_content=False)
    return str(raw.data.decode())


def _pod_metrics_path(core: Any, namespace: str, pod: Any) -> str | None:
    port = next((p.container_port for c in pod.spec.containers for p in c.ports or [] if p.name == "metrics"), None)
    if port is None:
        return None
    return f"/api/v1/namespaces/{namespace}/pods/{pod.metadata.name}:{port}/proxy/metrics"


def metrics_paths(api: Any, namespace: str) -> dict[str, str]:
    """component -> the API path of its /metrics: the API server's own; the pod holding the
    controller's Lease; a Running pod of the namespace with a container named ``kwok`` (each through
    the pod proxy, on its container port named ``metrics``). A component not found is left out."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    paths = {"API server": "/metrics"}
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
        path = _pod_metrics_path(core, namespace, core.read_namespaced_pod(lease.spec.holder_identity, namespace))
        if path:
            paths["fleet controller"] = path
    except (ApiException, AttributeError):
        pass
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status.phase == "Running" and any(c.name == "kwok" for c in pod.spec.containers):
            path = _pod_metrics_path(core, namespace, pod)
            if path:
                paths["KWOK"] = path
                break
    return paths


def sample(api: Any, paths: dict[str, str], window: float) -> dict[str, Sample]:
    """Each component's cores used over ``window`` seconds and its RSS at the end (a component
    whose metrics cannot be read, or carry no process figures, is left out)."""
    from kubernetes.client.rest import ApiException

    def read() -> dict[str, tuple[float, float, float]]:
        got = {}
        for component, path in paths.items():
            try:
                figures = process_figures(_metrics_text(api, path))
            except ApiException:
                continue
            if figures:
                got[component] = (time.monotonic(), *figures)
        return got

    first = read()
    time.sleep(window)
    second = read()
    return {
        c: Sample(cores=(second[c][1] - first[c][1]) / (second[c][0] - first[c][0]), rss=second[c][2])
        for c in first
        if c in second and second[c][0] > first[c][0]
    }


def hold(
    api: Any,
    steps: list[int],
    profile: str = "h100",
    pool: str = "bench-fleet",
    namespace: str = "mokka-system",
    keep: bool = False,
    timeout: float = 900,
    settle: float = 30,
    window: float = 60,
    progress: Callable[[str], None] = lambda _message: None,
) -> Hold:
    """Sample the components at 0 nodes, then grow pool ``pool`` of ``profile`` through ``steps``
    (ascending node counts; the first makes the pool, the others scale it), each step followed to
    Ready, ``settle`` seconds waited and the components sampled over ``window`` seconds; then the
    pool deleted (unless ``keep``); ``progress`` is told each phase as it starts."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    if not steps or any(b <= a for a, b in itertools.pairwise(steps)) or steps[0] < 1:
        raise BenchError(f"steps {steps}: give ascending node counts, the first at least 1")
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    _absent(custom, pool)
    paths = metrics_paths(api, namespace)
    progress(f"sampling {', '.join(paths)} at 0 nodes")
    result = Hold([Step(0, samples=sample(api, paths, window))], window=window, settle=settle)
    for c, got in result.steps[0].samples.items():
        progress(f"0 nodes held: {c}: {got.cores:.3f} cores {got.rss / 2**20:.0f} MiB")
    t0 = time.monotonic()
    follower = _Follower(core, pool, t0)
    try:
        for k, nodes in enumerate(steps):
            before = set(follower.seen)
            start = time.monotonic() - t0
            progress(f"growing the pool to {nodes} nodes")
            if k == 0:
                body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualGPUPool", "metadata": {"name": pool}}
                body["spec"] = {"profile": profile, "replicas": nodes}
                try:
                    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
                except ApiException as exc:
                    raise BenchError(f"VirtualGPUPool {pool}: {exc.reason}: {str(exc.body)[:300]}") from None
            else:
                custom.patch_cluster_custom_object_scale(GROUP, VERSION, PLURAL, pool, {"spec": {"replicas": nodes}})
            _wait(f"{nodes} nodes made", lambda n=nodes: follower.counts()[0] >= n, timeout)
            _wait(f"{nodes} nodes Ready", lambda n=nodes: follower.counts()[1] >= n, timeout)
            with follower.lock:
                new = [n for n in follower.seen if n not in before]
                made = max((follower.seen[n] for n in new), default=start)
                ready = max((follower.ready[n] for n in new if n in follower.ready), default=start)
            step = Step(nodes, made_s=made - start, ready_s=ready - start)
            progress(
                f"{nodes} nodes Ready: made in {step.made_s:.1f} s, Ready in {step.ready_s:.1f} s;"
                f" sampling after {settle:g} s"
            )
            time.sleep(settle)
            paths = metrics_paths(api, namespace)  # a restarted pod: its new name
            step.samples = sample(api, paths, window)
            result.steps.append(step)
            for c, got in step.samples.items():  # as it goes: a run cut short still told its figures
                progress(f"{nodes} nodes held: {c}: {got.cores:.3f} cores {got.rss / 2**20:.0f} MiB")
    finally:
        if not keep:
            progress("deleting the pool")
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, pool)
            _wait("every node of the pool gone", lambda: follower.counts()[0] == 0, timeout)
        follower.stop.set()
    return result
