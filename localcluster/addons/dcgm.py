"""NVIDIA's dcgm-exporter as a DaemonSet of the local cluster (``mokka cluster up --dcgm-exporter``).

Its image is built without Docker: the exporter's binary (``$MOKKA_DCGM_DIR``, else the checkout's
``../shared/thirdparty/dcgm``, see :mod:`fetch.dcgm_exporter`), its default counters and the glibc
it links, on busybox; nothing NVIDIA's beyond that. What makes it work on the node is the GPU stack:
the NRI plugin gives the container (``NVIDIA_VISIBLE_DEVICES=all``, as GPU Operator's DaemonSet
asks) the mock libnvidia-ml and libdcgm, and ``--kubernetes`` maps GPUs to the pods holding them
through the kubelet's pod-resources socket (a hostPath), as on a real node."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from containers import images as oci
from fetch import dcgm_exporter
from virtualfleet.pool import real_nodes_affinity

from ..errors import ClusterError
from ..nodewatch import ready
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["DcgmExporter", "metrics", "ready_pods"]

IMAGE = "localhost/mokka/dcgm-exporter:1"
NAMESPACE = "gpu-monitoring"
NAME = "dcgm-exporter"
PORT = 9400
COUNTERS = "/etc/dcgm-exporter/default-counters.csv"
POD_RESOURCES = "/var/lib/kubelet/pod-resources"


class ExporterUnavailable(RuntimeError):
    """No dcgm-exporter binary or counters: the message says where they were looked for."""


# Where the GPU Operator's DaemonSet points the exporter (DCGM_EXPORTER_COLLECTORS): the image
# built for it carries the exporter's default counters there too.
OPERATOR_COLLECTORS = "/etc/dcgm-exporter/dcp-metrics-included.csv"


def build_image(out: Path, cache: Path, name: str = IMAGE, collectors: str | None = None) -> Path:
    """The exporter's OCI archive under ``out``, named ``name``; the exporter is its entrypoint
    (a pod's ``args`` follow it); ``collectors``: another path holding its default counters."""
    try:
        exe = dcgm_exporter.binary(cache / "dcgm-exporter")
    except dcgm_exporter.ExporterMissing as exc:
        raise ExporterUnavailable(str(exc)) from None
    counters = dcgm_exporter.default_counters()
    if counters is None:
        raise ExporterUnavailable(f"no default-counters.csv beside the exporter (${dcgm_exporter.ENV_DIR})")
    root = oci.make_rootfs(out / "dcgm-exporter-rootfs", programs=[exe], cache=cache)
    shutil.copy2(exe, root / "usr/bin/dcgm-exporter")
    for path in dict.fromkeys((COUNTERS, collectors or COUNTERS)):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(counters, root / path.lstrip("/"))
    env = [oci.PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"]  # as NVIDIA's image: the runtime gives it the GPUs
    archive = oci.oci_archive(
        root, out / "dcgm-exporter.tar", name, cmd=[], entrypoint=["/usr/bin/dcgm-exporter"], env=env
    )
    shutil.rmtree(root)
    return archive


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def daemonset() -> dict[str, Any]:
    """One exporter per real node (virtual nodes have no kubelet to run it)."""
    labels = {"app.kubernetes.io/name": NAME}
    container = {
        "name": NAME,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        # Startup validation asks ldconfig's cache for libdcgm.so.4; this image has no ldconfig.
        "command": ["/usr/bin/dcgm-exporter"],
        "args": ["-f", COUNTERS, "--kubernetes", "--disable-startup-validate"],
        "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "ports": [{"name": "metrics", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 2},
        "volumeMounts": [{"name": "pod-resources", "mountPath": POD_RESOURCES, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": real_nodes_affinity(),
                    "containers": [container],
                    "volumes": [{"name": "pod-resources", "hostPath": {"path": POD_RESOURCES, "type": "Directory"}}],
                },
            },
        },
    }


def metrics_path(pod: str) -> str:
    """The API server's proxy to a pod's /metrics."""
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:{PORT}/proxy/metrics"


class DcgmExporter(AddOn):
    """The add-on: the image imported into every real node, the DaemonSet, a Ready pod per node."""

    def up(self, ctx: Context, kit: Kit) -> None:
        from fetch import debcache

        with ctx.step("dcgm-exporter DaemonSet (NVIDIA's exporter on the mock libdcgm, --kubernetes)"):
            try:
                tarball = build_image(ctx.layout.images, ctx.cache or debcache.default_cache())
            except ExporterUnavailable as exc:
                raise ClusterError(f"--dcgm-exporter: {exc}") from None
            ctx.import_image(tarball)
            ctx.apiserver.post("/api/v1/namespaces", namespace())
            ctx.apiserver.post(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets", daemonset())
            ctx.wait("dcgm-exporter pods Ready on every node", lambda: len(ready_pods(ctx)) == len(ctx.nodes))


def ready_pods(ctx: Context) -> dict[str, str]:
    """The Ready dcgm-exporter pods, by node name."""
    pods = ctx.apiserver.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io/name={NAME}")
    return {pod["spec"]["nodeName"]: pod["metadata"]["name"] for pod in pods.get("items", []) if ready(pod)}


def metrics(ctx: Context, node: str | None = None) -> str:
    """The /metrics of the dcgm-exporter on ``node`` (the first node by default)."""
    name = node or ctx.nodes[0].name
    pod = ready_pods(ctx).get(name)
    if pod is None:
        raise ClusterError(f"no Ready dcgm-exporter pod on {name}")
    return ctx.apiserver.get_text(metrics_path(pod), timeout=10)
