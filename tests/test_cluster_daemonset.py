"""The Helm chart's DaemonSet itself on a real kubelet, from Mokka's node image assembled without
Docker (localcluster.nodeimage, imported with ctr): its privileged init container stages the node,
its NRI plugin (probed on /healthz and /readyz by kubelet) gives an unmodified pod the profile's
GPUs, and deleting the DaemonSet undoes the staged node through the preStop hook. Then a release
with ``dra.enabled``: its DRA plugin publishes the node's GPUs and InfiniBand adapters, the
scheduler pairs a GPU with the adapter on its PCIe switch for a claim, the pod sees exactly that
pair, and deleting the DaemonSet takes the node's slices away.

The cluster here runs no NRI plugin, no device plugin and no DRA driver of its own: the chart's pod
is the one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import claim_pod, gpu_and_its_nic, install_chart, pod_manifest, run_pod, start_cluster, wait_for

from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAMESPACE = "mokka-system"
DRA_NAMESPACE = "mokka-dra"  # the second release's
GPU_DRIVER, NIC_DRIVER = "gpu.nvidia.com", "nic.mokka.io"
RDMA_IMAGE = "localhost/mokka/rdma:1"


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


def daemonset_ready(cluster: Cluster, namespace: str = NAMESPACE) -> bool:
    out = cluster.kubectl("get", "daemonset", "-n", namespace, "-o", "json").stdout
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


# ---------------------------------------------------------------------------------------- dra.enabled


@pytest.fixture(scope="module")
def dra_release(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart with its defaults (root /var/lib/mokka in the node's namespace, kubelet's and CDI's
    directories) and ``dra.enabled``: two A100s, each with its ConnectX-6 on its PCIe switch."""
    values = {"gpu": {"profile": "a100", "count": 2}, "dra": {"enabled": True}, "nodeInfo": {"enabled": False}}
    rendered = install_chart(cluster, DRA_NAMESPACE, values, tmp_path_factory.mktemp("dra-chart"))
    try:
        wait_for("the DRA release's pod Ready", lambda: daemonset_ready(cluster, DRA_NAMESPACE), 180)
    except AssertionError:
        pods = cluster.kubectl("describe", "pods", "-n", DRA_NAMESPACE, check=False).stdout
        raise AssertionError(pods[-3000:]) from None
    yield rendered
    cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=rendered, check=False)


def slices(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """The node's published devices by driver."""
    items = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    out: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        assert item["spec"]["nodeName"] == cluster.node_name, item["metadata"]["name"]
        out.setdefault(item["spec"]["driver"], []).extend(item["spec"]["devices"])
    return out


def test_dra_plugin_publishes_the_gpus_and_their_adapters(cluster: Cluster, dra_release: str) -> None:
    published = wait_for("both drivers' slices", lambda: (got := slices(cluster)) and len(got) == 2 and got, 90)
    assert sorted(d["name"] for d in published[GPU_DRIVER]) == ["gpu-0", "gpu-1"]
    assert sorted(d["name"] for d in published[NIC_DRIVER]) == ["mlx5-0", "mlx5-1"]
    root = "resource.kubernetes.io/pcieRoot"
    gpu_roots = {d["name"]: d["attributes"][root]["string"] for d in published[GPU_DRIVER]}
    nic_roots = {d["name"]: d["attributes"][root]["string"] for d in published[NIC_DRIVER]}
    assert {n: [g for g, r in gpu_roots.items() if r == nr] for n, nr in nic_roots.items()} == {
        "mlx5-0": ["gpu-0"],
        "mlx5-1": ["gpu-1"],
    }
    assert {d["attributes"]["productName"]["string"] for d in published[GPU_DRIVER]} == {"NVIDIA A100-SXM4-40GB"}
    classes = json.loads(cluster.kubectl("get", "deviceclasses", "-o", "json").stdout)["items"]
    assert {c["metadata"]["name"] for c in classes} >= {GPU_DRIVER, NIC_DRIVER}


def test_dra_claim_gets_a_gpu_and_the_adapter_on_its_switch(
    cluster: Cluster, dra_release: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """GPU 1 and any adapter sharing its pcieRoot: the pod sees that GPU and mlx5_1, PIX apart, in
    nvidia-smi topo -m (nvidia-smi comes with the GPU's CDI device), and mlx5_1 alone in ibv_devices."""
    import rdma_image as builder

    from fetch import nvidia_smi
    from gpumodel.native import library_path

    mounted = [nvidia_smi.fetch("550"), library_path()]
    cluster.import_image(builder.build(tmp_path_factory.mktemp("rdma"), RDMA_IMAGE, ["ibv_devices"], mounted=mounted))
    probe = "nvidia-smi topo -m; echo ---; ibv_devices; echo devices: $(ls /dev/infiniband)"
    devices = gpu_and_its_nic(1, GPU_DRIVER, NIC_DRIVER)
    cluster.kubectl("apply", "-f", "-", input=claim_pod("pair", probe=probe, devices=devices, image=RDMA_IMAGE))
    try:

        def finished() -> str | None:
            pod = json.loads(cluster.kubectl("get", "pod", "pair", "-o", "json").stdout)
            return pod["status"].get("phase") if pod["status"].get("phase") in ("Succeeded", "Failed") else None

        phase = wait_for("pod pair finished", finished, 120)
        out = cluster.kubectl("logs", "pair").stdout
        assert phase == "Succeeded", out
        topo, verbs = out.split("---\n", 1)
        assert re.findall(r"(GPU\d+|NIC\d+)\t", topo.splitlines()[0]) == ["GPU0", "NIC0"], out
        assert "NIC0: mlx5_1" in topo and "GPU1" not in topo, out
        row = next(line.split("\t") for line in topo.splitlines() if line.startswith("GPU0"))
        assert row[2].strip() == "PIX", out
        assert [ln.split()[0] for ln in verbs.split("devices:")[0].splitlines()[2:] if ln.strip()] == ["mlx5_1"], out
        assert verbs.split("devices:")[1].split() == ["issm1", "rdma_cm", "umad1", "uverbs1"], out
    finally:
        cluster.kubectl("delete", "pod", "pair", "--wait=false", check=False)
        cluster.kubectl("delete", "resourceclaimtemplate", "pair", check=False)


def test_dra_deleting_the_daemonset_unpublishes_the_node(cluster: Cluster, dra_release: str) -> None:
    """The DRA plugin's preStop deletes the node's slices of both drivers: a node the plugin left
    advertises no devices."""
    cluster.kubectl("delete", "daemonset", "-n", DRA_NAMESPACE, "--all", "--wait=true", "--timeout=120s")
    wait_for("the node's slices gone", lambda: slices(cluster) == {}, 60)
