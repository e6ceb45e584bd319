"""Virtual GPU nodes beside a real one: 200 KWOK nodes carrying what a real h100 node shows the API
(GFD's labels, 8 allocatable GPUs), a 1000-replica GPU Deployment scheduled over them by the real
scheduler, faults on one of them, the DRA variant, and run:ai's fake-gpu-operator serving a pool
of its own from the chart's profile ConfigMaps (its real binaries, from ``shared/thirdparty``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import start_cluster, wait_for

from bench import gpu_pods
from gpumodel import fleet
from gpumodel.profile import format_guid
from localcluster.addons import fgo
from localcluster.addons.fgo import FgoSpec
from localcluster.cluster import Cluster
from virtualfleet.pool import VirtualSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
FGO_DIR = REPO.parent / "shared" / "thirdparty" / "fake-gpu-operator"
VIRTUAL = 200
FGO_NODES = 20
REPLICAS = 1000


def fgo_available() -> bool:
    return bool(os.environ.get(fgo.ENV_DIR)) or (FGO_DIR / "status-updater.xz").is_file()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pools: tuple[FgoSpec, ...] = ()
    if fgo_available():
        os.environ.setdefault(fgo.ENV_DIR, str(FGO_DIR))
        pools = (FgoSpec("fgo", "h100", FGO_NODES),)
    with start_cluster(
        tmp_path_factory.mktemp("virtual"), virtual=(VirtualSpec("h100", None, VIRTUAL),), fgo=pools
    ) as c:
        yield c


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api())


def virtual_nodes(core: Any, selector: str = "mokka.io/virtual=true") -> list[dict[str, Any]]:
    return list(json.loads(core.list_node(label_selector=selector, _preload_content=False).data)["items"])


def ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or [])


def mokka(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True, timeout=120)


def test_every_virtual_node_is_ready_with_eight_gpus(core: Any) -> None:
    nodes = virtual_nodes(core)
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(f"virtual-h100-{i}" for i in range(VIRTUAL))
    assert all(ready(n) for n in nodes)
    assert {n["status"]["allocatable"]["nvidia.com/gpu"] for n in nodes} == {"8"}
    assert {n["status"]["capacity"]["nvidia.com/gpu"] for n in nodes} == {"8"}
    assert {n["metadata"]["annotations"]["kwok.x-k8s.io/node"] for n in nodes} == {"fake"}
    assert {n["metadata"]["labels"]["type"] for n in nodes} == {"kwok"}


def test_virtual_labels_equal_gfds_on_the_real_node(cluster: Cluster, core: Any) -> None:
    real = core.read_node(cluster.node_name).metadata.labels
    gfd = {k: v for k, v in real.items() if k.startswith("nvidia.com/")}
    assert len(gfd) >= 20 and gfd["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    for node in virtual_nodes(core)[:: VIRTUAL // 10]:
        mine = {k: v for k, v in node["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
        assert mine == gfd, node["metadata"]["name"]


def test_the_kubelet_node_is_not_kwoks(cluster: Cluster, core: Any) -> None:
    real = core.read_node(cluster.node_name)
    assert "kwok.x-k8s.io/node" not in (real.metadata.annotations or {})
    assert "mokka.io/virtual" not in real.metadata.labels
    assert real.status.node_info.kubelet_version.startswith("v1.")
    assert not real.status.node_info.kubelet_version.startswith("kwok")


def test_status_summarises_the_virtual_pool(cluster: Cluster) -> None:
    res = mokka("cluster", "status", "--dir", str(cluster.layout.base))
    assert res.returncode == 0, res.stdout + res.stderr
    row = next(ln.split() for ln in res.stdout.splitlines() if ln.startswith("h100 "))
    assert row == ["h100", "h100", str(VIRTUAL), str(VIRTUAL), str(8 * VIRTUAL), str(8 * VIRTUAL), "0"]


def test_a_thousand_gpu_pods_are_scheduled_over_the_virtual_nodes(cluster: Cluster, core: Any) -> None:
    from kubernetes import client

    apps = client.AppsV1Api(cluster.api())
    deployment = gpu_pods.deployment("many", REPLICAS, {"mokka.io/virtual": "true"})
    apps.create_namespaced_deployment("default", deployment)
    try:

        def running() -> list[dict[str, Any]] | None:
            pods = json.loads(
                core.list_namespaced_pod("default", label_selector="app=many", _preload_content=False).data
            )["items"]
            up = [p for p in pods if p["status"].get("phase") == "Running"]
            return up if len(up) == REPLICAS else None

        pods = wait_for(f"{REPLICAS} pods Running", running, timeout=300)
        per_node: dict[str, int] = {}
        for p in pods:
            per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
        assert all(n.startswith("virtual-h100-") for n in per_node)
        assert max(per_node.values()) <= 8  # the scheduler counted each node's 8 GPUs
        assert len(per_node) > REPLICAS // 8
    finally:
        apps.delete_namespaced_deployment("many", "default")

        def gone() -> bool:
            items = core.list_namespaced_pod("default", label_selector="app=many", _preload_content=False)
            return not json.loads(items.data)["items"]

        wait_for("the Deployment's pods deleted", gone, timeout=300)


def gpu_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "containers": [container]},
    }


def test_a_virtual_node_with_its_gpus_taken_takes_no_more(core: Any) -> None:
    core.create_namespaced_pod("default", gpu_pod("all-eight", "virtual-h100-9", 8))
    core.create_namespaced_pod("default", gpu_pod("one-more", "virtual-h100-9", 1))
    try:
        wait_for(
            "the 8-GPU pod Running", lambda: core.read_namespaced_pod("all-eight", "default").status.phase == "Running"
        )

        def unschedulable() -> bool:
            conds = core.read_namespaced_pod("one-more", "default").status.conditions or []
            return any(c.reason == "Unschedulable" and "nvidia.com/gpu" in (c.message or "") for c in conds)

        wait_for("the 9th GPU's pod Unschedulable (Insufficient nvidia.com/gpu)", unschedulable, timeout=60)
    finally:
        for name in ("all-eight", "one-more"):
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_fault_on_a_virtual_node_takes_one_gpu_away(cluster: Cluster, core: Any) -> None:
    node, where = "virtual-h100-7", ["--node", "virtual-h100-7", "--cluster-dir", str(cluster.layout.base)]

    def allocatable() -> str:
        return str(core.read_node(node).status.allocatable["nvidia.com/gpu"])

    res = mokka("fault", "xid", "79", "--gpu", "3", *where)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "GPU 3: unhealthy (Xid 79); AcceleratedHardwareReady=False NvidiaXID79Error (Xid 79)"
    assert allocatable() == "7" and core.read_node(node).status.capacity["nvidia.com/gpu"] == "8"
    condition = {c.type: c for c in core.read_node(node).status.conditions}["AcceleratedHardwareReady"]
    assert (condition.status, condition.reason, condition.message) == ("False", "NvidiaXID79Error", "GPU 3: Xid 79")
    # NVLink: not the device plugin's to watch, the node health agent's condition only.
    res = mokka("fault", "nvlink", "1", "down", "--gpu", "0", *where)
    assert res.stdout.strip() == "GPU 0: AcceleratedHardwareReady=False NvidiaNVLinkError (NVLink 1 down)"
    assert allocatable() == "7"
    condition = {c.type: c for c in core.read_node(node).status.conditions}["AcceleratedHardwareReady"]
    assert condition.message == "GPU 0: NVLink 1 down; GPU 3: Xid 79"
    listed = mokka("fault", "list", *where)
    assert "GPU 3:" in listed.stdout and "Xid 79" in listed.stdout
    # An application Xid leaves the GPU healthy, as NVIDIA's device plugin does.
    res = mokka("fault", "xid", "13", "--gpu", "4", *where)
    assert res.returncode == 0 and "application error" in res.stdout and allocatable() == "7"
    # By UUID, as the device plugin names the GPU.
    uuid = fleet.gpu_identity("h100", node, 5)[0]
    assert mokka("fault", "lost", "--gpu", uuid, *where).returncode == 0 and allocatable() == "6"
    bad = mokka("fault", "temperature", "95", "--gpu", "0", *where)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "no NVML" in bad.stderr
    assert mokka("fault", "clear", *where).returncode == 0
    assert allocatable() == "8"
    condition = {c.type: c for c in core.read_node(node).status.conditions}["AcceleratedHardwareReady"]
    assert (condition.status, condition.reason) == ("True", "NvidiaAcceleratedHardwareIsReady")
    assert core.read_node("virtual-h100-8").status.allocatable["nvidia.com/gpu"] == "8"  # its neighbour untouched


# ---------------------------------------------------------------- fake-gpu-operator


@pytest.fixture(scope="module")
def fgo_pool(cluster: Cluster) -> FgoSpec:
    if not cluster.fgo_pools:
        pytest.skip(f"fake-gpu-operator's binaries: neither {fgo.ENV_DIR} nor {FGO_DIR} has them")
    return cluster.fgo_pools[0]


def test_fgo_nodes_show_the_chart_profiles_gpus(cluster: Cluster, core: Any, fgo_pool: FgoSpec) -> None:
    nodes = virtual_nodes(core, f"{fgo.FGO_POOL_LABEL}={fgo_pool.pool}")
    assert len(nodes) == FGO_NODES and all(ready(n) for n in nodes)
    for n in nodes:
        labels = n["metadata"]["labels"]
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8", n["metadata"]["name"]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["nvidia.com/gpu.memory"] == "81559"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert "mokka.io/virtual" not in labels
    # FGO leaves Mokka's nodes alone: no pool label on the real one, none on Mokka's virtual ones.
    real = core.read_node(cluster.node_name).metadata.labels
    assert fgo.POOL_KEY not in real and "run.ai/fake.gpu" not in real
    assert all(fgo.POOL_KEY not in n["metadata"]["labels"] for n in virtual_nodes(core)[:20])
    res = mokka("cluster", "status", "--dir", str(cluster.layout.base))
    row = next(ln.split() for ln in res.stdout.splitlines() if ln.startswith(f"{fgo_pool.pool} "))
    assert row[:5] == [fgo_pool.pool, "h100", str(FGO_NODES), str(FGO_NODES), str(8 * FGO_NODES)]


def test_a_gpu_pod_on_an_fgo_node_goes_running(core: Any, fgo_pool: FgoSpec) -> None:
    pod = gpu_pod("on-fgo", "", 2)
    pod["spec"]["nodeSelector"] = {fgo.POOL_KEY: fgo_pool.pool}
    core.create_namespaced_pod("default", pod)
    try:
        found = wait_for(
            "the pod Running on an FGO node",
            lambda: (p := core.read_namespaced_pod("on-fgo", "default")).status.phase == "Running" and p,
            timeout=60,
        )
        assert found.spec.node_name.startswith(f"fgo-{fgo_pool.pool}-")
    finally:
        core.delete_namespaced_pod("on-fgo", "default", grace_period_seconds=0)


# ---------------------------------------------------------------- DRA


@pytest.fixture(scope="module")
def dra_cluster(tmp_path_factory: pytest.TempPathFactory, cluster: Cluster) -> Iterator[Cluster]:
    with start_cluster(
        tmp_path_factory.mktemp("virtual-dra"), allocator="dra", virtual=(VirtualSpec("h100", 2, 3),)
    ) as c:
        yield c


def slice_of(c: Cluster, node: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    items = json.loads(
        c.kubectl("get", "resourceslices", f"--field-selector=spec.nodeName={node}", "-o", "json").stdout
    )
    (found,) = [s for s in items["items"] if s["spec"]["driver"] == driver]
    return dict(found)


def test_a_virtual_node_publishes_the_dra_plugins_devices(dra_cluster: Cluster) -> None:
    real = slice_of(dra_cluster, dra_cluster.node_name)["spec"]["devices"]
    mine = slice_of(dra_cluster, "virtual-h100-2-1")
    assert mine["spec"]["driver"] == "gpu.nvidia.com" and mine["spec"]["pool"]["name"] == "virtual-h100-2-1"
    devices = mine["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert [d["attributes"]["uuid"]["string"] for d in devices] == [
        fleet.gpu_identity("h100", "virtual-h100-2-1", i)[0] for i in range(2)
    ]
    for d, r in zip(devices, real, strict=False):
        assert {k: v for k, v in d["attributes"].items() if k != "uuid"} == {
            k: v for k, v in r["attributes"].items() if k != "uuid"
        }
        assert d["capacity"] == r["capacity"]
    # The GPUs are the slice's devices only: no node resource, as on the real node with the DRA driver.
    gpu_resources = [
        {k for k in n["status"]["capacity"] if k.startswith("nvidia.com/")}
        for n in (json.loads(dra_cluster.kubectl("get", "node", name, "-o", "json").stdout)
                  for name in (dra_cluster.node_name, "virtual-h100-2-1"))
    ]  # fmt: skip
    assert gpu_resources == [set(), set()]


def test_a_virtual_node_publishes_its_adapters_as_a_real_node_does(dra_cluster: Cluster) -> None:
    """The NIC driver's slice of a virtual node: the real node's adapters of its GPUs (the same
    attributes, pcieRoot beside each GPU's included), with the node's own GUIDs."""
    real = slice_of(dra_cluster, dra_cluster.node_name, "nic.mokka.io")["spec"]["devices"]
    mine = slice_of(dra_cluster, "virtual-h100-2-1", "nic.mokka.io")["spec"]["devices"]
    gpus = slice_of(dra_cluster, "virtual-h100-2-1")["spec"]["devices"]
    assert [d["name"] for d in mine] == ["mlx5-0", "mlx5-1"]
    root = "resource.kubernetes.io/pcieRoot"
    assert [d["attributes"][root] for d in mine] == [g["attributes"][root] for g in gpus]
    # a 2-GPU node spreads its GPUs, and so their adapters, over both sockets: NUMA nodes 0 and 1
    assert [d["attributes"]["resource.kubernetes.io/numaNode"] for d in mine] == [{"int": 0}, {"int": 1}]
    own = ("nodeGUID", "resource.kubernetes.io/numaNode")
    for d, r in zip(mine, real, strict=False):
        assert {k: v for k, v in d["attributes"].items() if k not in own} == {
            k: v for k, v in r["attributes"].items() if k not in own
        }
    guids = [d["attributes"]["nodeGUID"]["string"] for d in mine]
    assert guids == [format_guid(fleet.adapter_guid("h100", "virtual-h100-2-1", n)) for n in range(2)]
    assert not set(guids) & {r["attributes"]["nodeGUID"]["string"] for r in real}


def test_a_dra_claim_is_allocated_on_a_virtual_node(dra_cluster: Cluster) -> None:
    manifest = textwrap.dedent(
        """
        apiVersion: resource.k8s.io/v1
        kind: ResourceClaimTemplate
        metadata: {name: one-gpu}
        spec:
          spec:
            devices:
              requests:
              - name: gpu
                exactly: {deviceClassName: gpu.nvidia.com}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {name: claimer}
        spec:
          nodeSelector: {mokka.io/virtual-pool: h100-2}
          resourceClaims:
          - {name: gpu, resourceClaimTemplateName: one-gpu}
          containers:
          - name: main
            image: busybox
            resources: {claims: [{name: gpu}]}
        """
    )
    dra_cluster.kubectl("apply", "-f", "-", input=manifest)

    def pod() -> dict[str, Any]:
        return dict(json.loads(dra_cluster.kubectl("get", "pod", "claimer", "-o", "json").stdout))

    wait_for("the claim's pod Running", lambda: pod()["status"].get("phase") == "Running", timeout=90)
    node = pod()["spec"]["nodeName"]
    claim = pod()["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    got = json.loads(dra_cluster.kubectl("get", "resourceclaim", claim, "-o", "json").stdout)
    (result,) = got["status"]["allocation"]["devices"]["results"]
    assert node.startswith("virtual-h100-2-") and result["pool"] == node and result["driver"] == "gpu.nvidia.com"
    dra_cluster.kubectl("delete", "pod", "claimer", "--grace-period=0")
    dra_cluster.kubectl("delete", "resourceclaimtemplate", "one-gpu")


def test_a_fault_on_a_virtual_dra_node_takes_the_device_out_of_its_slice(dra_cluster: Cluster) -> None:
    where = ["--node", "virtual-h100-2-0", "--cluster-dir", str(dra_cluster.layout.base)]
    before = slice_of(dra_cluster, "virtual-h100-2-0")
    assert mokka("fault", "xid", "79", "--gpu", "1", *where).returncode == 0
    after = slice_of(dra_cluster, "virtual-h100-2-0")
    assert [d["name"] for d in after["spec"]["devices"]] == ["gpu-0"]
    assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"] + 1
    assert mokka("fault", "clear", *where).returncode == 0
    assert [d["name"] for d in slice_of(dra_cluster, "virtual-h100-2-0")["spec"]["devices"]] == ["gpu-0", "gpu-1"]


# ---------------------------------------------------------------- MIG


def test_virtual_nodes_carry_the_mig_resources_and_labels(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A pool of a MIG profile with --mig-strategy mixed: the device plugin's MIG resources and GFD's
    MIG labels, as on the real node of the same profile."""
    from kubernetes import client
    from mig_fixtures import mig_profile_data, write_profile

    tmp = tmp_path_factory.mktemp("virtual-mig")
    data = mig_profile_data("h100", 2, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "1g.10gb"}])
    source = str(write_profile(tmp / "mig.yaml", data))
    with start_cluster(
        tmp / "kube", profile=source, mig_strategy="mixed", virtual=(VirtualSpec(source, None, 2),)
    ) as c:
        core = client.CoreV1Api(c.api())

        def nvidia(node: str) -> tuple[dict[str, str], dict[str, str]]:
            n = core.read_node(node)
            labels = {k: v for k, v in n.metadata.labels.items() if k.startswith("nvidia.com/")}
            return labels, {k: v for k, v in n.status.allocatable.items() if k.startswith("nvidia.com/")}

        real = nvidia(c.node_name)
        assert real[1] == {"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "2"}
        assert real[0]["nvidia.com/mig-1g.10gb.count"] == "2" and real[0]["nvidia.com/mig.strategy"] == "mixed"
        for node in ("virtual-mig-0", "virtual-mig-1"):
            assert nvidia(node) == real, node


def test_bad_virtual_and_fgo_options_are_one_line() -> None:
    for args, words in (
        (["--virtual", "h100"], "expected PROFILE[:GPUS]=COUNT"),
        (["--virtual", "h100=-1"], "whole number from 0"),  # (h100=0 is an empty pool: valid)
        (["--virtual", "nope=3"], "nope"),
        (["--fgo", "pool=h100"], "expected POOL=PROFILE:COUNT"),
        (["--fgo", "Pool=h100:2"], "lowercase"),
    ):
        res = mokka("cluster", "up", "--dir", "/nonexistent/x", *args)
        assert res.returncode != 0 and words in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr


def test_fgo_without_its_binaries_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != fgo.ENV_DIR}
    res = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "cluster", "up", "--dir", str(tmp_path / "c"), "--fgo", "p=h100:2"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert res.returncode != 0 and fgo.ENV_DIR in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
