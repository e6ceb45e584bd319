"""`mokka bench fleet --hold N,N,...`: the chart's fleet grown step by step and held.

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from virtualfleet.crd import GROUP, PLURAL, VERSION

from .fleet import (
    TARGET_NODES,
    create_pool,
    leader_metrics_path,
    metrics_text,
    no_pool,
    pod_metrics_path,
    pool_selector,
    rate_target,
    ready_target,
)
from .fleet_nodes import BenchError, Follower, wait_until

__all__ = ["Hold", "Sample", "Step", "fit", "hold", "process_figures"]

PROJECTED = 100_000  # nodes: the scale the held figures are projected to
COMPONENTS = ("API server", "fleet controller", "KWOK")


def process_figures(text: str) -> tuple[float, float] | None:
    """(``process_cpu_seconds_total``, ``process_resident_memory_bytes``) from a ``/metrics`` text;
    None where either is missing (a process whose metrics leave them out)."""
    from prometheus_client.parser import text_string_to_metric_families

    names = ("process_cpu_seconds_total", "process_resident_memory_bytes")
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in names}
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
                rows.append((f"{step.nodes} nodes: {grown} made", f"{step.made_s:.1f} s", ""))
                rows.append((f"{step.nodes} nodes: node creation", f"{rate:.0f} nodes/s", rate_target(rate)))
                # from the pool's creation
                target = ready_target(step.ready_s) if k == 1 and step.nodes == TARGET_NODES else ""
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


def metrics_paths(api: Any, namespace: str) -> dict[str, str]:
    """component -> the API path of its /metrics: the API server's own; the pod holding the
    controller's Lease; a Running pod of the namespace with a container named ``kwok`` (each through
    the pod proxy, on its container port named ``metrics``). A component not found is left out."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    paths = {"API server": "/metrics"}
    if path := leader_metrics_path(api, namespace):
        paths["fleet controller"] = path
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status.phase == "Running" and any(c.name == "kwok" for c in pod.spec.containers):
            path = pod_metrics_path(namespace, pod)
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
                figures = process_figures(metrics_text(api, path))
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
    no_pool(custom, pool)
    paths = metrics_paths(api, namespace)
    progress(f"sampling {', '.join(paths)} at 0 nodes")
    result = Hold([Step(0, samples=sample(api, paths, window))], window=window, settle=settle)
    for c, got in result.steps[0].samples.items():
        progress(f"0 nodes held: {c}: {got.cores:.3f} cores {got.rss / 2**20:.0f} MiB")
    t0 = time.monotonic()
    follower = Follower(core, pool_selector(pool), t0)
    try:
        for k, nodes in enumerate(steps):
            before = set(follower.seen)
            start = time.monotonic() - t0
            progress(f"growing the pool to {nodes} nodes")
            if k == 0:
                create_pool(custom, pool, profile, nodes)
            else:
                custom.patch_cluster_custom_object_scale(GROUP, VERSION, PLURAL, pool, {"spec": {"replicas": nodes}})
            wait_until(f"{nodes} nodes made", lambda n=nodes: follower.counts()[0] >= n, timeout)
            wait_until(f"{nodes} nodes Ready", lambda n=nodes: follower.counts()[1] >= n, timeout)
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
            wait_until("every node of the pool gone", lambda: follower.counts()[0] == 0, timeout)
        follower.stop.set()
    return result
