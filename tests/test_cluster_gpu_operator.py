"""NVIDIA's GPU Operator on mock nodes (`mokka cluster up --gpu-operator`): its own Helm chart,
installed by helm with the values Mokka ships, its operator and validator built from the Go module
proxy, its operands real (NFD through the chart, NVIDIA's device plugin and GFD, dcgm-exporter, the
MIG manager, the container toolkit), the policy ready for the right reasons, and a GPU pod
scheduled by the operator's device plugin seeing its GPUs. One cluster (an H100 node, whose product
brings the MIG manager, and an L40S node, with the toolkit operand on) is shared by the tests that
only read it; Mokka's own runtime handler in the toolkit's place is tested on the chart's cluster
(test_cluster_gpu_operator_chart.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_fixtures import needs_gpu_operator, pod_manifest, run_pod, start_cluster, wait_for

from fetch import dcgm_exporter, debcache, gotool
from fetch import versions as tools
from fetch.kube import binaries
from fetch.kube import gpu_operator as gpu_operator_build
from fetch.kube import versions as kube_versions
from gpumodel.nodelayout import NodeLayout
from localcluster.addons import gpu_operator
from localcluster.addons.gpu_operator import images, install
from localcluster.cluster import Cluster, ClusterError, Options
from localcluster.nodespec import NodeSpec
from virtualfleet.pool import VIRTUAL_LABEL, VirtualSpec, real_nodes_affinity

pytestmark = [pytest.mark.root, pytest.mark.slow, needs_gpu_operator]

NS = gpu_operator.NAMESPACE
VIRTUAL = 3  # KWOK's nodes of an H100 pool beside the real ones
# The operator's DaemonSets every GPU node runs (the MIG manager only where the product is MIG-capable).
OPERANDS = (
    "nvidia-container-toolkit-daemonset",
    "nvidia-operator-validator",
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nodes = (NodeSpec("h100", 2), NodeSpec("l40s", 1))
    virtual = (VirtualSpec.parse(f"h100:8={VIRTUAL}"),)
    base = tmp_path_factory.mktemp("gpu-operator")
    options = {"gpu_operator": True, "container_toolkit": True, "mig_strategy": "mixed"}
    with start_cluster(base, nodes=nodes, virtual=virtual, **options) as c:
        yield c


def pods(cluster: Cluster, selector: str = "") -> list[dict[str, Any]]:
    query = f"?labelSelector={selector}" if selector else ""
    return list(cluster.get(f"/api/v1/namespaces/{NS}/pods{query}").get("items", []))


def running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return pod["status"].get("phase") == "Running" and bool(statuses) and all(s.get("ready") for s in statuses)


def test_the_policy_is_ready_because_it_reconciled_every_gpu_node(cluster: Cluster) -> None:
    status = install.cluster_policy(cluster)["status"]
    assert status["state"] == "ready"
    reasons = {c["type"]: c.get("reason") for c in status["conditions"]}
    assert reasons["Ready"] == "Reconciled", status["conditions"]  # not NFDLabelsMissing, not NoGPUNodes


def test_nfd_from_the_chart_labels_every_node_and_the_operator_takes_it_as_a_gpu_node(cluster: Cluster) -> None:
    nfd = [p for p in pods(cluster, "app.kubernetes.io/name=node-feature-discovery") if running(p)]
    placed = {p["spec"]["nodeName"] for p in nfd if "worker" in p["metadata"]["name"]}
    assert {n.name for n in cluster.nodes} <= placed, placed  # and on the virtual nodes, as KWOK runs them
    master = [p["spec"]["nodeName"] for p in nfd if "master" in p["metadata"]["name"]]
    assert master and master[0] in {n.name for n in cluster.nodes}, master  # a real one: it really runs
    for n in cluster.nodes:
        labels = n.labels()
        assert labels.get("feature.node.kubernetes.io/pci-10de.present") == "true", n.name
        assert labels.get("nvidia.com/gpu.present") == "true", n.name
        assert labels.get("nvidia.com/gpu.deploy.device-plugin") == "true", n.name


def test_every_operand_runs_on_every_node(cluster: Cluster) -> None:
    found = pods(cluster)
    for n in cluster.nodes:
        mine = {p["metadata"].get("labels", {}).get("app"): p for p in found if p["spec"].get("nodeName") == n.name}
        for app in OPERANDS:
            assert app in mine and running(mine[app]), (n.name, app, sorted(a for a in mine if a))
    h100 = [n for n in cluster.nodes if "h100" in n.name]
    for n in h100:  # the MIG-capable product: the operator labels it for the MIG manager
        assert n.labels().get("nvidia.com/gpu.deploy.mig-manager") == "true"
        assert n.labels().get("nvidia.com/mig.config.state") == "success"  # its first run: all-disabled
    managers = [p for p in found if p["metadata"].get("labels", {}).get("app") == "nvidia-mig-manager"]
    real = {n.name for n in cluster.nodes}
    assert {p["spec"]["nodeName"] for p in managers if running(p)} & real == {n.name for n in h100}


def test_virtual_nodes_are_gpu_nodes_of_the_operator_too(cluster: Cluster) -> None:
    """KWOK's nodes carry the labels NFD and GFD give a real H100 node; the operator labels them
    GPU nodes, its DaemonSets schedule there (KWOK runs those pods) and the policy counts them."""
    nodes = cluster.get(f"/api/v1/nodes?labelSelector={VIRTUAL_LABEL}=true")["items"]
    assert len(nodes) == VIRTUAL
    real = cluster.nodes[0].labels()
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert labels.get("nvidia.com/gpu.present") == "true", labels
        assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
        assert labels["nvidia.com/gpu.product"] == real["nvidia.com/gpu.product"]
        on_it = {
            p["metadata"].get("labels", {}).get("app")
            for p in pods(cluster)
            if p["spec"].get("nodeName") == node["metadata"]["name"] and running(p)
        }
        assert set(OPERANDS) <= on_it, (node["metadata"]["name"], on_it)


def test_the_validator_checked_the_driver_toolkit_cuda_and_plugin(cluster: Cluster) -> None:
    for n in cluster.nodes:
        assert install.missing(n) == [], n.name
        driver = dict(
            line.split("=", 1) for line in (install.validations(n) / "driver-ready").read_text().splitlines() if line
        )
        # The pre-installed driver at the staged node's driver root (not a host driver, not a container's).
        assert driver["IS_HOST_DRIVER"] == "false"
        assert driver["NVIDIA_DRIVER_ROOT"] == "/var/lib/mokka/driver"


def test_allocatable_and_gfd_labels_are_the_profiles(cluster: Cluster) -> None:
    """The operator's device plugin advertises every GPU; the operator's GFD (through NFD's
    features.d) labels the node as the same GFD run against the node from the host does."""
    gfd = binaries.cached()
    assert gfd is not None
    for n in cluster.nodes:
        profile = cluster.profiles[n.name]
        assert n.allocatable() == profile.gpu_count
        labels = n.labels()
        expected = n.run_gfd(gfd["gpu-feature-discovery"], str(cluster.options["mig_strategy"]))
        expected.pop("nvidia.com/gfd.timestamp", None)
        assert {k: labels.get(k) for k in expected} == expected, n.name
        assert labels["nvidia.com/gpu.product"] == profile.gpu.name.replace(" ", "-")


def test_a_gpu_pod_sees_the_gpu_it_was_given_through_nvidia_smi(cluster: Cluster) -> None:
    """Scheduled by the operator's device plugin, which (CDI on, as the toolkit operand wants)
    names the GPU in a CDI annotation of its own spec, NVIDIA_VISIBLE_DEVICES left ``void``."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    probe = "nvidia-smi -L; echo visible: $NVIDIA_VISIBLE_DEVICES"
    res = run_pod(core, on_a_real_node(pod_manifest("smi", ["sh", "-c", probe], gpus=1)), timeout=120)
    assert res.phase == "Succeeded", res.logs
    listed = [ln.split("UUID: ")[1].rstrip(")") for ln in res.logs.splitlines() if ln.startswith("GPU ")]
    visible = next(ln for ln in res.logs.splitlines() if ln.startswith("visible:")).split()[1]
    assert len(listed) == 1 and visible == "void", res.logs
    node = cluster.node(res.pod.spec.node_name)
    assert set(listed) <= {g.uuid for g in NodeLayout.load(node.layout.node_root).gpus}, res.logs


