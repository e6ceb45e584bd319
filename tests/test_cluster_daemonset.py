"""The Helm chart's DaemonSet itself on a real kubelet, from Mokka's node image assembled without
Docker (localcluster.nodeimage, imported with ctr): its privileged init container stages the node,
its NRI plugin (probed on /healthz and /readyz by kubelet) gives an unmodified pod the profile's
GPUs, and deleting the DaemonSet undoes the staged node through the preStop hook.

The cluster here runs no NRI plugin and no device plugin of its own: the chart's pod is the one.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_chart
import yaml
from cluster_fixtures import pod_manifest, run_pod, start_cluster, wait_for

from localcluster import nodeimage
from localcluster.cluster import Cluster
from testbed import nvidia_smi, prepare, versions

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
    image = nodeimage.build(tmp_path_factory.mktemp("node-image"), nvidia_smi.fetch("550"))
    cluster.import_image(image)
    repository, tag = nodeimage.NODE_IMAGE.rsplit(":", 1)
    helm = prepare.go_binary(versions.HELM)  # built by .ci/setup --tests
    root = cluster.layout.base / "chart-node"
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "gpu": {"profile": "a100", "count": 2},
        "hostSetup": {"root": str(root), "runNvidia": {"enabled": False}},
        # The pod network cannot reach the API server here (loopback only, no kube-proxy).
        "nodeInfo": {"enabled": False},
    }
    values_file = tmp_path_factory.mktemp("values") / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    argv = [str(helm), "template", "node", str(test_chart.CHART), "-n", NAMESPACE, "-f", str(values_file)]
    rendered = subprocess.run(
        [*argv, "--kube-version", version.lstrip("v")], capture_output=True, text=True, check=True
    ).stdout
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("apply", "--server-side", "--validate=strict", "-f", "-", input=rendered)
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
