"""The fleet controller's own metrics (Prometheus' text format on ``/metrics``, by the
prometheus_client library), so a scale run can be watched and read back: per pool its nodes,
Ready nodes, allocatable and unhealthy GPUs; the nodes made and deleted; how long reconciles and
templates take; whether this replica leads."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

__all__ = ["Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.nodes = Gauge("mokka_fleet_pool_nodes", "Nodes of the pool that exist.", ["pool"], registry=r)
        self.wanted = Gauge("mokka_fleet_pool_nodes_wanted", "The pool's replicas.", ["pool"], registry=r)
        self.ready = Gauge("mokka_fleet_pool_nodes_ready", "Nodes of the pool that are Ready.", ["pool"], registry=r)
        self.gpus = Gauge(
            "mokka_fleet_pool_allocatable_gpus", "GPUs allocatable over the pool's Ready nodes.", ["pool"], registry=r
        )
        self.unhealthy = Gauge(
            "mokka_fleet_pool_unhealthy_gpus", "GPUs of the pool made unhealthy by a fault entry.", ["pool"], registry=r
        )
        self.made = Counter("mokka_fleet_nodes_created", "Nodes made (also one deleted by hand).", registry=r)
        self.deleted = Counter("mokka_fleet_nodes_deleted", "Nodes deleted beyond a pool's replicas.", registry=r)
        self.renewed = Counter("mokka_fleet_nodes_renewed", "Nodes brought in step with their pool.", registry=r)
        self.reconcile = Histogram(
            "mokka_fleet_reconcile_seconds",
            "One pool reconciled: its nodes read, made, renewed, deleted and its status written.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.template = Histogram(
            "mokka_fleet_template_seconds",
            "A pool's template computed (its profile staged, NVIDIA's GFD run once).",
            buckets=(0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.leader = Gauge("mokka_fleet_leader", "1 while this replica reconciles (holds the Lease).", registry=r)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes (`mokka bench fleet`)

    def pool(self, name: str, status: dict[str, Any], unhealthy: int) -> None:
        self.nodes.labels(name).set(status.get("replicas", 0))
        self.ready.labels(name).set(status.get("readyReplicas", 0))
        self.gpus.labels(name).set(status.get("allocatableGPUs", 0))
        self.unhealthy.labels(name).set(unhealthy)

    def forget(self, name: str) -> None:
        """Pool ``name`` is gone: its series go too."""
        for gauge in (self.nodes, self.wanted, self.ready, self.gpus, self.unhealthy):
            with contextlib.suppress(KeyError):
                gauge.remove(name)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