TOOLKIT_RUNTIME = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
# What the toolkit's installer reports it left out: libnvidia-container (the legacy mode's), whose
# C source is not here. Anything else it ignored would be a failure.
LEFT_OUT = ("libnvidia-container.so.1", "nvidia-container-cli")


def test_the_toolkit_operand_installed_its_runtime_and_cdi_spec_on_every_node(cluster: Cluster) -> None:
    """NVIDIA's installer configured each node's containerd (its runtime the ``nvidia`` handler and
    the default, in CDI mode), which the node's supervisor started again after the installer's
    SIGHUP, and wrote a CDI spec of the node's mock GPUs with nvidia-ctk over the mock NVML."""
    import tomlkit
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    toolkits = {p["spec"]["nodeName"]: p for p in pods(cluster, "app=nvidia-container-toolkit-daemonset")}
    for n in cluster.nodes:
        config = tomlkit.parse(n.layout.containerd_config.read_text()).unwrap()
        cri = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
        assert cri["default_runtime_name"] == "nvidia", n.name
        assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == TOOLKIT_RUNTIME, n.name
        installed = n.layout.private("/usr/local/nvidia") / "toolkit"
        assert 'mode = "cdi"' in (installed / ".config/nvidia-container-runtime/config.toml").read_text()
        assert "starting it again" in (n.layout.logs / "containerd.log").read_text(), n.name  # the SIGHUP
        assert install.toolkit_applied(n), n.name  # what containerd runs, not only its file
        spec = yaml.safe_load((n.layout.private("/var/run/cdi") / "management.nvidia.com-gpu.yaml").read_text())
        assert spec["kind"] == "management.nvidia.com/gpu"
        gpus = cluster.profiles[n.name].gpu_count
        assert {d["name"] for d in spec["devices"]} == {"all"}, spec["devices"]  # management: every GPU at once
        nodes = {d["path"] for d in spec["devices"][0]["containerEdits"]["deviceNodes"]}
        assert {f"/dev/nvidia{i}" for i in range(gpus)} | {"/dev/nvidiactl"} <= nodes, (n.name, nodes)
        toolkit = toolkits[n.name]["metadata"]["name"]
        log = core.read_namespaced_pod_log(toolkit, NS, container="nvidia-container-toolkit-ctr")
        ignored = [ln for ln in log.splitlines() if "Ignoring error" in ln]
        assert ignored and all(any(x in ln for x in LEFT_OUT) for ln in ignored), ignored


