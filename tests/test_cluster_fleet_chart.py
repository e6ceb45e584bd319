"""The Helm chart's DaemonSet on a fleet of two real nodes: one pod per real node and none on a
virtual one (a Node object without a kubelet, labelled as KWOK's are); each node's pod stages that
node (its /var/lib/mokka is the node's own) and serves its pods; its node labeller and fault
watcher reach the API server from inside the cluster, and the fault ConfigMap's entry for one node
changes that node alone; a node whose pod is deleted gets it back while the other keeps serving; a
rolling update replaces the pods node by node.

As in test_cluster_daemonset, the cluster runs no NRI plugin and no device plugin of its own: the
chart's pods are the GPU stack.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster_fixtures import install_chart, pod_manifest, run_pod, start_cluster, wait_for

from localcluster.cluster import Cluster
from localcluster.nodespec import NodeSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAMESPACE = "mokka-system"
NODES = ["h100-0", "t4-1"]
VIRTUAL = "virtual-0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    specs = (NodeSpec("h100", 1), NodeSpec("t4", 1))
    with start_cluster(tmp_path_factory.mktemp("fleet-chart"), nodes=specs, allocator="none", nri_plugin=False) as c:
        yield c


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api())


@pytest.fixture(scope="module")
def release(cluster: Cluster, core: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from kubernetes import client

    virtual = {"type": "kwok", "mokka.io/virtual": "true", "kubernetes.io/hostname": VIRTUAL}
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=VIRTUAL, labels=virtual)))
    values = {
        "gpu": {"profile": "t4", "count": 1},
        "hostSetup": {"runNvidia": {"enabled": False}},  # the default root, /var/lib/mokka: each node's own
        # In-cluster API access (the `kubernetes` Service through kube-proxy): the node labeller and the
        # fault watcher run on every node.
        "nodeInfo": {"enabled": True},
        "faults": {"enabled": True},
    }
    rendered = install_chart(cluster, NAMESPACE, values, tmp_path_factory.mktemp("chart"))
    yield rendered
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", "-", input=rendered, check=False
    )
    core.delete_node(VIRTUAL)


def daemonset(cluster: Cluster) -> dict[str, Any]:
    items = json.loads(cluster.kubectl("get", "daemonset", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    return items[0] if items else {}


def pods(core: Any) -> dict[str, Any]:
    """The DaemonSet's live pods by node (a deleted pod on its way out is not counted)."""
    live = [p for p in core.list_namespaced_pod(NAMESPACE).items if p.metadata.deletion_timestamp is None]
    return {p.spec.node_name: p for p in live}


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def all_ready(cluster: Cluster, core: Any) -> bool:
    ds = daemonset(cluster).get("status", {})
    return ds.get("numberReady") == len(NODES) and ds.get("updatedNumberScheduled") == len(NODES)


def wait_ready(cluster: Cluster, core: Any, what: str) -> None:
    try:
        wait_for(what, lambda: all_ready(cluster, core), 240)
    except AssertionError:
        raise AssertionError(cluster.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout[-4000:]) from None


def serves(core: Any, node: str, name: str) -> str:
    manifest = pod_manifest(name, ["nvidia-smi", "-L"])
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    res = run_pod(core, manifest)
    assert res.phase == "Succeeded", res.logs
    return res.logs


def test_one_pod_per_real_node_and_none_on_the_virtual_one(cluster: Cluster, core: Any, release: str) -> None:
    wait_ready(cluster, core, "a DaemonSet pod Ready on every real node")
    assert sorted(pods(core)) == NODES
    assert daemonset(cluster)["status"]["desiredNumberScheduled"] == len(NODES)  # the virtual node is no target


def test_each_nodes_pod_stages_that_node_and_serves_it(cluster: Cluster, core: Any, release: str) -> None:
    for n in cluster.nodes:
        staged = n.layout.private("/var/lib/mokka") / "node.json"  # the node's own /var/lib/mokka
        assert json.loads(staged.read_text())["profile"] == "t4", n.name
        assert serves(core, n.name, f"on-{n.name}").count("Tesla T4") == 1


