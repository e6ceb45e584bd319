"""`mokka bench dra`: claim created → pod Running, NVIDIA's DRA driver beside Mokka's own, in one run.

Two clusters of the same two nodes in one NVLink rack (``h100:1@r1`` twice), one after the other:
``--allocator dra`` (Mokka's DRA plugin) and ``--allocator nvidia-dra`` (NVIDIA's chart). On each,
``rounds`` times: a ResourceClaim of one GPU (DeviceClass ``gpu.nvidia.com``) and a pod using it are
created, and the time until the API server reports the pod Running is taken (then both are deleted
and gone before the next round). On NVIDIA's, also a ComputeDomain of two nodes and a workload pod
on each node claiming its channel: domain created → both pods Running (the controller's claim
template, the node labels, the IMEX daemons starting and connecting, the channels prepared); then
everything is deleted and the daemons gone.

There are no targets: the figures are printed side by side, with NVIDIA's over Mokka's as a ratio.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import _row
from localcluster.addons import nvidia_dra
from localcluster.cluster import Cluster, ClusterError, Options
from localcluster.images import WORKLOAD_IMAGE
from localcluster.nodespec import NodeSpec

NODES = (NodeSpec("h100", 1, "r1"), NodeSpec("h100", 1, "r1"))
POLL = 0.02  # the timed waits' resolution
TIMEOUT = 180.0


def _pod(name: str, claim: dict[str, str], node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "dev", **claim}],
        "containers": [
            {
                "name": "main",
                "image": WORKLOAD_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "dev"}]},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}  # the scheduler allocates the claim
    meta = {"name": name, "annotations": {"mokka.io/inject": "false"}}  # the drivers' path alone
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _phase(c: Cluster, pod: str) -> str:
    try:
        return str(c.get(f"/api/v1/namespaces/default/pods/{pod}").get("status", {}).get("phase", ""))
    except ClusterError:
        return ""


def _gone(c: Cluster, path: str) -> bool:
    try:
        c.get(path)
        return False
    except ClusterError as exc:
        return "404" in str(exc)


def gpu_claim(c: Cluster, i: int) -> float:
    """ResourceClaim of one GPU and a pod using it created → the pod Running (seconds)."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"bench-{i}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": nvidia_dra.GPU_DRIVER}}]}},
    }
    t0 = time.monotonic()
    c.post("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim)
    c.post("/api/v1/namespaces/default/pods", _pod(f"bench-{i}", {"resourceClaimName": f"bench-{i}"}))
    c.wait(f"pod bench-{i} Running", lambda: _phase(c, f"bench-{i}") == "Running", TIMEOUT, poll=POLL)
    took = time.monotonic() - t0
    pod = f"/api/v1/namespaces/default/pods/bench-{i}"
    rc = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/bench-{i}"
    c.delete(pod)
    c.delete(rc)
    c.wait(f"pod and claim bench-{i} gone", lambda: _gone(c, pod) and _gone(c, rc), TIMEOUT)
    return took


def compute_domain(c: Cluster, i: int) -> float:
    """ComputeDomain of two nodes and a workload pod on each claiming its channel created → both
    pods Running (seconds)."""
    name, template = f"bench-cd-{i}", f"bench-cd-{i}-channel"
    t0 = time.monotonic()
    domains = "/apis/resource.nvidia.com/v1beta1/namespaces/default/computedomains"
    c.post(domains, nvidia_dra.compute_domain(name, 2, template))
    pods = [f"{name}-{n.name}" for n in c.nodes]
    for pod, n in zip(pods, c.nodes, strict=True):
        c.post("/api/v1/namespaces/default/pods", _pod(pod, {"resourceClaimTemplateName": template}, n.name))
    c.wait(f"{name}'s workloads Running", lambda: all(_phase(c, p) == "Running" for p in pods), TIMEOUT, poll=POLL)
    took = time.monotonic() - t0
    for pod in pods:
        c.delete(f"/api/v1/namespaces/default/pods/{pod}")
    cd = f"{domains}/{name}"
    c.wait(
        f"{name}'s workloads gone", lambda: all(_gone(c, f"/api/v1/namespaces/default/pods/{p}") for p in pods), TIMEOUT
    )
    c.delete(cd)
    daemons = f"/api/v1/namespaces/{nvidia_dra.NAMESPACE}/pods?labelSelector={nvidia_dra.DAEMON_LABEL}"
    c.wait(f"{name} and its daemons gone", lambda: _gone(c, cd) and not c.get(daemons).get("items"), TIMEOUT)
    return took


def run(rounds: int, svg: Path | None = None) -> None:
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="mokka-bench-dra-") as tmp:
        for allocator in ("dra", "nvidia-dra"):
            options = Options(base=Path(tmp) / allocator, nodes=NODES, allocator=allocator)
            c = Cluster.up(options, progress=lambda s: None)
            try:
                for i in range(rounds):
                    results.setdefault(f"{allocator} gpu", []).append(gpu_claim(c, i))
                    if allocator == "nvidia-dra":
                        results.setdefault("compute domain", []).append(compute_domain(c, i))
            finally:
                if problems := c.down():
                    raise ClusterError("; ".join(problems))
    mokka, nvidia, cd = (statistics.median(results[k]) for k in ("dra gpu", "nvidia-dra gpu", "compute domain"))
    print(f"{'figure':<46}{'median':>10}    {'':>16}", flush=True)
    _row(f"1 GPU, Mokka's DRA plugin: claim -> Running, {rounds}x", mokka)
    _row(f"1 GPU, NVIDIA's DRA driver: claim -> Running, {rounds}x", nvidia)
    _row("  ratio (NVIDIA's / Mokka's)", nvidia / mokka, unit="")
    _row(f"2-node ComputeDomain: created -> 2 pods Running, {rounds}x", cd)
    _row("  ratio (domain / NVIDIA's 1 GPU)", cd / nvidia, unit="")
    for key, values in results.items():
        print(f"{'  spread ' + key:<46}{min(values):>6.2f}-{max(values):.2f} s", flush=True)
    if svg is not None:
        from bench import plot

        groups = {
            "1 GPU, claim -> Running": {"Mokka's DRA plugin": mokka, "NVIDIA's DRA driver": nvidia},
            "2-node ComputeDomain": {"NVIDIA's DRA driver": cd},
        }
        title = f"DRA: created -> pods Running, median of {rounds}"
        print(f"plot: {plot.bars(svg / 'dra-claims.svg', title, 's', groups)}", flush=True)