def test_a_pod_mokka_leaves_alone_gets_its_gpus_from_the_toolkits_cdi_spec(cluster: Cluster) -> None:
    """With Mokka's NRI plugin opted out, what a ``runtimeClassName: nvidia`` pod asking for every
    GPU gets is the toolkit's doing: its runtime injects the devices, the mock NVML and nvidia-smi
    from the spec nvidia-ctk wrote; without NVIDIA_VISIBLE_DEVICES it gets nothing."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    for n in cluster.nodes:
        for visible in ("all", "void"):
            manifest = pod_manifest(
                f"toolkit-{visible}-{n.name}",
                ["sh", "-c", "nvidia-smi -L || echo no nvidia-smi"],
                annotations={"mokka.io/inject": "false"},
                image=image_names()["validator"],  # glibc for nvidia-smi
            )
            manifest["spec"]["runtimeClassName"] = "nvidia"
            manifest["spec"]["nodeName"] = n.name
            manifest["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": visible}]
            res = run_pod(core, manifest, timeout=120)
            assert res.phase == "Succeeded", res.logs
            listed = [ln for ln in res.logs.splitlines() if ln.startswith("GPU ")]
            uuids = {g.uuid for g in NodeLayout.load(n.layout.node_root).gpus}
            if visible == "all":
                assert {ln.split("UUID: ")[1].rstrip(")") for ln in listed} == uuids, res.logs
            else:
                assert listed == [] and "no nvidia-smi" in res.logs, res.logs


def image_names() -> dict[str, str]:
    return gpu_operator.image_names(gpu_operator.values())


def test_options_the_operator_replaces_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"^--gpu-operator deploys .*: drop --nfd, --dcgm-exporter$"):
        Cluster.up(Options(base=tmp_path / "c", gpu_operator=True, nfd=True, dcgm_exporter=True))
    with pytest.raises(ClusterError, match=r"^--container-toolkit is the GPU Operator's toolkit operand: add --gpu"):
        Cluster.up(Options(base=tmp_path / "c", container_toolkit=True))
    assert not (tmp_path / "c").exists()


def test_a_missing_mig_manager_is_named_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu_operator.MIG_PARTED_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ClusterError, match=r"MOKKA_MIG_PARTED_DIR=.*nowhere: no reconfigure-mig.sh"):
        Cluster.up(Options(base=tmp_path / "c", gpu_operator=True))
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


MIG_CONFIG, MIG_STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"


def mig_state_after(cluster: Cluster, node: Any, config: str, timeout: float = 240) -> str:
    """Label ``node`` for the MIG manager's ``config`` and wait until it says how that went (a
    config it does not know fails at once; one it applies goes through ``pending``)."""
    before = node.labels().get(MIG_STATE)
    node.label({MIG_CONFIG: config})

    def taken_up() -> str | None:
        state = node.labels().get(MIG_STATE)
        return state if state == "pending" or (state == "failed" and before != "failed") else None

    if wait_for("the MIG manager to take the change up", taken_up, 60) == "failed":
        return "failed"
    done = wait_for(
        f"the MIG manager to apply {config}",
        lambda: (s := node.labels().get(MIG_STATE)) in ("success", "failed") and s,
        timeout,
    )
    return str(done)


TOO_MANY = "all-1g.10gb-x8"  # eight 1g.10gb instances: an H100 holds seven


def manager_log(cluster: Cluster, node: Any) -> str:
    """The log of the MIG manager on ``node``."""
    manager = next(p for p in pods(cluster, "app=nvidia-mig-manager") if p["spec"]["nodeName"] == node.name)
    return str(cluster.kubectl("logs", "-n", NS, manager["metadata"]["name"], "-c", "nvidia-mig-manager").stdout)


def with_a_layout_the_board_cannot_hold(cluster: Cluster, tmp: Path) -> None:
    """The MIG manager's configs as a user extends them through the chart (``migManager.config``
    with ``create`` and ``data``): the operator's defaults and one layout no H100 holds."""
    default = cluster.get(f"/api/v1/namespaces/{NS}/configmaps/default-mig-parted-config")["data"]["config.yaml"]
    configs = yaml.safe_load(default)
    configs["mig-configs"][TOO_MANY] = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 8}}]
    path = tmp / "mig-configs.yaml"
    path.write_text(yaml.safe_dump(configs, sort_keys=False))
    helm, built = gotool.cached(tools.HELM), gpu_operator_build.cached()
    assert helm is not None and built is not None
    settings = {"migManager.config.name": "mokka-mig-configs", "migManager.config.create": "true"}
    install.upgrade(cluster, helm / "helm", built.chart, settings, {"migManager.config.data.config\\.yaml": path})

    def rolled() -> bool:
        ds = cluster.get(f"/apis/apps/v1/namespaces/{NS}/daemonsets/nvidia-mig-manager")
        volumes = ds["spec"]["template"]["spec"].get("volumes") or []
        uses = any((v.get("configMap") or {}).get("name") == "mokka-mig-configs" for v in volumes)
        return uses and "nvidia-mig-manager" not in install.unready(cluster)

    wait_for("the MIG manager on the new configs", rolled, 120)


