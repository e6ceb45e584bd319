"""NVIDIA's dcgm-exporter as a DaemonSet of the local cluster (`mokka cluster up --dcgm-exporter`), on
the mock libdcgm the NRI plugin injects: every GPU of the node is a series, and with --kubernetes the
two GPUs the device plugin gave a pod carry that pod's labels through the kubelet's pod-resources
API, the others none. Skips where no dcgm-exporter binary is at hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import pod_manifest, start_cluster, wait_for

from fetch import dcgm_exporter
from localcluster.addons import dcgm
from localcluster.cluster import Cluster

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        dcgm_exporter.default_counters() is None,
        reason=f"no dcgm-exporter (../shared/thirdparty/dcgm or ${dcgm_exporter.ENV_DIR})",
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("dcgm-cluster"), gpus=4, dcgm_exporter=True) as c:
        yield c


def temperatures(cluster: Cluster) -> list[dcgm_exporter.Sample]:
    return [s for s in dcgm_exporter.parse(dcgm.metrics(cluster)) if s.name == "DCGM_FI_DEV_GPU_TEMP"]


def test_the_exporter_serves_every_gpu_of_the_node(cluster: Cluster) -> None:
    series = temperatures(cluster)
    assert sorted(s.labels["gpu"] for s in series) == ["0", "1", "2", "3"], series
    assert {s.labels["hostname"] for s in series} == {"localhost"}, series  # NODE_NAME: the pod's node


def test_a_pods_gpus_carry_its_labels(cluster: Cluster, tmp_path: Path) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    manifest = pod_manifest("train", ["sh", "-c", "echo visible: $NVIDIA_VISIBLE_DEVICES; sleep 600"], gpus=2)
    core.create_namespaced_pod("default", manifest)
    try:

        def visible() -> list[str] | None:
            pod = core.read_namespaced_pod("train", "default")
            if pod.status.phase != "Running":
                return None
            logs = core.read_namespaced_pod_log("train", "default", _preload_content=False).data.decode()
            line = next((ln for ln in logs.splitlines() if ln.startswith("visible:")), "visible:")
            return line.split(":", 1)[1].replace(",", " ").split() or None  # None until it is logged

        uuids = wait_for("pod train Running with its GPUs", visible, 90)
        assert len(uuids) == 2

        def labelled() -> list[dcgm_exporter.Sample] | None:
            series = temperatures(cluster)
            return series if any(s.labels.get("pod") == "train" for s in series) else None

        series = wait_for("the exporter's pod labels", labelled, 60)
        held = sorted(s.labels["UUID"] for s in series if s.labels.get("pod") == "train")
        assert held == sorted(uuids), series
        assert all(s.labels.get("namespace") == "default" for s in series if s.labels.get("pod") == "train")
        assert sum(1 for s in series if not s.labels.get("pod")) == 2, series

        # The pod's container is a process on its two GPUs (the NRI plugin lists it): their memory
        # used is its default 1024 MiB; the exporter itself (NVIDIA_VISIBLE_DEVICES=all) is none.
        def used() -> dict[str, float]:
            text = dcgm.metrics(cluster)
            return {s.labels["UUID"]: s.value for s in dcgm_exporter.parse(text) if s.name == "DCGM_FI_DEV_FB_USED"}

        fb = wait_for("the pod's memory on its GPUs", lambda: used() if sum(used().values()) else None, 30)
        assert {u for u, mib in fb.items() if mib >= 1024} == set(uuids), fb
        assert all(mib < 1024 for u, mib in fb.items() if u not in uuids), fb
    finally:
        core.delete_namespaced_pod("train", "default", grace_period_seconds=0)
