"""The chart's fleet (``fleet.enabled=true``: the VirtualGPUPool definition, the controller's
Deployment and KWOK's, from Mokka's image built here with NVIDIA's GFD and KWOK) on a real API server
(the session cluster), the chart's KWOK keeping the nodes Ready: a pool becomes nodes carrying exactly the GFD labels
of the cluster's real node of the same profile; ``kubectl scale`` adds and removes nodes; a node
deleted by hand comes back identical; racks; a KWOK node made elsewhere with the pool's label gets the
pool's surface; DRA pools, a profile from a ConfigMap; a bad pool is
told in its Ready condition; deleting a pool deletes its nodes; a new controller pod makes
byte-identical nodes; of two replicas one holds the Lease, and the other takes over when it goes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_fixtures import import_prometheus, install_chart, wait_for

from gpumodel import profile
from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

NS = "mokka-fleet"
POOL_LABEL = "mokka.io/virtual-pool"
CONTROLLER = "node-mokka-fleet"  # the Deployment (release "node", as install_chart names it)
LEASE = "mokka-fleet-controller"
VALUES: dict[str, Any] = {"fleet": {"enabled": True}, "faults": {"enabled": True}}
PROMETHEUS = "node-mokka-prometheus"  # the chart's integrations.prometheus Service
FAULTS = "node-mokka-faults"  # the chart's fault ConfigMap


def controller_pods(cluster: Cluster) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/name=mokka-fleet-controller"
    return json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", selector, "-o", "json").stdout)["items"]  # type: ignore[no-any-return]


def running(cluster: Cluster, replicas: int) -> list[str]:
    """The names of the controller's ``replicas`` pods once that many run (and no other)."""

    def done() -> list[str] | None:
        pods = controller_pods(cluster)
        live = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        return [p["metadata"]["name"] for p in live] if len(live) == replicas == len(pods) else None

    return wait_for(f"{replicas} fleet controller pod(s) Running", done, 120)  # type: ignore[no-any-return]


def holder(cluster: Cluster) -> str | None:
    res = cluster.kubectl("get", "lease", LEASE, "-n", NS, "-o", "jsonpath={.spec.holderIdentity}", check=False)
    return (res.stdout.strip() or None) if res.returncode == 0 else None


def logs(cluster: Cluster, pod: str) -> str:
    return cluster.kubectl("logs", "-n", NS, pod, check=False).stdout


