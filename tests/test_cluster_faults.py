"""Faults on a real Kubernetes node (localcluster: kubelet, API server, NVIDIA's device plugin
v0.18.0 in envvar mode): the kubelet's allocatable `nvidia.com/gpu` drops by exactly the GPU an
Xid made unhealthy, whether the fault came from `mokka fault` or from the fault ConfigMap the
node's watcher (k8snode.faultwatch, what the chart runs) applies without any restart.

The watcher runs as a host process with the cluster's kubeconfig: in this cluster the pod
network cannot reach the API server (no kube-proxy), so the chart's watcher container could not
either (the chart's wiring is checked by tests/test_chart.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

GPUS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from cluster_fixtures import start_cluster

    with start_cluster(tmp_path_factory.mktemp("kube-faults"), gpus=GPUS) as c:
        yield c


def test_the_kubelet_sees_exactly_the_faulted_gpus_go(cluster: Any) -> None:
    from cluster_fixtures import wait_for
    from kubernetes import client

    from gpumodel import faults

    core = client.CoreV1Api(cluster.api())
    root = Path(cluster.node().layout.node_root)
    node = cluster.node_name
    wait_for("all GPUs allocatable", lambda: cluster.allocatable_gpus() == GPUS, 120)

    watcher = subprocess.Popen(
        [sys.executable, "-m", "k8snode.faultwatch", "--root", str(root), "--configmap", "mokka-faults",
         "--namespace", "default", "--node", node],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []  # the watcher's output as it comes (it reports after each change is made)
    reader = threading.Thread(target=lambda: lines.extend(iter(watcher.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        entry = "steps: [{gpu: 3, xid: 79}, {gpu: 0, temperature: 88}]"
        core.create_namespaced_config_map(
            "default", {"metadata": {"name": "mokka-faults"}, "data": {node: entry, "another-node": "steps: []"}}
        )
        wait_for("GPU 3 unhealthy", lambda: cluster.allocatable_gpus() == GPUS - 1, 120)
        target = faults.for_root(root)
        assert faults.applied_tag(target) != 0
        assert faults.active(target)[0] == ["temperature 88 C"]

        # the CLI, on the same node
        subprocess.run([sys.executable, "-m", "mokka.cli", "fault", "xid", "48", "--gpu", "1", "--root", str(root)],
                       check=True, capture_output=True)  # fmt: skip
        wait_for("GPU 1 unhealthy too", lambda: cluster.allocatable_gpus() == GPUS - 2, 120)

        # the key removed: the node is back to its profile (the plugin keeps what it marked)
        core.patch_namespaced_config_map(
            "mokka-faults", "default", [{"op": "remove", "path": f"/data/{node}"}],
            _content_type="application/json-patch+json",
        )  # fmt: skip
        wait_for("faults cleared", lambda: faults.applied_tag(target) == 0, 60)
        assert all(active[0].startswith("events raised") for active in faults.active(target).values())
        wait_for("the watcher's report of it", lambda: any("no entry" in line for line in lines), 30)
    finally:
        watcher.terminate()
        watcher.wait(timeout=30)
        reader.join(timeout=30)
        core.delete_namespaced_config_map("mokka-faults", "default")
    out = "".join(lines)
    assert f"ConfigMap default/mokka-faults key {node}: 2 fault(s) to apply" in out, out
    assert "no entry: faults cleared" in out, out