def test_the_mig_manager_reconfigures_a_node_through_the_mock_nvml(cluster: Cluster, tmp_path: Path) -> None:
    """The MIG manager's own config file: ``all-1g.10gb`` makes the real MIG manager stop the GPU
    clients, apply the layout through the mock NVML (mig-parted: SetMigMode, GPU and compute
    instances) and start them again; with the mixed strategy the node then advertises seven
    1g.10gb MIG devices per GPU with GFD's MIG labels, a pod asking for one lists it with
    nvidia-smi, and ``all-disabled`` returns the whole GPUs. A layout the board cannot hold, and a
    config the manager does not know, fail, and the node keeps serving."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    node = next(n for n in cluster.nodes if "h100" in n.name)
    gpus = cluster.profiles[node.name].gpu_count
    with_a_layout_the_board_cannot_hold(cluster, tmp_path)
    try:
        assert mig_state_after(cluster, node, "all-1g.10gb") == "success"
        mig = "nvidia.com/mig-1g.10gb"
        wait_for(f"{gpus * 7} {mig} allocatable", lambda: node.allocatable(mig) == gpus * 7, 180)
        assert node.allocatable() == 0  # mixed: the whole GPUs are gone, their slices advertised
        # GFD's labels reach the node through NFD's features.d, on NFD's next pass (10 s in the values)
        wait_for("GFD's MIG labels", lambda: node.labels().get(f"{mig}.count") == str(gpus * 7), 150)
        assert node.labels()[f"{mig}.memory"] == "9984"
        manifest = pod_manifest("mig", ["sh", "-c", "nvidia-smi -L"])
        manifest["spec"]["containers"][0]["resources"] = {"limits": {mig: "1"}}
        manifest["spec"]["nodeName"] = node.name
        res = run_pod(core, manifest, timeout=120)
        assert res.phase == "Succeeded", res.logs
        assert len([ln for ln in res.logs.splitlines() if "MIG 1g.10gb" in ln]) == 1, res.logs

        assert mig_state_after(cluster, node, "all-9g.90gb") == "failed"  # not in the manager's config
        assert node.allocatable(mig) == gpus * 7  # still serving the layout it has

        assert mig_state_after(cluster, node, TOO_MANY) == "failed"
        log = manager_log(cluster, node)
        # the mock NVML refusing the eighth GPU instance, as the manager reports it
        assert "Error creating GPU instance for '1g.10gb': ERROR_INSUFFICIENT_RESOURCES" in log, log[-2000:]
        wait_for(
            "the node serving again",
            lambda: (
                "nvidia-device-plugin-daemonset" not in install.unready(cluster)
                and node.allocatable(mig) + node.allocatable() > 0
            ),
            180,
        )
    finally:
        state = mig_state_after(cluster, node, "all-disabled")
    # Seen once in a full CI run (passed alone right after): the manager's own account, if again.
    assert state == "success", manager_log(cluster, node)[-3000:]
    wait_for("the whole GPUs allocatable again", lambda: allocatable_as_profiled(cluster, node), 180)
    assert node.allocatable(mig) == 0


def test_an_upgrade_rolls_the_device_plugin_node_by_node_and_leaves_gpu_pods_alone(cluster: Cluster) -> None:
    """``helm upgrade`` of the release to the cluster's newer device plugin and GFD: the operator
    rolls its DaemonSets (one node unavailable at a time), says notReady meanwhile and ready again,
    and a GPU pod that was running keeps running, untouched, with its GPU."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api())
    core.create_namespaced_pod("default", on_a_real_node(pod_manifest("steady", ["sh", "-c", "sleep 3600"], gpus=1)))
    try:
        before = wait_for("pod steady Running", lambda: running_pod(core, "steady"), 90)
        bins = binaries.cached()
        assert bins is not None
        new = f"nvcr.io/nvidia/k8s-device-plugin:{kube_versions.DEVICE_PLUGIN}"
        cache = cluster.cache or debcache.default_cache()
        tarball = images.build_device_plugin(bins.device_plugin, new, cluster.layout.images, cache)
        cluster.import_image(tarball)
        tarball.unlink()

        seen: list[tuple[str, int]] = []  # (policy state, nodes without a Ready device plugin)
        done = threading.Event()

        def watch() -> None:
            real = {n.name for n in cluster.nodes}
            while not done.is_set():
                plugins = pods(cluster, "app=nvidia-device-plugin-daemonset")
                up = {p["spec"]["nodeName"] for p in plugins if running(p)} & real
                state = (install.cluster_policy(cluster).get("status") or {}).get("state", "")
                seen.append((state, len(cluster.nodes) - len(up)))
                time.sleep(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            helm = gotool.cached(tools.HELM)
            built = gpu_operator_build.cached()
            assert helm is not None and built is not None
            version = kube_versions.DEVICE_PLUGIN
            install.upgrade(
                cluster, helm / "helm", built.chart, {"devicePlugin.version": version, "gfd.version": version}
            )

            def rolled() -> bool:
                plugins = [p for p in pods(cluster, "app=nvidia-device-plugin-daemonset") if running(p)]
                plugins = [p for p in plugins if p["spec"]["nodeName"] in {n.name for n in cluster.nodes}]
                images_now = {p["spec"]["containers"][0]["image"] for p in plugins}
                return len(plugins) == len(cluster.nodes) and images_now == {new} and install.policy_ready(cluster)

            wait_for("every node's device plugin upgraded, the policy ready again", rolled, 240)
            # the new plugin registers with the kubelet a moment after its pod is Ready
            wait_for(
                "every GPU allocatable again",
                lambda: all(allocatable_as_profiled(cluster, n) for n in cluster.nodes),
                60,
            )
        finally:
            done.set()
            watcher.join(timeout=10)
        assert any(state == "notReady" for state, _ in seen), sorted(set(seen))
        assert max(down for _, down in seen) == 1, sorted(set(seen))  # node by node
        after = core.read_namespaced_pod("steady", "default")
        assert after.metadata.uid == before.metadata.uid and after.status.phase == "Running"
        assert after.status.container_statuses[0].restart_count == 0
        smi = cluster.kubectl("exec", "steady", "--", "nvidia-smi", "-L").stdout
        assert len([ln for ln in smi.splitlines() if ln.startswith("GPU ")]) == 1, smi
    finally:
        core.delete_namespaced_pod("steady", "default", grace_period_seconds=0)


def on_a_real_node(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod kept off KWOK's nodes (where it would only seem to run)."""
    manifest["spec"]["affinity"] = real_nodes_affinity()
    return manifest


def allocatable_as_profiled(cluster: Cluster, n: Any) -> bool:
    return bool(n.allocatable() == cluster.profiles[n.name].gpu_count)


def running_pod(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, "default")
    return pod if pod.status.phase == "Running" else None


def test_the_operators_dcgm_exporter_serves_every_gpu_and_an_injected_xid(cluster: Cluster) -> None:
    """Last: the Xid makes the operator's device plugin take the GPU out of allocatable."""
    exporters = {p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods(cluster, "app=nvidia-dcgm-exporter")}

    def samples(node: str, name: str) -> dict[str, float]:
        path = f"/api/v1/namespaces/{NS}/pods/{exporters[node]}:9400/proxy/metrics"
        found = dcgm_exporter.parse(cluster.get_text(path, timeout=10))
        return {s.labels["gpu"]: s.value for s in found if s.name == name}

    for n in cluster.nodes:
        temps = samples(n.name, "DCGM_FI_DEV_GPU_TEMP")
        assert sorted(temps, key=int) == [str(i) for i in range(cluster.profiles[n.name].gpu_count)], (n.name, temps)
    n = cluster.nodes[0]
    wait_for("every GPU of the node allocatable", lambda: allocatable_as_profiled(cluster, n), 60)
    before = n.allocatable()
    fault = [sys.executable, "-m", "mokka.cli", "fault", "xid", "79", "--gpu", "1", "--root", str(n.layout.node_root)]
    subprocess.run(fault, check=True, capture_output=True)
    wait_for("the Xid in the exporter", lambda: samples(n.name, "DCGM_FI_DEV_XID_ERRORS").get("1") == 79, 60)
    wait_for("GPU 1 out of allocatable", lambda: n.allocatable() == before - 1, 90)
