"""A fleet: several real mock GPU nodes of different boards in one cluster (one control plane),
each complete and separate, scheduled as a real fleet is, two of them in one NVLink rack.

The fleet: h100-0 (2 H100s, rack r1), h100-1 (1 H100, rack r1), h100-2 (1 H100, rack r2) and t4-3
(1 T4, no fabric). Everything here is the real thing: kubelets, the scheduler, NVIDIA's device
plugin and GFD on every node, nvidia-smi in pods.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_fixtures import pod_manifest, run_pod, start_cluster, wait_for

from gpumodel import fleet, profile
from localcluster import gpustack, nodeimage
from localcluster.cluster import Cluster, leftovers
from localcluster.nodespec import NodeSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

SPECS = (NodeSpec("h100", 2, "r1"), NodeSpec("h100", 1, "r1"), NodeSpec("h100", 1, "r2"), NodeSpec("t4", 1))
NAMES = ["h100-0", "h100-1", "h100-2", "t4-3"]
CLIQUE = "nvidia.com/gpu.clique"


@pytest.fixture(scope="module")
def fleet_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("fleet"), nodes=SPECS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def core(fleet_cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(fleet_cluster.api())


def labels(core: Any, node: str) -> dict[str, str]:
    return dict(core.read_node(node).metadata.labels)


def on_node(name: str, command: list[str], node_selector: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    manifest = pod_manifest(name, command, gpus=gpus)
    manifest["spec"]["nodeSelector"] = node_selector
    return manifest


def test_every_node_is_ready_with_its_own_gpus(fleet_cluster: Cluster, core: Any) -> None:
    assert [n.name for n in fleet_cluster.nodes] == NAMES
    for name, gpus in zip(NAMES, (2, 1, 1, 1), strict=True):
        node = core.read_node(name)
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions), name
        assert node.status.allocatable["nvidia.com/gpu"] == str(gpus), name
    status = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "cluster", "status", "--dir", str(fleet_cluster.layout.base)],
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    rows = {ln.split()[0]: ln.split() for ln in status.stdout.splitlines() if ln.split()[:1] and ln.split()[0] in NAMES}
    assert rows["t4-3"][1:] == ["t4:1", "-", "1", "1", "0", "Ready"]
    assert rows["h100-0"][1:] == ["h100:2@r1", "r1", "2", "2", "0", "Ready"]


def test_gfd_labels_each_node_with_its_own_board(core: Any) -> None:
    assert labels(core, "h100-0")["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels(core, "t4-3")["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels(core, "h100-0")["nvidia.com/gpu.count"] == "2"
    assert labels(core, "t4-3")["nvidia.com/gpu.memory"] == "15360"


def test_a_node_sees_only_its_own_gpus(fleet_cluster: Cluster) -> None:
    """In each node's namespace the real nvidia-smi lists that node's GPUs and nothing of another."""
    seen: dict[str, list[str]] = {}
    for n in fleet_cluster.nodes:
        smi = n.layout.driver_root / "usr" / "bin" / "nvidia-smi"
        res = n.run([str(smi), "-L"], env=gpustack.nvml_env(n.layout), timeout=60)
        assert res.returncode == 0, res.stderr
        seen[n.name] = res.stdout.splitlines()
    assert [len(v) for v in seen.values()] == [2, 1, 1, 1]
    assert all("Tesla T4" in line for line in seen["t4-3"])
    uuids = [line.split("UUID: ")[1] for lines in seen.values() for line in lines]
    assert len(set(uuids)) == len(uuids), "two GPUs of the fleet share a UUID"


def test_a_t4_pod_lands_on_the_t4_node_and_sees_one_t4(core: Any) -> None:
    pod = on_node("want-t4", ["nvidia-smi", "-L"], {"nvidia.com/gpu.product": "Tesla-T4"}, gpus=1)
    res = run_pod(core, pod)
    assert res.phase == "Succeeded", res.logs
    assert res.pod.spec.node_name == "t4-3"
    assert [ln.split(" (UUID")[0] for ln in res.logs.splitlines()] == ["GPU 0: Tesla T4"], res.logs


def test_an_over_ask_no_node_can_hold_stays_pending(core: Any) -> None:
    core.create_namespaced_pod("default", pod_manifest("too-many", ["true"], gpus=3))
    try:

        def unschedulable() -> Any:
            conds = core.read_namespaced_pod("too-many", "default").status.conditions or []
            return next((c for c in conds if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

        cond = wait_for("the 3-GPU pod to be unschedulable", unschedulable, timeout=60)
        assert "Insufficient nvidia.com/gpu" in cond.message
    finally:
        core.delete_namespaced_pod("too-many", "default", grace_period_seconds=0)


def test_pods_on_different_nodes_reach_each_other(core: Any) -> None:
    serve = "mkdir -p /w && echo hello-from-h100-0 > /w/i && exec httpd -f -p 8080 -h /w"
    core.create_namespaced_pod("default", on_node("server", ["sh", "-c", serve], {"kubernetes.io/hostname": "h100-0"}))
    try:

        def address() -> Any:
            pod = core.read_namespaced_pod("server", "default")
            return pod.status.pod_ip if pod.status.phase == "Running" else None

        ip = wait_for("the server pod to run", address, timeout=60)
        fetch = f"wget -O - http://{ip}:8080/i"
        res = run_pod(core, on_node("client", ["sh", "-c", fetch], {"kubernetes.io/hostname": "t4-3"}))
        assert res.phase == "Succeeded" and "hello-from-h100-0" in res.logs, res.logs
    finally:
        core.delete_namespaced_pod("server", "default", grace_period_seconds=0)


LIST_NODES = """
from kubernetes import client, config
config.load_incluster_config()  # the pod's token and CA; KUBERNETES_SERVICE_HOST: the Service's ClusterIP
for host in (client.Configuration.get_default_copy().host, "https://kubernetes.default.svc.cluster.local"):
    conf = client.Configuration.get_default_copy()
    conf.host = host
    names = sorted(n.metadata.name for n in client.CoreV1Api(client.ApiClient(conf)).list_node().items)
    print(host, " ".join(names))
