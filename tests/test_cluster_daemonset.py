"""The Helm chart's DaemonSet itself on a real kubelet, from Mokka's node image assembled without
Docker (localcluster.nodeimage, imported with ctr): its privileged init container stages the node,
its NRI plugin (probed on /healthz and /readyz by kubelet) gives an unmodified pod the profile's
GPUs, and deleting the DaemonSet undoes the staged node through the preStop hook.

The cluster here runs no NRI plugin and no device plugin of its own: the chart's pod is the one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import install_chart, pod_manifest, run_pod, start_cluster, wait_for

from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAMESPACE = "mokka-system"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("kube"), allocator="none", nri_plugin=False) as c:
        yield c


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api())


@pytest.fixture(scope="module")
def release(cluster: Cluster, core: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = cluster.layout.base / "chart-node"
    values = {
        "gpu": {"profile": "a100", "count": 2},
        "hostSetup": {"root": str(root), "runNvidia": {"enabled": False}},
        "nodeInfo": {"enabled": False},  # the node labeller in-cluster: test_cluster_fleet_chart
    }
    rendered = install_chart(cluster, NAMESPACE, values, tmp_path_factory.mktemp("chart"))
    yield {"rendered": rendered, "root": root}
    cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=rendered, check=False)


def daemonset_ready(cluster: Cluster) -> bool:
    out = cluster.kubectl("get", "daemonset", "-n", NAMESPACE, "-o", "json").stdout
    items = json.loads(out)["items"]
    return bool(items) and items[0]["status"].get("numberReady", 0) == 1


def test_daemonset_stages_the_node_and_its_plugin_serves_pods(
    cluster: Cluster, core: Any, release: dict[str, Any]
) -> None:
    try:
        wait_for(
            "the DaemonSet's pod Ready (init containers done, probes passing)", lambda: daemonset_ready(cluster), 180
        )
    except AssertionError:
        pods = cluster.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout
        raise AssertionError(pods[-3000:]) from None
    root: Path = release["root"]
    assert json.loads((root / "node.json").read_text())["profile"] == "a100"
    res = run_pod(core, pod_manifest("plain", ["nvidia-smi", "-L"]))
    assert res.phase == "Succeeded", res.logs
    assert res.logs.count("NVIDIA A100") == 2, res.logs


def test_deleting_the_daemonset_undoes_the_node(cluster: Cluster, core: Any, release: dict[str, Any]) -> None:
    cluster.kubectl("delete", "-f", "-", "--wait=true", "--timeout=120s", input=release["rendered"])

    def pods_gone() -> bool:
        return not core.list_namespaced_pod(NAMESPACE).items

    wait_for("the DaemonSet's pod gone", pods_gone, 120)
    root: Path = release["root"]
    assert not (root / "node.json").exists()
    assert [p for p in root.rglob("*") if not p.is_dir()] == []
    res = run_pod(core, pod_manifest("after", ["sh", "-c", "nvidia-smi -L; ls /dev | grep -c nvidia; true"]))
    assert "GPU 0" not in res.logs, res.logs
