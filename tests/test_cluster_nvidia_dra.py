"""NVIDIA's DRA driver on mock nodes (`mokka cluster up --allocator nvidia-dra`): its own
gpu-kubelet-plugin and compute-domain-kubelet-plugin, run with their ordinary flags against each
node's mock driver root, on a heterogeneous fleet (two H100s, one L40S). Skips where NVIDIA's
binaries are not at hand (../shared/thirdparty/k8s-dra-driver-gpu or $MOKKA_NVIDIA_DRA_DIR)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import claim_pod, start_cluster, wait_for

from gpumodel import nodelayout
from localcluster import nvidia_dra
from localcluster.cluster import Cluster
from localcluster.nodespec import NodeSpec

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        nvidia_dra.source_dir() is None,
        reason=f"no NVIDIA DRA driver binaries (../shared/thirdparty/k8s-dra-driver-gpu or ${nvidia_dra.ENV_DIR})",
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("nvidia-dra")
    with start_cluster(base, nodes=(NodeSpec("h100", 2), NodeSpec("l40s", 1)), allocator="nvidia-dra") as c:
        yield c


def get(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def slices(cluster: Cluster, node: str, driver: str) -> list[dict[str, Any]]:
    items = get(cluster, "resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    return [d for s in items if s["spec"]["driver"] == driver for d in s["spec"]["devices"]]


def product(name: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].productName == '{name}'"


def running(cluster: Cluster, pod: str) -> dict[str, Any]:
    """Wait for ``pod`` to run and print its GPUs: their UUIDs, names, /dev nodes; its node and the
    UUIDs of the devices its claim was allocated."""

    def logged() -> str | None:
        out = cluster.kubectl("logs", pod, check=False).stdout
        return out if "devices:" in out else None

    out = wait_for(f"pod {pod} Running with its GPUs", logged, 120)
    status = get(cluster, "pod", pod)
    claim = next(s["resourceClaimName"] for s in status["status"]["resourceClaimStatuses"])
    results = get(cluster, "resourceclaim", claim)["status"]["allocation"]["devices"]["results"]
    node = status["spec"]["nodeName"]
    by_name = {d["name"]: d for d in slices(cluster, node, nvidia_dra.GPU_DRIVER)}
    return {
        "uuids": re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)", out),
        "names": re.findall(r"^GPU \d+: (.*) \(UUID", out, re.M),
        "nodes": out.split("devices:", 1)[1].split(),
        "node": node,
        "allocated": [by_name[r["device"]]["attributes"]["uuid"]["string"] for r in results],
        "drivers": {r["driver"] for r in results},
    }


def delete(cluster: Cluster, *pods: str) -> None:
    for pod in pods:
        cluster.kubectl("delete", "pod", pod, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceclaimtemplate", pod, check=False)


def test_slices_list_every_gpu_with_nvidias_attributes(cluster: Cluster) -> None:
    h100 = slices(cluster, "h100-0", nvidia_dra.GPU_DRIVER)
    l40s = slices(cluster, "l40s-1", nvidia_dra.GPU_DRIVER)
    assert sorted(d["name"] for d in h100) == ["gpu-0", "gpu-1"] and [d["name"] for d in l40s] == ["gpu-0"]
    attrs = {d["attributes"]["uuid"]["string"]: d["attributes"] for d in h100 + l40s}
    staged = {n.name: nodelayout.NodeLayout.load(n.layout.node_root) for n in cluster.nodes}
    node = {g.uuid: name for name, layout in staged.items() for g in layout.gpus}
    assert set(attrs) == set(node)  # the mock NVML's UUIDs, every GPU of the fleet
    for uuid, a in attrs.items():
        want = "NVIDIA H100 80GB HBM3" if node[uuid] == "h100-0" else "NVIDIA L40S"
        assert a["productName"]["string"] == want and a["type"]["string"] == "gpu"
        assert a["architecture"]["string"] == ("Hopper" if "H100" in want else "Ada Lovelace")
        bus_ids = {g.bus_id.lower().removeprefix("0000") for g in staged[node[uuid]].gpus}  # 4-digit domain
        assert a["resource.kubernetes.io/pciBusID"]["string"] in bus_ids


def test_a_claim_pod_sees_exactly_its_gpu_and_two_claims_never_share(cluster: Cluster) -> None:
    for pod in ("one", "two"):
        cluster.kubectl("apply", "-f", "-", input=claim_pod(pod, selector=product("NVIDIA H100 80GB HBM3")))
    try:
        got = [running(cluster, "one"), running(cluster, "two")]
        for g in got:
            assert g["drivers"] == {nvidia_dra.GPU_DRIVER} and g["node"] == "h100-0"
            assert g["uuids"] == g["allocated"] and len(g["uuids"]) == 1  # nvidia-smi (NVML) sees its one GPU
            assert len(g["nodes"]) == 1 and g["names"] == ["NVIDIA H100 80GB HBM3"]
        assert got[0]["uuids"] != got[1]["uuids"] and got[0]["nodes"] != got[1]["nodes"]
    finally:
        delete(cluster, "one", "two")


def test_a_cel_selector_on_product_name_picks_the_node(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=claim_pod("ada", selector=product("NVIDIA L40S")))
    try:
        g = running(cluster, "ada")
        assert g["node"] == "l40s-1" and g["names"] == ["NVIDIA L40S"] and g["uuids"] == g["allocated"]
    finally:
        delete(cluster, "ada")


def test_with_the_nri_plugin_opted_out_the_pod_still_runs(cluster: Cluster) -> None:
    """The lib-only contract: NVIDIA's CDI spec alone (its device node, the driver root's libraries
    and nvidia-smi through its hooks) is enough for NVML in the pod."""
    manifest = claim_pod("bare", annotations={"mokka.io/inject": "false"})
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        g = running(cluster, "bare")
        assert len(g["uuids"]) == 1 and g["uuids"] == g["allocated"] and len(g["nodes"]) == 1
    finally:
        delete(cluster, "bare")


def test_the_compute_domain_plugin_reads_the_imex_surface(cluster: Cluster) -> None:
    """NVIDIA's compute-domain kubelet plugin starts on every node (it refuses to without the
    node's /proc/devices, the fabric state of every GPU and the driver's version) and publishes IMEX
    channel 0 and the daemon device."""
    for n in cluster.nodes:
        devices = {d["name"]: d["attributes"] for d in slices(cluster, n.name, nvidia_dra.COMPUTE_DOMAIN_DRIVER)}
        assert devices["channel-0"] == {"id": {"int": 0}, "type": {"string": "channel"}}, devices
        assert devices["daemon-0"]["type"] == {"string": "daemon"}, devices
        log = (n.layout.logs / "compute-domain-kubelet-plugin.log").read_text()
        assert f"using devRoot={n.layout.driver_root}" in log


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


def test_imex_daemons_on_two_nodes_connect_over_the_pod_network(cluster: Cluster, tmp_path: Path) -> None:
    """The mock nvidia-imex in a pod on each node: real TCP between the pods' addresses on
    different nodes. Both are READY once connected; the peer's daemon killed makes the other
    NOT_READY and report it lost; readiness returns when it is back."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "imex.cfg").write_text(
        "SERVER_PORT=50000\nIMEX_CMD_PORT=50005\nIMEX_CMD_BIND_INTERFACE_IP=127.0.0.1\n"
        "IMEX_NODE_CONFIG_FILE=/ctl/nodes.cfg\n"
    )
    a_node, b_node = cluster.node("h100-0"), cluster.node("l40s-1")
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