"""


def test_a_pod_lists_the_nodes_through_the_kubernetes_service(
    fleet_cluster: Cluster, core: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """In-cluster API access as operators and controllers have it: the `kubernetes` Service by its
    ClusterIP and by its DNS name (CoreDNS), DNAT'ed by kube-proxy to the API server, with the
    pod's own token (Mokka's node image: Python and the kubernetes client)."""
    from kubernetes import client

    image = nodeimage.build(tmp_path_factory.mktemp("node-image"), None)
    fleet_cluster.node("t4-3").ctr("images", "import", str(image))
    rbac = client.RbacAuthorizationV1Api(fleet_cluster.api())
    rule = client.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["list"])
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name="node-lister"), rules=[rule]))
    subject = client.RbacV1Subject(kind="ServiceAccount", name="default", namespace="default")
    ref = client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="node-lister")
    meta = client.V1ObjectMeta(name="node-lister")
    rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(metadata=meta, role_ref=ref, subjects=[subject]))
    try:
        pod = on_node("lister", ["python3", "-c", LIST_NODES], {"kubernetes.io/hostname": "t4-3"})
        pod["spec"]["containers"][0]["image"] = nodeimage.NODE_IMAGE
        res = run_pod(core, pod)
        assert res.phase == "Succeeded", res.logs
        lines = res.logs.splitlines()
        assert lines == [
            f"https://10.96.0.1:443 {' '.join(NAMES)}",
            f"https://kubernetes.default.svc.cluster.local {' '.join(NAMES)}",
        ]
    finally:
        rbac.delete_cluster_role_binding("node-lister")
        rbac.delete_cluster_role("node-lister")


def test_a_pod_reaches_another_nodes_pod_by_its_service_name(core: Any) -> None:
    from kubernetes import client

    serve = "mkdir -p /w && echo hello-through-a-service > /w/i && exec httpd -f -p 8080 -h /w"
    server = on_node("web-0", ["sh", "-c", serve], {"kubernetes.io/hostname": "h100-1"})
    server["metadata"]["labels"] = {"app": "web"}
    core.create_namespaced_pod("default", server)
    port = client.V1ServicePort(port=80, target_port=8080)
    service = client.V1Service(
        metadata=client.V1ObjectMeta(name="web"), spec=client.V1ServiceSpec(selector={"app": "web"}, ports=[port])
    )
    core.create_namespaced_service("default", service)
    try:
        wait_for("web-0 to run", lambda: core.read_namespaced_pod("web-0", "default").status.phase == "Running", 60)
        fetch = "nslookup web.default.svc.cluster.local && wget -O - http://web.default.svc.cluster.local/i"
        res = run_pod(core, on_node("web-client", ["sh", "-c", fetch], {"kubernetes.io/hostname": "t4-3"}))
        assert res.phase == "Succeeded" and "hello-through-a-service" in res.logs, res.logs
        cluster_ip = core.read_namespaced_service("web", "default").spec.cluster_ip
        assert f"Address: {cluster_ip}" in res.logs, res.logs  # the name is the Service's ClusterIP
    finally:
        core.delete_namespaced_service("web", "default")
        core.delete_namespaced_pod("web-0", "default", grace_period_seconds=0)


def test_nodes_of_one_rack_share_a_clique_and_another_rack_does_not(core: Any) -> None:
    r1 = f"{fleet.rack_cluster_uuid('r1')}.1"
    assert labels(core, "h100-0")[CLIQUE] == labels(core, "h100-1")[CLIQUE] == r1
    assert labels(core, "h100-2")[CLIQUE] == f"{fleet.rack_cluster_uuid('r2')}.1" != r1
    assert CLIQUE not in labels(core, "t4-3")


def test_cordoning_a_node_moves_new_pods_to_its_peers(core: Any) -> None:
    core.patch_node("h100-0", {"spec": {"unschedulable": True}})
    try:
        placed = []
        for i in range(3):
            pod = on_node(f"h100-pod-{i}", ["true"], {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, gpus=1)
            res = run_pod(core, pod)
            assert res.phase == "Succeeded", res.logs
            placed.append(res.pod.spec.node_name)
        assert set(placed) <= {"h100-1", "h100-2"}, placed
    finally:
        core.patch_node("h100-0", {"spec": {"unschedulable": False}})


def in_node_view(cluster: Cluster, node: str, argv: list[str]) -> str:
    """``argv`` (an unmodified Debian tool) as a GPU pod on ``node`` runs it: through the sysfs shim,
    over the node's staged tree (the NRI plugin mounts both into the pod)."""
    import shutil

    root = cluster.node(node).layout.node_root
    tool = shutil.which(argv[0], path="/usr/sbin:/sbin:/usr/bin")
    if tool is None:
        pytest.fail(f"{argv[0]} not found: install Debian's infiniband-diags (.ci/setup --tests does)")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_PRELOAD": str(root / "lib/libmokka-sysfs.so")}
    env["MOKKA_SYSFS_ROOT"] = str(root)
    res = subprocess.run([tool, *argv[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_the_nodes_adapters_share_one_subnet(fleet_cluster: Cluster) -> None:
    """The three H100 nodes' adapters (one per GPU) hang off the rails' leaf switches of one
    subnet: ibnetdiscover on h100-0 finds h100-1's and h100-2's; a port taken down on h100-2
    (`mokka fault ib-port-down --node h100-2`) is a link down in h100-0's iblinkinfo, and back
    after ib-clear. The T4 node has no adapter."""
    found = in_node_view(fleet_cluster, "h100-0", ["ibnetdiscover", "-p"])
    cas = sorted(ln.split("'")[1] for ln in found.splitlines() if ln.startswith("CA "))
    assert cas == ["h100-0 mlx5_0", "h100-0 mlx5_1", "h100-1 mlx5_0", "h100-2 mlx5_0"], found
    base = ["--cluster-dir", str(fleet_cluster.layout.base)]
    try:
        assert run_cli("fault", "ib-port-down", "--hca", "0", "--node", "h100-2", *base).returncode == 0
        links = in_node_view(fleet_cluster, "h100-0", ["iblinkinfo", "-l"])
        assert "Down/Disabled" in links and "h100-2 mlx5_0" not in links, links
        assert "h100-2 mlx5_0" not in in_node_view(fleet_cluster, "h100-1", ["ibnetdiscover", "-p"])
    finally:
        assert run_cli("fault", "ib-clear", "--hca", "0", "--node", "h100-2", *base).returncode == 0
    assert "h100-2 mlx5_0" in in_node_view(fleet_cluster, "h100-0", ["ibnetdiscover", "-p"])


def test_a_fault_on_one_node_changes_only_that_node(fleet_cluster: Cluster, core: Any) -> None:
    """`mokka fault xid 79 --node h100-2`: that node's device plugin marks its GPU unhealthy (its
    allocatable drops to 0); every other node keeps its GPUs. (v0.18.0 never marks a device
    healthy again while it runs: this test comes last.)"""
    argv = [sys.executable, "-m", "mokka.cli", "fault", "xid", "79", "--gpu", "0", "--node", "h100-2"]
    res = subprocess.run([*argv, "--cluster-dir", str(fleet_cluster.layout.base)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    wait_for("h100-2's allocatable to drop", lambda: fleet_cluster.node("h100-2").allocatable() == 0, timeout=90)
    assert [fleet_cluster.node(n).allocatable() for n in ("h100-0", "h100-1", "t4-3")] == [2, 1, 1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ("t4@r1", "node t4-1 (t4@r1): profile t4: Tesla T4 has no NVLink fabric"),
        ("h100:0", "the GPU count after ':' must be a whole number from 1"),
        ("nosuch", "node nosuch-1 (nosuch): "),
    ],
)
def test_a_bad_node_is_one_line_naming_it(tmp_path: Path, node: str, message: str) -> None:
    res = run_cli("cluster", "up", "--dir", str(tmp_path / "c"), "--node", "h100", "--node", node)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and message in errors[0], res.stderr
    assert not (tmp_path / "c").exists()


def test_fault_on_an_unknown_node_names_the_cluster_nodes(fleet_cluster: Cluster) -> None:
    res = run_cli("fault", "xid", "13", "--node", "nope", "--cluster-dir", str(fleet_cluster.layout.base))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"mokka: error: no node 'nope' in this cluster (its nodes: {', '.join(NAMES)}), --node nope "
        f"--cluster-dir {fleet_cluster.layout.base}"
    ]


def test_a_rack_gets_its_clique_once_its_fabric_manager_is_ready(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`up --fabric-delay`: the rack's GPUs read In Progress at first (GFD gives no clique label);
    once the delay is over they read Completed and `mokka cluster relabel` (GFD again) gives both
    nodes the rack's clique."""
    specs = (NodeSpec("h100", 1, "late"), NodeSpec("h100", 1, "late"))
    with start_cluster(tmp_path_factory.mktemp("fabric-delay"), nodes=specs, fabric_delay=25) as cluster:
        from kubernetes import client

        core = client.CoreV1Api(cluster.api())
        assert not [n for n in ("h100-0", "h100-1") if CLIQUE in labels(core, n)]
        smi = cluster.node("h100-1").layout.driver_root / "usr" / "bin" / "nvidia-smi"
        env = gpustack.nvml_env(cluster.node("h100-1").layout)
        assert "<state>In Progress</state>" in cluster.node("h100-1").run([str(smi), "-q", "-x"], env=env).stdout
        wait_for(
            "the fabric probe Completed",
            lambda: "<state>Completed</state>" in cluster.node("h100-1").run([str(smi), "-q", "-x"], env=env).stdout,
            timeout=60,
        )
        res = run_cli("cluster", "relabel", "--dir", str(cluster.layout.base))
        assert res.returncode == 0 and res.stdout.splitlines()[0].startswith("h100-0: "), res.stderr
        want = f"{fleet.rack_cluster_uuid('late')}.1"
        assert [labels(core, n).get(CLIQUE) for n in ("h100-0", "h100-1")] == [want, want]


def test_a_fabric_delay_needs_a_rack(tmp_path: Path) -> None:
    res = run_cli("cluster", "up", "--dir", str(tmp_path / "c"), "--node", "h100", "--fabric-delay", "5")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"mokka: error: --fabric-delay: no node is in a rack (--node PROFILE@RACK), {tmp_path / 'c'}"
    ]


def test_a_node_that_fails_to_come_up_fails_up_naming_it_and_the_step(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A node whose GPU is lost: NVIDIA's device plugin cannot list its GPUs and exits (as on a real
    node). `up` fails with one line naming that node and the step, and tears everything down."""
    lost = tmp_path / "lost.yaml"
    data = yaml.safe_load(Path(profile.__file__).with_name("profiles").joinpath("h100.yaml").read_text())
    data.update(name="lost", gpu_count=1, gpus={0: {"lost": True}})
    lost.write_text(yaml.safe_dump(data))
    base = tmp_path_factory.mktemp("c")  # short: containerd's socket paths (under xdist's popen-gwN/ too)
    res = run_cli("cluster", "up", "--dir", str(base), "--node", "t4:1", "--node", str(lost))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("mokka: error:")]
    assert len(errors) == 1 and errors[0].startswith("mokka: error: node lost-1: allocatable GPUs: "), res.stderr
    assert "nvidia-device-plugin@lost-1 exited" in errors[0]
    assert leftovers(base) == []


def imex_pod(name: str, node: Any, script: str, ctl: Path) -> dict[str, Any]:
    """A pod on ``node`` running the node's mock IMEX daemon from its driver root (``/imex``), Ready
    while ``nvidia-imex-ctl -q`` answers READY (the check NVIDIA's compute-domain daemon runs);
    ``ctl`` (``/ctl``) holds the daemons' configuration and node list, written by the test."""
    ready = '[ "$(/imex/nvidia-imex-ctl -c /ctl/imex.cfg -q)" = READY ]'
    container = {
        "name": "imex",
        "image": "localhost/mokka/workload:1",
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "readinessProbe": {"exec": {"command": ["sh", "-c", ready]}, "periodSeconds": 1},
        "volumeMounts": [{"name": "imex", "mountPath": "/imex"}, {"name": "ctl", "mountPath": "/ctl"}],
    }
    bindir = str(node.layout.node_root / "driver" / "usr" / "bin")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"mokka.io/inject": "false"}},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            "volumes": [
                {"name": "imex", "hostPath": {"path": bindir, "type": "Directory"}},
                {"name": "ctl", "hostPath": {"path": str(ctl), "type": "Directory"}},
            ],
        },
    }