def test_the_node_labeller_labels_each_real_node_from_inside(core: Any, release: str) -> None:
    for node in NODES:
        meta = core.read_node(node).metadata
        assert "mokka.io/node-identity" in (meta.annotations or {}), node
        assert meta.labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert "mokka.io/node-identity" not in (core.read_node(VIRTUAL).metadata.annotations or {})


def faults_in_effect(n: Any) -> str:
    """`mokka fault list` on the node (in its namespace: its /var/lib/mokka, where its chart pod staged it)."""
    res = n.run([sys.executable, "-m", "mokka.cli", "fault", "list", "--root", "/var/lib/mokka"], timeout=60)
    assert res.returncode == 0, res.stderr
    return str(res.stdout)


def test_a_fault_entry_for_one_node_changes_that_node_alone(cluster: Cluster, core: Any, release: str) -> None:
    name = next(d["metadata"]["name"] for d in yaml.safe_load_all(release) if d and d["kind"] == "ConfigMap"
                and d["metadata"]["name"].endswith("-faults"))  # fmt: skip
    core.patch_namespaced_config_map(name, NAMESPACE, {"data": {"t4-1": "steps: [{gpu: 0, xid: 79}]"}})
    t4, h100 = cluster.node("t4-1"), cluster.node("h100-0")
    lost = "lost (fell off the bus)"  # what Xid 79 does to the GPU
    wait_for("t4-1's watcher to apply its entry", lambda: lost in faults_in_effect(t4), 90)
    assert faults_in_effect(h100).strip() == "no faults in effect"
    core.patch_namespaced_config_map(name, NAMESPACE, [{"op": "remove", "path": "/data/t4-1"}])
    wait_for("t4-1 back to its profile", lambda: lost not in faults_in_effect(t4), 90)
    assert "Xid 79" in faults_in_effect(t4)  # the event stays in its history, as a real driver's log does


def test_a_deleted_pod_comes_back_while_the_other_node_serves(cluster: Cluster, core: Any, release: str) -> None:
    old = pods(core)["h100-0"].metadata.uid
    core.delete_namespaced_pod(pods(core)["h100-0"].metadata.name, NAMESPACE, grace_period_seconds=30)
    assert serves(core, "t4-1", "meanwhile").count("Tesla T4") == 1  # the other node's pod is untouched

    def replaced() -> bool:
        pod = pods(core).get("h100-0")
        return pod is not None and pod.metadata.uid != old and ready(pod)

    wait_for("a new pod Ready on h100-0", replaced, 240)
    wait_ready(cluster, core, "the DaemonSet whole again")
    assert serves(core, "h100-0", "restored").count("Tesla T4") == 1


def test_a_rolling_update_goes_node_by_node(cluster: Cluster, core: Any, release: str) -> None:
    before = {node: p.metadata.uid for node, p in pods(core).items()}
    patch = {"spec": {"template": {"metadata": {"annotations": {"mokka.io/rollout": str(time.time())}}}}}
    name = daemonset(cluster)["metadata"]["name"]
    cluster.kubectl("patch", "daemonset", name, "-n", NAMESPACE, "--type", "merge", "-p", json.dumps(patch))
    fewest_ready, replaced_order = len(NODES), []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        now = pods(core)
        fewest_ready = min(fewest_ready, sum(1 for node in NODES if node in now and ready(now[node])))
        for node, p in now.items():
            if p.metadata.uid != before.get(node) and ready(p) and node not in replaced_order:
                replaced_order.append(node)
        if len(replaced_order) == len(NODES) and all_ready(cluster, core):
            break
        time.sleep(0.2)
    assert sorted(replaced_order) == NODES, f"not every pod was replaced: {replaced_order}"
    assert fewest_ready >= len(NODES) - 1, "the rollout took more than one node's pod down at once"
