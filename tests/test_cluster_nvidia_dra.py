"""NVIDIA's DRA driver on mock nodes (`mokka cluster up --allocator nvidia-dra`): NVIDIA's own Helm
chart, rendered and applied unchanged, its pods running the driver's image built here from NVIDIA's
binaries, on a heterogeneous fleet in two NVLink racks: h100-0 (2 H100s) and h100-1 (1) in rack r1,
h100-2 (1) in rack r2, l40s-3 (1 L40S, no fabric). GPU claims through NVIDIA's gpu-kubelet-plugin;
ComputeDomains through NVIDIA's controller, compute-domain kubelet plugin and daemon driving the
node's mock IMEX daemon. Skips where NVIDIA's binaries and chart are not at hand
(../shared/thirdparty/k8s-dra-driver-gpu or $MOKKA_NVIDIA_DRA_DIR)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_fixtures import claim_pod, needs_nvidia_dra, start_cluster, wait_for

from gpumodel import nodelayout
from localcluster.addons import nvidia_dra
from localcluster.addons.nvidia_dra import image as driver_image
from localcluster.cluster import Cluster
from localcluster.nodespec import NodeSpec

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    needs_nvidia_dra,
]

SPECS = (NodeSpec("h100", 2, "r1"), NodeSpec("h100", 1, "r1"), NodeSpec("h100", 1, "r2"), NodeSpec("l40s", 1))
CLIQUE = "nvidia.com/gpu.clique"  # GFD's label: the node's NVLink clique
NS = nvidia_dra.NAMESPACE


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("nvidia-dra"), nodes=SPECS, allocator="nvidia-dra") as c:
        yield c


def get(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def slices(cluster: Cluster, node: str, driver: str) -> list[dict[str, Any]]:
    items = get(cluster, "resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    return [d for s in items if s["spec"]["driver"] == driver for d in s["spec"]["devices"]]


def product(name: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].productName == '{name}'"


def logged(cluster: Cluster, pod: str, marker: str, namespace: str = "default", timeout: float = 120) -> str:
    def text() -> str | None:
        out = cluster.kubectl("logs", "-n", namespace, pod, check=False).stdout
        return out if marker in out else None

    try:
        return str(wait_for(f"pod {pod} Running and logging {marker!r}", text, timeout))
    except AssertionError as e:
        raise AssertionError(f"{e}; {where(cluster, pod, namespace)}") from None


def where(cluster: Cluster, pod: str, namespace: str) -> str:
    """Where ``pod`` stands: its phase, its node and its conditions that do not hold, with why."""
    p = get(cluster, "pod", "-n", namespace, pod)
    conditions = p["status"].get("conditions", [])
    unmet = [f"{c['type']}: {c.get('message') or c.get('reason', '')}" for c in conditions if c["status"] != "True"]
    return f"phase {p['status'].get('phase')} on node {p['spec'].get('nodeName')}; " + "; ".join(unmet)


def running(cluster: Cluster, pod: str) -> dict[str, Any]:
    """Wait for ``pod`` to run and print its GPUs: their UUIDs, names, /dev nodes; its node and the
    UUIDs of the devices its claim was allocated."""
    out = logged(cluster, pod, "devices:")
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


def test_nvidias_chart_runs_unchanged_from_the_image_built_here(cluster: Cluster) -> None:
    """The controller, and on every real node the kubelet plugins (both containers Ready after the
    chart's start check), from the driver's image under the name the chart gives it."""
    source = nvidia_dra.source_dir()
    assert source is not None
    image = driver_image.name(source / "chart")
    assert image == "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.5.0-dev"  # the chart's default
    pods = get(cluster, "pods", "-n", NS)["items"]
    by_component: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        by_component.setdefault(p["metadata"]["labels"].get(nvidia_dra.COMPONENT, ""), []).append(p)
    plugins = by_component["kubelet-plugin"]
    assert sorted(p["spec"]["nodeName"] for p in plugins) == [n.name for n in cluster.nodes]
    for p in plugins + by_component["controller"]:
        statuses = p["status"]["containerStatuses"]
        assert all(s["ready"] for s in statuses), p["metadata"]["name"]
        assert {s["image"] for s in statuses} == {image}
    init = cluster.kubectl("logs", "-n", NS, plugins[0]["metadata"]["name"], "-c", "init-container").stdout
    assert f"driver root {nvidia_dra.DRIVER_ROOT}: nvidia-smi and usr/lib64/libnvidia-ml.so.1 found" in init


def test_slices_list_every_gpu_with_nvidias_attributes(cluster: Cluster) -> None:
    got = {n.name: slices(cluster, n.name, nvidia_dra.GPU_DRIVER) for n in cluster.nodes}
    assert {name: sorted(d["name"] for d in devs) for name, devs in got.items()} == {
        "h100-0": ["gpu-0", "gpu-1"],
        "h100-1": ["gpu-0"],
        "h100-2": ["gpu-0"],
        "l40s-3": ["gpu-0"],
    }
    attrs = {d["attributes"]["uuid"]["string"]: d["attributes"] for devs in got.values() for d in devs}
    staged = {n.name: nodelayout.NodeLayout.load(n.layout.node_root) for n in cluster.nodes}
    node = {g.uuid: name for name, layout in staged.items() for g in layout.gpus}
    assert set(attrs) == set(node)  # the mock NVML's UUIDs, every GPU of the fleet
    for uuid, a in attrs.items():
        want = "NVIDIA L40S" if node[uuid] == "l40s-3" else "NVIDIA H100 80GB HBM3"
        assert a["productName"]["string"] == want and a["type"]["string"] == "gpu"
        assert a["architecture"]["string"] == ("Hopper" if "H100" in want else "Ada Lovelace")
        bus_ids = {g.bus_id.lower().removeprefix("0000") for g in staged[node[uuid]].gpus}  # 4-digit domain
        assert a["resource.kubernetes.io/pciBusID"]["string"] in bus_ids


def on_node(manifest: str, node: str) -> str:
    """A :func:`claim_pod` manifest with its pod placed on ``node``."""
    return manifest.replace("  containers:", f"  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  containers:")


def test_a_claim_pod_sees_exactly_its_gpu_and_two_claims_never_share(cluster: Cluster) -> None:
    for pod in ("one", "two"):
        manifest = claim_pod(pod, selector=product("NVIDIA H100 80GB HBM3"))
        cluster.kubectl("apply", "-f", "-", input=on_node(manifest, "h100-0"))  # the node with two H100s
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
        assert g["node"] == "l40s-3" and g["names"] == ["NVIDIA L40S"] and g["uuids"] == g["allocated"]
    finally:
        delete(cluster, "ada")


# What a claim pod's container holds of the GPU stack: its mount points and device nodes, and the
# environment the runtime path set.
STACK_PROBE = (
    "nvidia-smi -L; echo devices: $(ls /dev | grep -E '^nvidia[0-9]+$'); "
    "echo mounts: $(awk '{print $5}' /proc/self/mountinfo | grep -E 'nvidia|mokka|kern.log|libcuda|libdcgm' | sort); "
    'echo env: "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES" "LD_PRELOAD=$LD_PRELOAD"; sleep 3600'
)


def stack(cluster: Cluster, pod: str) -> dict[str, Any]:
    out = logged(cluster, pod, "env:")
    lines = {line.partition(":")[0]: line.partition(":")[2].split() for line in out.splitlines() if ":" in line}
    return {"mounts": lines["mounts"], "devices": lines["devices"], "env": lines["env"], "log": out}


def test_the_nri_plugin_adds_nothing_nvidias_runtime_path_already_adds(cluster: Cluster) -> None:
    """NVIDIA's CDI spec gives a claim's container its device node, the driver's library and
    nvidia-smi; the NRI plugin (allocator external) adds none of that again, keeps the spec's
    NVIDIA_VISIBLE_DEVICES, and adds only the kernel's view (the sysfs shim, its trees, the kernel
    log) and the InfiniBand subnet's relay directory (the node has adapters). With the plugin opted
    out (the lib-only contract) the pod still runs with its GPU.
    """
    # on two nodes alike (one H100 each, one driver)
    for pod, node, opted in (("bare", "h100-1", {"mokka.io/inject": "false"}), ("served", "h100-2", {})):
        manifest = claim_pod(pod, probe=STACK_PROBE, annotations=opted)
        cluster.kubectl("apply", "-f", "-", input=on_node(manifest, node))
    try:
        bare, served = stack(cluster, "bare"), stack(cluster, "served")
        for s in (bare, served):
            assert "NVIDIA H100 80GB HBM3" in s["log"] and s["devices"] == ["nvidia0"], s["log"]
            assert s["env"][0] == "NVIDIA_VISIBLE_DEVICES=void", s["log"]  # NVIDIA's spec's, kept
        assert len(served["mounts"]) == len(set(served["mounts"])), served["mounts"]  # nothing mounted twice
        added = set(served["mounts"]) - set(bare["mounts"])
        kernel = {
            "/usr/lib/mokka/libmokka-sysfs.so",
            "/run/mokka/root/sys",
            "/run/mokka/root/proc",
            "/run/mokka/root/ib-relay",
            "/var/log/kern.log",
        }
        assert added == kernel, served["mounts"]
        assert set(bare["mounts"]) <= set(served["mounts"])
        assert any("libnvidia-ml.so" in m for m in bare["mounts"]) and "/usr/bin/nvidia-smi" in bare["mounts"]
        assert served["env"][1] == "LD_PRELOAD=/usr/lib/mokka/libmokka-sysfs.so" and bare["env"][1] == "LD_PRELOAD="
        log = (cluster.node("h100-2").layout.logs / "nri-plugin.log").read_text()
        decided = [line for line in log.splitlines() if "default/served/probe:" in line]
        assert decided and "the driver at /usr/lib64/libnvidia-ml.so." in decided[-1], decided
        assert "0 device nodes, 5 mounts, env LD_PRELOAD MOKKA_SYSFS_ROOT" in decided[-1], decided
    finally:
        delete(cluster, "bare", "served")


def test_the_compute_domain_plugin_reads_the_imex_surface(cluster: Cluster) -> None:
    """NVIDIA's compute-domain kubelet plugin starts on every node (it refuses to without the node's
    /proc/devices, every GPU's fabric state and the driver's version), publishes IMEX channel 0 and
    the daemon device, and finds each rack node's clique: GFD's label of that node."""
    pods = get(cluster, "pods", "-n", NS, "-l", f"{nvidia_dra.COMPONENT}=kubelet-plugin")["items"]
    by_node = {p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods}
    for n in cluster.nodes:
        devices = {d["name"]: d["attributes"] for d in slices(cluster, n.name, nvidia_dra.COMPUTE_DOMAIN_DRIVER)}
        assert devices["channel-0"] == {"id": {"int": 0}, "type": {"string": "channel"}}, devices
        assert devices["daemon-0"]["type"] == {"string": "daemon"}, devices
        log = cluster.kubectl("logs", "-n", NS, by_node[n.name], "-c", "compute-domains").stdout
        clique = get(cluster, "node", n.name)["metadata"]["labels"].get(CLIQUE)
        if n.name == "l40s-3":
            assert clique is None and "identified fabric clique" not in log
        else:
            cluster_uuid, clique_id = clique.rsplit(".", 1)
            assert "identified fabric clique UUID/ID (device 0/" in log and f"{cluster_uuid}/{clique_id}" in log


def workload(name: str, template: str, node: str | None = None, clique: str | None = None) -> dict[str, Any]:
    """A pod of the ComputeDomain's workload (label app=rack) claiming the domain's channel: on
    ``node``, else on a node of the same clique as the other workloads and not beside one (and, given
    ``clique``, in that clique: the first workload's affinity matches itself, so it alone could land
    in a clique too small for the domain, leaving the second one Pending).
    """
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": template}],
        "containers": [
            {
                "name": "w",
                "image": "localhost/mokka/workload:1",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo channels: $(ls /dev/nvidia-caps-imex-channels); sleep 3600"],
                "resources": {"claims": [{"name": "channel"}]},
            }
        ],
    }
    group = {"labelSelector": {"matchLabels": {"app": "rack"}}}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    else:
        if clique:
            spec["nodeSelector"] = {CLIQUE: clique}
        spec["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{**group, "topologyKey": CLIQUE}]},
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{**group, "topologyKey": "kubernetes.io/hostname"}]
            },
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "rack"}}, "spec": spec}


def domain(cluster: Cluster) -> dict[str, Any]:
    return dict(get(cluster, "computedomain", "rack").get("status") or {})


def ready(cluster: Cluster, *nodes: str) -> dict[str, Any] | None:
    """The domain's status once it is Ready with exactly ``nodes`` listed, each Ready. (NVIDIA's
    controller turns a domain Ready as soon as its DaemonSet has enough Ready pods, which can be
    before a new daemon's node entry is listed.)"""
    s = domain(cluster)
    listed = {n["name"]: n["status"] for n in s.get("nodes", [])}
    return s if s.get("status") == "Ready" and listed == dict.fromkeys(nodes, "Ready") else None