def test_imex_daemons_on_two_nodes_connect_over_the_pod_network(fleet_cluster: Cluster, tmp_path: Path) -> None:
    """The node's mock nvidia-imex (the project's own, from each node's driver root) in a pod on
    each of two nodes: real TCP between the pods' addresses on different nodes. Both are READY
    once connected; the peer's daemon killed makes the other NOT_READY and report it lost;
    readiness returns when it is back."""
    from kubernetes import client

    core: Any = client.CoreV1Api(fleet_cluster.api())
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "imex.cfg").write_text(
        "SERVER_PORT=50000\nIMEX_CMD_PORT=50005\nIMEX_CMD_BIND_INTERFACE_IP=127.0.0.1\n"
        "IMEX_NODE_CONFIG_FILE=/ctl/nodes.cfg\n"
    )
    a_node, b_node = fleet_cluster.node("h100-0"), fleet_cluster.node("t4-3")
    # b's daemon runs while /ctl/stop is absent: the test kills it and brings it back
    b_script = (
        "while true; do [ -e /ctl/stop ] && { sleep 0.3; continue; }; /imex/nvidia-imex -c /ctl/imex.cfg & p=$!; "
        "while [ ! -e /ctl/stop ] && kill -0 $p 2>/dev/null; do sleep 0.3; done; kill -9 $p; wait $p; done"
    )
    core.create_namespaced_pod("default", imex_pod("imex-a", a_node, "exec /imex/nvidia-imex -c /ctl/imex.cfg", ctl))
    core.create_namespaced_pod("default", imex_pod("imex-b", b_node, b_script, ctl))
    try:

        def address(pod: str) -> Any:
            status = core.read_namespaced_pod(pod, "default").status
            return status.pod_ip if status.phase == "Running" else None

        ips = [wait_for(f"{p} Running", lambda p=p: address(p), 60) for p in ("imex-a", "imex-b")]  # type: ignore[misc]
        assert ips[0] != ips[1]
        (ctl / "nodes.cfg").write_text("".join(f"{ip}\n" for ip in ips))  # what the domain's daemons are given

        def ready(pod: str) -> bool:
            conds = core.read_namespaced_pod(pod, "default").status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conds)

        for pod in ("imex-a", "imex-b"):
            wait_for(f"{pod} READY", lambda p=pod: ready(p), 30)  # type: ignore[misc]
        (ctl / "stop").touch()
        wait_for("imex-a NOT_READY with its peer gone", lambda: not ready("imex-a"), 30)
        log = core.read_namespaced_pod_log("imex-a", "default")
        assert f"node #1 {ips[1]} ({ips[1]}) lost" in log, log
        (ctl / "stop").unlink()
        for pod in ("imex-a", "imex-b"):
            wait_for(f"{pod} READY again", lambda p=pod: ready(p), 30)  # type: ignore[misc]
        assert f"node #0 {ips[0]} ({ips[0]}) connected" in core.read_namespaced_pod_log("imex-b", "default")
    finally:
        for pod in ("imex-a", "imex-b"):
            core.delete_namespaced_pod(pod, "default", grace_period_seconds=0)