@pytest.fixture(scope="module")
def fleet(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The chart's fleet: the CRD, the controller and KWOK, from Mokka's image built here."""
    tmp = tmp_path_factory.mktemp("fleet-controller")
    only = ("fleet-crd.yaml", "fleet-controller.yaml", "fleet-kwok.yaml", "faults.yaml", "prometheus.yaml")
    prometheus = {"enabled": True, "scrapeInterval": "2s", "image": import_prometheus(kube_cluster, tmp)}
    rendered = install_chart(kube_cluster, NS, {**VALUES, "integrations": {"prometheus": prometheus}}, tmp, only=only)
    try:
        leader = wait_for("the controller holding its Lease", lambda: holder(kube_cluster), 180)
        assert leader in running(kube_cluster, 1)
        yield kube_cluster
    finally:
        for item in kube_cluster.kubectl("get", "vgp", "-o", "name", check=False).stdout.split():
            kube_cluster.kubectl("delete", item, "--wait=true", check=False)
        wait_for("every virtual node gone", lambda: not nodes(kube_cluster, "mokka.io/virtual=true"), 120)
        kube_cluster.kubectl("delete", "-f", "-", "--wait=true", "--ignore-not-found", input=rendered, check=False)
        kube_cluster.kubectl("delete", "namespace", NS, "--wait=true", check=False)


def apply_pool(cluster: Cluster, name: str, **spec: Any) -> None:
    body = {"apiVersion": "mokka.io/v1alpha1", "kind": "VirtualGPUPool", "metadata": {"name": name}, "spec": spec}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))


def get_pool(cluster: Cluster, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "vgp", name, "-o", "json").stdout)  # type: ignore[no-any-return]


def nodes(cluster: Cluster, selector: str) -> dict[str, dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "nodes", "-l", selector, "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n for n in items}


def ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or [])


def settled(cluster: Cluster, name: str, replicas: int, timeout: float = 120) -> dict[str, Any]:
    """Pool ``name`` once ``replicas`` nodes are Ready and its status says so; its object."""

    def done() -> dict[str, Any] | None:
        got = get_pool(cluster, name)
        status = got.get("status") or {}
        ok = status.get("replicas") == replicas and status.get("readyReplicas") == replicas
        mine = nodes(cluster, f"{POOL_LABEL}={name}")
        return got if ok and len(mine) == replicas and all(ready(n) for n in mine.values()) else None

    try:
        return wait_for(f"pool {name}: {replicas} node(s) Ready", done, timeout)  # type: ignore[no-any-return]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{what_the_controller_did(cluster, name)}") from None


def what_the_controller_did(cluster: Cluster, name: str) -> str:
    """For a test that timed out: pool ``name``'s status, its nodes' Ready, the controller pods
    (restarts) and the last lines each logged."""
    got = cluster.kubectl("get", "vgp", name, "-o", "jsonpath={.status}", check=False)
    status = got.stdout.strip() or got.stderr.strip()
    mine = {n: ready(node) for n, node in nodes(cluster, f"{POOL_LABEL}={name}").items()}
    lines = [f"status: {status}", f"nodes Ready: {mine}", f"Lease holder: {holder(cluster)}"]
    for pod in controller_pods(cluster):
        restarts = [c.get("restartCount") for c in pod["status"].get("containerStatuses") or []]
        pod_name = pod["metadata"]["name"]
        lines.append(f"pod {pod_name}: {pod['status'].get('phase')}, restarts {restarts}")
        lines += [f"  {ln}" for ln in logs(cluster, pod_name).splitlines()[-25:]]
    return "\n".join(lines)


def gpu_labels(node: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in node["metadata"]["labels"].items() if k.startswith("nvidia.com/")}


def test_a_pool_becomes_nodes_with_the_gfd_labels_of_a_real_node(fleet: Cluster) -> None:
    real = fleet.node()
    prof = fleet.profiles[real.name]
    apply_pool(fleet, "alike", profile=prof.name, gpusPerNode=prof.gpu_count, replicas=3)
    got = settled(fleet, "alike", 3)
    status = got["status"]
    assert status["allocatableGPUs"] == 3 * prof.gpu_count and status["gpusPerNode"] == prof.gpu_count
    assert status["selector"] == f"{POOL_LABEL}=alike"
    assert [c["reason"] for c in status["conditions"]] == ["NodesReady"]
    real_labels = gpu_labels(nodes(fleet, f"kubernetes.io/hostname={real.name}")[real.name])
    real_labels.pop("nvidia.com/gfd.timestamp", None)
    for name, node in nodes(fleet, f"{POOL_LABEL}=alike").items():
        assert gpu_labels(node) == real_labels, name
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(prof.gpu_count)
        assert node["metadata"]["ownerReferences"][0]["kind"] == "VirtualGPUPool"
    columns = fleet.kubectl("get", "vgp", "alike", "--no-headers").stdout.split()
    assert columns[1:6] == [prof.name, str(prof.gpu_count), "3", "3", str(3 * prof.gpu_count)]


def test_kubectl_scale_adds_and_removes_nodes(fleet: Cluster) -> None:
    apply_pool(fleet, "scaled", profile="t4", replicas=2)
    settled(fleet, "scaled", 2)
    fleet.kubectl("scale", "vgp/scaled", "--replicas=5")
    settled(fleet, "scaled", 5)
    fleet.kubectl("scale", "vgp/scaled", "--replicas=1")
    settled(fleet, "scaled", 1)
    assert list(nodes(fleet, f"{POOL_LABEL}=scaled")) == ["virtual-scaled-0"]


def test_a_node_deleted_by_hand_comes_back_the_same(fleet: Cluster) -> None:
    apply_pool(fleet, "kept", profile="gb200", replicas=2)
    settled(fleet, "kept", 2)
    before = nodes(fleet, f"{POOL_LABEL}=kept")["virtual-kept-1"]
    fleet.kubectl("delete", "node", "virtual-kept-1", "--wait=true")
    settled(fleet, "kept", 2)

    def mine(node: dict[str, Any]) -> dict[str, str]:  # the controller's labels (the beta.* ones arrive later)
        return {k: v for k, v in node["metadata"]["labels"].items() if not k.startswith("beta.kubernetes.io/")}

    after = nodes(fleet, f"{POOL_LABEL}=kept")["virtual-kept-1"]
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert mine(after) == mine(before)
    assert after["status"]["capacity"] == before["status"]["capacity"]


def test_nodes_fill_racks_of_the_pools_size(fleet: Cluster) -> None:
    apply_pool(fleet, "racks", profile="gb200", rackSize=8, replicas=5)  # 4 GPUs a node: 2 nodes a rack
    got = settled(fleet, "racks", 5)
    assert got["status"]["racks"] == 3
    cliques = [
        gpu_labels(nodes(fleet, f"kubernetes.io/hostname=virtual-racks-{i}")[f"virtual-racks-{i}"]) for i in range(5)
    ]
    ids = [c["nvidia.com/gpu.clique"] for c in cliques]
    assert ids[0] == ids[1] != ids[2] == ids[3] != ids[4] and ids[0] != ids[4]


def test_a_kwok_node_someone_else_made_with_the_pools_label_gets_the_pools_surface(fleet: Cluster) -> None:
    """One node model, whoever made the node: a KWOK node made elsewhere (as an autoscaler's KWOK
    provider makes them) and labelled with the pool gets the GFD labels, GPUs and rack clique of the
    pool's next place; its own name, labels, resources and owner stay; the pool's replicas do not
    count it, its status does."""
    apply_pool(fleet, "adopt", profile="gb200", rackSize=8, replicas=1)  # 2 nodes a rack
    settled(fleet, "adopt", 1)
    node = "provisioned-1"
    theirs = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {POOL_LABEL: "adopt", "karpenter.sh/nodepool": "gpu", "kubernetes.io/hostname": "claim-1"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": theirs, "allocatable": theirs},
    }
    fleet.kubectl("create", "-f", "-", input=json.dumps(body))
    try:

        def decorated() -> dict[str, Any] | None:
            got = nodes(fleet, "karpenter.sh/nodepool=gpu").get(node)
            return got if got and got["status"]["allocatable"].get("nvidia.com/gpu") == "4" and ready(got) else None

        got = wait_for("the node made elsewhere decorated and Ready", decorated, 60)
        own = nodes(fleet, "kubernetes.io/hostname=virtual-adopt-0")["virtual-adopt-0"]
        assert gpu_labels(got) == gpu_labels(own)  # the same rack: the same clique
        assert got["metadata"]["labels"]["kubernetes.io/hostname"] == "claim-1"
        assert got["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu"
        assert "ownerReferences" not in got["metadata"]
        assert got["status"]["capacity"]["cpu"] == "32" and got["status"]["capacity"]["nvidia.com/gpu"] == "4"

        def counted() -> bool:
            status = get_pool(fleet, "adopt")["status"]
            return (status["replicas"], status["readyReplicas"], status["adoptedNodes"], status["allocatableGPUs"]) == (
                1, 1, 1, 8
            )  # fmt: skip

        wait_for("the pool's status counting it apart", counted)
        assert list(nodes(fleet, f"{POOL_LABEL}=adopt")) == [node, "virtual-adopt-0"]  # never deleted as surplus
    finally:
        fleet.kubectl("delete", "node", node, "--ignore-not-found", "--wait=true")


def test_a_dra_pool_publishes_a_resource_slice_per_node(fleet: Cluster) -> None:
    apply_pool(fleet, "dra", profile="h100", gpusPerNode=2, allocator="dra", replicas=2)
    got = settled(fleet, "dra", 2)
    assert got["status"]["allocatableGPUs"] == 4
    slices = json.loads(fleet.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    ours = [s for s in slices if s["spec"]["nodeName"].startswith("virtual-dra-")]
    mine = {s["spec"]["nodeName"]: s for s in ours if s["spec"]["driver"] == "gpu.nvidia.com"}
    assert sorted(mine) == ["virtual-dra-0", "virtual-dra-1"]
    uuids = [d["attributes"]["uuid"]["string"] for s in mine.values() for d in s["spec"]["devices"]]
    assert len(uuids) == 4 == len(set(uuids))
    # and each node's two InfiniBand adapters, as the DRA plugin publishes a real h100 node's
    nics = {s["spec"]["nodeName"]: s["spec"]["devices"] for s in ours if s["spec"]["driver"] == "nic.mokka.io"}
    assert {n: [d["name"] for d in ds] for n, ds in nics.items()} == {n: ["mlx5-0", "mlx5-1"] for n in mine}
    guids = [d["attributes"]["nodeGUID"]["string"] for ds in nics.values() for d in ds]
    assert len(guids) == 4 == len(set(guids))
    for name, node in nodes(fleet, f"{POOL_LABEL}=dra").items():
        assert "nvidia.com/gpu" not in node["status"]["capacity"], name
        assert mine[name]["metadata"]["ownerReferences"][0]["name"] == name


def set_faults(cluster: Cluster, entries: dict[str, str | None]) -> None:
    patch = json.dumps({"data": entries})
    cluster.kubectl("patch", "configmap", FAULTS, "-n", NS, "--type", "merge", "-p", patch)


def allocatable(cluster: Cluster, node: str) -> tuple[str, str]:
    got = nodes(cluster, f"kubernetes.io/hostname={node}")[node]["status"]
    return got["allocatable"]["nvidia.com/gpu"], got["capacity"]["nvidia.com/gpu"]


def test_the_fault_config_map_reaches_virtual_nodes_as_the_device_plugin_shows_faults(fleet: Cluster) -> None:
    apply_pool(fleet, "faulty", profile="h100", gpusPerNode=4, replicas=2)
    settled(fleet, "faulty", 2)
    try:
        set_faults(fleet, {"virtual-faulty-1": "steps: [{gpu: 2, xid: 79}]", "virtual-faulty-0": "steps: [{xid: 13}]"})
        wait_for(
            "GPU 2 of virtual-faulty-1 out of allocatable", lambda: allocatable(fleet, "virtual-faulty-1")[0] == "3"
        )
        assert allocatable(fleet, "virtual-faulty-1") == ("3", "4")  # capacity stays, as the device plugin's
        assert allocatable(fleet, "virtual-faulty-0") == ("4", "4")  # Xid 13: an application error, still healthy
        wait_for("the pool's status", lambda: get_pool(fleet, "faulty")["status"]["allocatableGPUs"] == 7)
        set_faults(fleet, {"virtual-faulty-1": "steps: [{gpu: 9, xid: 79}]"})  # no GPU 9: changes nothing
        set_faults(fleet, {"virtual-faulty-1": None, "virtual-faulty-0": None})
        wait_for("healthy again", lambda: allocatable(fleet, "virtual-faulty-1") == ("4", "4"))
    finally:
        set_faults(fleet, {"virtual-faulty-1": None, "virtual-faulty-0": None})


def test_a_fault_takes_the_gpu_out_of_a_dra_nodes_slice(fleet: Cluster) -> None:
    apply_pool(fleet, "dra-faulty", profile="h100", gpusPerNode=2, allocator="dra", replicas=1)
    settled(fleet, "dra-faulty", 1)
    node = "virtual-dra-faulty-0"

    def devices() -> list[str]:
        slices = json.loads(fleet.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
        return [
            d["name"]
            for s in slices
            if s["spec"]["nodeName"] == node and s["spec"]["driver"] == "gpu.nvidia.com"
            for d in s["spec"]["devices"]
        ]

    try:
        assert devices() == ["gpu-0", "gpu-1"]
        set_faults(fleet, {node: "steps: [{gpu: 0, ecc: {uncorrected: 1}}]"})
        wait_for("gpu-0 out of the slice", lambda: devices() == ["gpu-1"])
        set_faults(fleet, {node: None})
        wait_for("gpu-0 back", lambda: devices() == ["gpu-0", "gpu-1"])
    finally:
        set_faults(fleet, {node: None})


def health(node: dict[str, Any]) -> tuple[str | None, str, str]:
    """A node's clique label and its AcceleratedHardwareReady condition's status and reason."""
    cond = next(c for c in node["status"]["conditions"] if c["type"] == "AcceleratedHardwareReady")
    return node["metadata"]["labels"].get("nvidia.com/gpu.clique"), cond["status"], cond["reason"]


def test_a_rack_marked_down_and_what_the_device_plugin_does_not_watch(fleet: Cluster) -> None:
    """The fault ConfigMap's key naming a rack reaches each node of it: their fabric probes In
    Progress take the clique label away (as GFD gives none) and set AcceleratedHardwareReady False as
    the EKS node monitoring agent would; an NVLink down sets it False on its node alone, its GPU still
    allocatable (the device plugin does not watch NVLink); removing the entries restores both."""
    apply_pool(fleet, "rackfault", profile="gb200", rackSize=8, replicas=4)  # 2 nodes a rack
    settled(fleet, "rackfault", 4)
    names = [f"virtual-rackfault-{i}" for i in range(4)]
    before = nodes(fleet, f"{POOL_LABEL}=rackfault")
    racks = [before[n]["metadata"]["labels"]["mokka.io/rack"] for n in names]
    assert racks[0] == racks[1] != racks[2] == racks[3]
    ready_ = ("True", "NvidiaAcceleratedHardwareIsReady")
    assert all(health(before[n])[1:] == ready_ and health(before[n])[0] for n in names)
    entries: dict[str, str | None] = {
        racks[0]: "steps: [{fabric: {state: in-progress}}]",
        names[3]: "steps: [{gpu: 0, nvlink: {link: 1, state: down}}]",
    }
    try:
        set_faults(fleet, entries)

        def shown() -> dict[str, tuple[str | None, str, str]] | None:
            now = {n: health(o) for n, o in nodes(fleet, f"{POOL_LABEL}=rackfault").items()}
            # each node is its own update (its status, then its labels): wait for all three whole
            down = ("False", "FabricManagerNotRunning")
            rack = all(now[names[i]][0] is None and now[names[i]][1:] == down for i in (0, 1))
            return now if rack and now[names[3]][1] == "False" else None

        now = wait_for("the rack's nodes and the NVLink node unready", shown, 60)
        assert now[names[2]] == health(before[names[2]])
        assert now[names[3]] == (health(before[names[3]])[0], "False", "NvidiaNVLinkError")
        assert allocatable(fleet, names[3]) == ("4", "4")
        set_faults(fleet, {k: None for k in entries})
        wait_for(
            "every node as before",
            lambda: (
                {n: health(o) for n, o in nodes(fleet, f"{POOL_LABEL}=rackfault").items()}
                == {n: health(o) for n, o in before.items()}
            ),
            60,
        )
    finally:
        set_faults(fleet, {k: None for k in entries})
        fleet.kubectl("delete", "vgp", "rackfault", "--wait=true", check=False)


def test_a_profile_of_ones_own_from_a_config_map(fleet: Cluster) -> None:
    text = profile.load("l40s").model_dump_json()
    fleet.kubectl("create", "configmap", "my-board", "-n", "default", f"--from-literal=board.yaml={text}")
    try:
        ref = {"name": "my-board", "namespace": "default", "key": "board.yaml"}
        apply_pool(fleet, "mine", profileConfigMap=ref, gpusPerNode=2, replicas=1)
        node = next(iter(nodes(fleet, f"{POOL_LABEL}=mine").values())) if settled(fleet, "mine", 1) else {}
        assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"].startswith("NVIDIA-L40S")
    finally:
        fleet.kubectl("delete", "configmap", "my-board", "-n", "default", check=False)


@pytest.mark.parametrize(
    ("ref", "reason", "says"),
    [
        (
            {"name": "nowhere", "namespace": "default"},
            "ProfileNotFound",
            "ConfigMap default/nowhere key profile.yaml: ",
        ),
        (
            {"name": "bad-board", "namespace": "default"},
            "InvalidProfile",
            "ConfigMap default/bad-board key profile.yaml",
        ),
    ],
)
def test_a_pool_that_cannot_be_made_says_why_in_its_condition(
    fleet: Cluster, ref: dict[str, str], reason: str, says: str
) -> None:
    fleet.kubectl("create", "configmap", "bad-board", "-n", "default", "--from-literal=profile.yaml=gpu_count: zero")
    try:
        apply_pool(fleet, "broken", profileConfigMap=ref)

        def told() -> dict[str, Any] | None:
            conditions = (get_pool(fleet, "broken").get("status") or {}).get("conditions") or []
            return conditions[0] if conditions and conditions[0]["reason"] == reason else None

        condition = wait_for(f"the pool's condition {reason}", told, 60)
        assert condition["status"] == "False" and condition["message"].startswith(says), condition
        assert "\n" not in condition["message"]
        assert not nodes(fleet, f"{POOL_LABEL}=broken")
    finally:
        fleet.kubectl("delete", "vgp", "broken", "--wait=true", check=False)
        fleet.kubectl("delete", "configmap", "bad-board", "-n", "default", check=False)


def test_deleting_a_pool_deletes_its_nodes(fleet: Cluster) -> None:
    apply_pool(fleet, "gone", profile="t4", replicas=3)
    settled(fleet, "gone", 3)
    fleet.kubectl("delete", "vgp", "gone", "--wait=true")
    wait_for("the pool's nodes deleted by the garbage collector", lambda: not nodes(fleet, f"{POOL_LABEL}=gone"), 120)


def test_a_new_controller_pod_makes_byte_identical_nodes(fleet: Cluster) -> None:
    apply_pool(fleet, "again", profile="gb300", allocator="dra", replicas=3)
    settled(fleet, "again", 3)

    def facts() -> list[Any]:
        mine = nodes(fleet, f"{POOL_LABEL}=again")
        slices = json.loads(fleet.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
        devices = sorted(
            (s["spec"]["nodeName"], json.dumps(s["spec"]["devices"], sort_keys=True))
            for s in slices
            if s["spec"]["nodeName"] in mine
        )
        labels = {n: x["metadata"]["labels"] for n, x in mine.items()}
        own = {n: {k: v for k, v in ls.items() if not k.startswith("beta.")} for n, ls in labels.items()}
        return [sorted((n, json.dumps(v, sort_keys=True)) for n, v in own.items()), devices]

    before = facts()
    old = running(fleet, 1)[0]
    fleet.kubectl("delete", "pod", "-n", NS, old, "--wait=true")  # a fresh one: no template computed yet
    fleet.kubectl("delete", "nodes", "-l", f"{POOL_LABEL}=again", "--wait=true")
    new = running(fleet, 1)[0]
    assert new != old
    settled(fleet, "again", 3, timeout=180)
    assert len(before[1]) == 6  # each node's GPUs and its InfiniBand adapters
    wait_for("every node's ResourceSlices back", lambda: len(facts()[1]) == len(before[1]), 60)
    assert facts() == before
    assert "pool again: template of gb300 computed" in logs(fleet, new)


def test_the_controllers_metrics_follow_its_pools(fleet: Cluster) -> None:
    """/metrics (Prometheus' text format) through the API server's proxy to the controller's pod."""
    from prometheus_client.parser import text_string_to_metric_families

    apply_pool(fleet, "watched", profile="t4", gpusPerNode=2, replicas=3)
    settled(fleet, "watched", 3)
    (pod,) = running(fleet, 1)

    def samples() -> dict[tuple[str, str], float]:
        text = fleet.kubectl("get", "--raw", f"/api/v1/namespaces/{NS}/pods/{pod}:8080/proxy/metrics").stdout
        return {
            (s.name, s.labels.get("pool", "")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    got = wait_for(
        "the pool in the metrics",
        lambda: s if (s := samples()).get(("mokka_fleet_pool_nodes_ready", "watched")) == 3 else None,
    )
    assert got[("mokka_fleet_pool_nodes", "watched")] == 3 and got[("mokka_fleet_pool_nodes_wanted", "watched")] == 3
    assert got[("mokka_fleet_pool_allocatable_gpus", "watched")] == 6
    assert got[("mokka_fleet_pool_unhealthy_gpus", "watched")] == 0
    assert got[("mokka_fleet_leader", "")] == 1
    assert got[("mokka_fleet_nodes_created_total", "")] >= 3
    assert got[("mokka_fleet_reconcile_seconds_count", "")] >= 1


def test_bench_fleet_prints_every_figure_and_cleans_up(fleet: Cluster) -> None:
    """`mokka bench fleet` against the cluster through its API: the figures with their targets, the
    controller's from its metrics, the pool and its nodes gone after; an existing pool is refused."""
    import sys

    argv = [sys.executable, "-m", "mokka.cli", "bench", "fleet", "--kubeconfig", str(fleet.kubeconfig)]
    argv += ["--namespace", NS, "--nodes", "200", "--profile", "b200", "--pool", "bench"]
    res = subprocess.run([*argv, "--prometheus", PROMETHEUS], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    figures = [line.split("  ")[0] for line in res.stdout.splitlines()]
    for figure in ("200 nodes made", "node creation", "200 nodes Ready", "pool deleted -> every node gone"):
        assert figure in figures, res.stdout
    assert "nodes/s" in res.stdout and ">= 500 nodes/s" in res.stdout
    assert "controller: reconcile_seconds_count" in res.stdout, res.stdout
    # read back from the chart's Prometheus, which scraped the controller during the run
    scraped = {line.split("  ")[0]: line.split()[-1] for line in res.stdout.splitlines() if line.startswith("prom")}
    assert scraped["prometheus: nodes Ready (max)"] == "200", res.stdout
    assert scraped["prometheus: allocatable GPUs (max)"] == "1600", res.stdout
    assert float(scraped["prometheus: reconciles during the run"]) >= 1, res.stdout
    assert not nodes(fleet, f"{POOL_LABEL}=bench")
    apply_pool(fleet, "taken", profile="t4", replicas=1)
    taken = subprocess.run([*argv[:-2], "--pool", "taken"], capture_output=True, text=True, timeout=120)
    assert taken.returncode == 1
    assert (
        taken.stderr.strip()
        == "mokka: error: a VirtualGPUPool taken exists already: delete it or give --pool another name"
    )


def test_bench_fleet_hold_samples_every_component_at_every_step(fleet: Cluster) -> None:
    """`mokka bench fleet --hold`: at 0 nodes and at each step, the API server's, the controller's and
    KWOK's CPU and RSS from their /metrics (KWOK's through the chart's metrics port); the slopes and
    the projection; the pool gone after."""
    import sys

    argv = [sys.executable, "-m", "mokka.cli", "bench", "fleet", "--kubeconfig", str(fleet.kubeconfig)]
    argv += ["--namespace", NS, "--hold", "20,40", "--settle", "0", "--window", "2", "--pool", "held"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    figures = {line.split("  ")[0]: line for line in res.stdout.splitlines()}
    for component in ("API server", "fleet controller", "KWOK"):
        for nodes_held in (0, 20, 40):
            assert "cores" in figures[f"{nodes_held} nodes held: {component}"], res.stdout
        assert "MiB" in figures[f"per 1000 nodes: {component}"], res.stdout
        assert "GiB" in figures[f"projected at 100000 nodes: {component}"], res.stdout
    assert "nodes/s" in figures["40 nodes: node creation"]
    assert "40 nodes held: KWOK" in res.stderr  # told as it goes
    assert not nodes(fleet, f"{POOL_LABEL}=held")


def test_of_two_replicas_one_leads_and_the_other_takes_over(fleet: Cluster) -> None:
    fleet.kubectl("scale", "deployment", CONTROLLER, "-n", NS, "--replicas=2")
    try:
        pods = running(fleet, 2)
        leader = wait_for("a leader among the two", lambda: holder(fleet) if holder(fleet) in pods else None, 60)
        (other,) = [p for p in pods if p != leader]
        wait_for("the other one waiting for the Lease", lambda: "waiting for the Lease" in logs(fleet, other), 60)
        assert " leads " not in logs(fleet, other) and holder(fleet) == leader
        fleet.kubectl("delete", "pod", "-n", NS, leader, "--wait=false")
        wait_for("the other one leading", lambda: " leads " in logs(fleet, other), 90)
        assert holder(fleet) == other
    finally:
        fleet.kubectl("scale", "deployment", CONTROLLER, "-n", NS, "--replicas=1")
        running(fleet, 1)