def daemons(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The domain's IMEX daemon pods, by node."""
    pods = get(cluster, "pods", "-n", NS, "-l", nvidia_dra.DAEMON_LABEL)["items"]
    return {p["spec"]["nodeName"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def imex_nodes(cluster: Cluster, pod: str) -> dict[str, str]:
    """What the mock nvidia-imex in daemon ``pod`` lists of its domain: address -> state."""
    out = cluster.kubectl("exec", "-n", NS, pod, "--", "nvidia-imex-ctl", "-c", "/imexd/imexd.cfg", "-N").stdout
    return {m[0]: m[1] for m in re.findall(r"^Node #\d+ - \S+ - ([\d.]+) - (.*)$", out, re.M)}


def test_a_compute_domain_across_a_rack(cluster: Cluster) -> None:
    """A ComputeDomain of two nodes: NVIDIA's controller makes its channel claim template; a workload
    placed in rack r1's clique and one kept beside it by pod affinity alone land on the two nodes of
    rack r1; the compute-domain plugin labels those nodes, NVIDIA's daemons start there (the driver's
    image), write the domain's names into /etc/hosts and run the node's mock nvidia-imex, which
    connects to its peer over the pod network; the domain goes Ready and each workload runs with IMEX
    channel 0. Deleting a daemon pod makes the domain NotReady (its peer reports it lost) until the
    DaemonSet's new pod has joined. A workload of the same domain on rack r2's node gets a daemon in
    a clique of its own: the r1 daemons' IMEX domain never includes it."""
    rack = nvidia_dra.compute_domain("rack", 2, "rack-channel")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(rack))
    try:
        template = ("get", "resourceclaimtemplate", "rack-channel")
        wait_for("the domain's channel claim template", lambda: cluster.kubectl(*template, check=False).returncode == 0)
        r1 = get(cluster, "node", "h100-0")["metadata"]["labels"][CLIQUE]
        cluster.kubectl("apply", "-f", "-", input=json.dumps(workload("w0", "rack-channel", clique=r1)))
        cluster.kubectl("apply", "-f", "-", input=json.dumps(workload("w1", "rack-channel")))  # by affinity alone
        logs = {name: logged(cluster, name, "channels:") for name in ("w0", "w1")}
        assert all("channels: channel0" in log for log in logs.values()), logs
        placed = {get(cluster, "pod", name)["spec"]["nodeName"] for name in ("w0", "w1")}
        assert placed == {"h100-0", "h100-1"}  # rack r1
        status = wait_for("the domain Ready", lambda: ready(cluster, "h100-0", "h100-1"), 60)
        assert {n["name"]: n["cliqueID"] for n in status["nodes"]} == {"h100-0": r1, "h100-1": r1}
        for node in ("h100-0", "h100-1"):  # the plugin's label, the DaemonSet's node selector
            assert nvidia_dra.DAEMON_LABEL in get(cluster, "node", node)["metadata"]["labels"]
        assert nvidia_dra.DAEMON_LABEL not in get(cluster, "node", "h100-2")["metadata"]["labels"]
        pods = daemons(cluster)
        assert set(pods) == {"h100-0", "h100-1"}
        ips = {node: p["status"]["podIP"] for node, p in pods.items()}
        for node, p in pods.items():
            assert imex_nodes(cluster, p["metadata"]["name"]) == {
                ips[node]: "READY (this node)",
                **{ip: "READY" for other, ip in ips.items() if other != node},
            }

        # A daemon pod deleted: the domain is NotReady until its replacement has joined.
        gone = pods["h100-1"]["metadata"]["name"]
        cluster.kubectl("delete", "pod", "-n", NS, gone, "--wait=false")
        wait_for("the domain NotReady", lambda: domain(cluster).get("status") == "NotReady", 30)
        survivor = ("logs", "-n", NS, pods["h100-0"]["metadata"]["name"])
        wait_for("h100-0's daemon reports its peer lost", lambda: " lost" in cluster.kubectl(*survivor).stdout, 30)
        wait_for("the domain Ready again", lambda: ready(cluster, "h100-0", "h100-1"), 90)
        assert daemons(cluster)["h100-1"]["metadata"]["name"] != gone

        # A workload of the domain on the other rack: a clique, and an IMEX domain, of its own.
        cluster.kubectl("apply", "-f", "-", input=json.dumps(workload("w2", "rack-channel", node="h100-2")))
        assert "channels: channel0" in logged(cluster, "w2", "channels:")
        r2 = get(cluster, "node", "h100-2")["metadata"]["labels"][CLIQUE]
        assert r2 != r1
        status = wait_for("h100-2 in the domain", lambda: len((s := domain(cluster)).get("nodes", [])) == 3 and s, 60)
        assert {n["name"]: n["cliqueID"] for n in status["nodes"]} == {"h100-0": r1, "h100-1": r1, "h100-2": r2}
        pods = daemons(cluster)
        r2_ip = pods["h100-2"]["status"]["podIP"]
        assert imex_nodes(cluster, pods["h100-2"]["metadata"]["name"]) == {r2_ip: "READY (this node)"}
        for node in ("h100-0", "h100-1"):
            assert r2_ip not in imex_nodes(cluster, pods[node]["metadata"]["name"])
    finally:
        for name in ("w0", "w1", "w2"):
            cluster.kubectl("delete", "pod", name, "--wait=false", check=False)
        cluster.kubectl("delete", "computedomain", "rack", "--wait=false", check=False)
