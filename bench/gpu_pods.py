"""GPU pods scheduled onto a set of nodes, timed: what the virtual-node benches compare between Mokka's
nodes and fake-gpu-operator's (``mokka bench cluster --virtual``, ``mokka bench fleet --pods``).

A Deployment of one-GPU pods (``nvidia.com/gpu: 1`` each) with a node selector is created through the
API; the seconds until every pod is bound to a node and until every pod is Running are read from
listing its pods twice a second; the Deployment is deleted after, and its pods waited out, so that
whatever runs next finds the nodes empty.
"""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["SchedulingError", "deployment", "schedule"]

NAME = "bench-schedule"


class SchedulingError(Exception):
    """The pods did not get where they were going in time; the message says which step."""


def deployment(name: str, replicas: int, selector: dict[str, str]) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods asking for one GPU each, on nodes matching ``selector``."""
    container = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": selector, "containers": [container]},
            },
        },
    }


def schedule(
    api: Any, selector: dict[str, str], pods: int, namespace: str = "default", timeout: float = 900
) -> tuple[float, float]:
    """Seconds from creating a Deployment of ``pods`` one-GPU pods on nodes matching ``selector`` (in
    ``namespace``, through API client ``api``) until every pod is bound to a node, and until every pod
    is Running; the Deployment is deleted after and its pods waited out."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)

    def listed() -> list[dict[str, Any]]:
        found = core.list_namespaced_pod(namespace, label_selector=f"app={NAME}", _preload_content=False)
        return json.loads(found.data)["items"]  # type: ignore[no-any-return]

    t0 = time.monotonic()
    try:
        apps.create_namespaced_deployment(namespace, deployment(NAME, pods, selector))
    except ApiException as exc:
        raise SchedulingError(f"Deployment {namespace}/{NAME}: {exc.reason}: {str(exc.body)[:300]}") from None
    bound = running = 0.0
    try:
        while not running:
            if time.monotonic() - t0 > timeout:
                step = "Running" if bound else "bound to a node"
                raise SchedulingError(f"{pods} one-GPU pods on {selector}: not all {step} within {timeout:g} s")
            time.sleep(0.5)
            items = listed()
            if not bound and sum(1 for p in items if p["spec"].get("nodeName")) == pods:
                bound = time.monotonic() - t0
            if bound and sum(1 for p in items if p["status"].get("phase") == "Running") == pods:
                running = time.monotonic() - t0
    finally:
        apps.delete_namespaced_deployment(NAME, namespace, propagation_policy="Foreground")
        deadline = time.monotonic() + timeout
        while listed() and time.monotonic() < deadline:
            time.sleep(0.5)
    return bound, running
