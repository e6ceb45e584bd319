"""The pairing guide "Run:ai Fake GPU Operator" run as written on a real local cluster: Mokka's chart
on the `integration` pool, run:ai fake-gpu-operator's (FGO 0.2.0) own Helm chart on the `scale` pool,
FGO's images built without Docker from its binaries under FGO's own names, real helm, real kubelets.

Three real nodes (no device plugin, no NRI plugin of the cluster's own: the charts bring the GPU
stacks): h100-0 is the guide's `integration` worker, h100-1 and h100-2 its two `scale` workers; the
pool labels are set with kubectl, as the guide's kind config sets them. Every step's command is the
guide's; where the guide names nvml-mock's objects (its chart, `app.kubernetes.io/name=nvml-mock`,
`ds/nvml-mock`) the test runs the guide's command first, asserts what a user sees, then Mokka's names.
Two deviations, each forced and asserted: FGO's chart directory needs its dependency entries dropped
(helm refuses a chart whose disabled subcharts are not vendored) and its images' pull policy set to
IfNotPresent (nothing here serves ghcr.io). The tests run in file order; each is one step.

Then the guide's failure modes (wrong namespace, FGO's builtin profiles left on in either order, two
Mokka releases, profileLabels) as a user meets them, and FGO's `mock` backend served by Mokka's node
image (nvmlmock/): FGO's status-updater creates its nvml-mock DaemonSet, which pulls Mokka's image from
a local registry (CNCF distribution, built by setup) under FGO's imagePullPolicy Always, stages the
node through Mokka's host setup and is undone by its preStop hook.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_fixtures import start_cluster, wait_for

from fetch import debcache, nvidia_smi, prepare, thirdparty, versions
from localcluster import nodeimage, registry
from localcluster.addons import fgo_images
from localcluster.cluster import Cluster
from localcluster.images import WORKLOAD_IMAGE
from localcluster.nodespec import NodeSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
FGO_SRC = thirdparty.directory("MOKKA_FGO_DIR", "fake-gpu-operator")
if FGO_SRC is None or not (FGO_SRC / "chart" / "Chart.yaml").is_file():
    pytest.skip(
        "no fake-gpu-operator build and chart (../shared/thirdparty/fake-gpu-operator)", allow_module_level=True
    )

POOL = "run.ai/simulated-gpu-node-pool"
INTEGRATION, SCALE = "h100-0", ("h100-1", "h100-2")
NS = "gpu-operator"
MOKKA_IMAGE = "docker.io/library/mokka:0.1.0"  # the chart's default image (repository mokka, appVersion)

# Step 2, verbatim.
GUIDE_MOKKA_SETS = (
    "integrations.fakeGpuOperator.enabled=true",
    "integrations.fakeGpuOperator.targetNamespace=gpu-operator",
    "gpu.profile=h100",
    "gpu.count=8",
    "nodeSelector.run\\.ai/simulated-gpu-node-pool=integration",
)
# Step 3's values file, verbatim.
GUIDE_TOPOLOGY = """\
topology:
    nodePools:
      integration:
        backend: mock
        gpuCount: 8
        gpuProfile: h100
      scale:
        backend: fake
        gpuCount: 8
        gpuProfile: h100
"""
# The same pools in the shape FGO 0.2.0 reads (nodePools.<pool>.gpu.{backend,profile}).
V020_TOPOLOGY = """\
topology:
  nodePools:
    integration:
      gpu: {backend: mock, profile: h100}
    scale:
      gpu: {backend: fake, profile: h100}
"""
SCALE_ONLY = """\
topology:
  nodePools:
    scale:
      gpu: {backend: fake, profile: h100}
"""
# Every pullPolicy value FGO's chart has for what it deploys by default (its images are Always).
PULL_POLICIES = tuple(
    f"{key}.image.pullPolicy=IfNotPresent"
    for key in ("devicePlugin", "statusUpdater", "topologyServer", "statusExporter", "kwokGpuDevicePlugin", "migFaker")
)
H100 = "NVIDIA H100 80GB HBM3"


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    helm_binary()  # fail before a cluster comes up when setup did not build them
    prepare.go_binary(versions.REGISTRY)
    nodes = (NodeSpec("h100", 1),) * 3
    with start_cluster(tmp_path_factory.mktemp("fgo-guide"), nodes=nodes, allocator="none", nri_plugin=False) as c:
        yield c


def helm_binary() -> Path:
    return prepare.go_binary(versions.HELM)  # built by .ci/setup --tests


@pytest.fixture(scope="module")
def images(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """FGO's images (from its binaries, under its names) and Mokka's node image (under the name its
    chart pulls by default), imported into every node."""
    assert FGO_SRC is not None
    out = tmp_path_factory.mktemp("images")
    archives = fgo_images.build(FGO_SRC, out, debcache.default_cache())
    archives.append(nodeimage.build(out, nvidia_smi.fetch("550")))
    for archive in archives:
        cluster.import_image(archive)
        archive.unlink()
    for n in cluster.nodes:
        n.ctr("images", "tag", "--force", nodeimage.NODE_IMAGE, MOKKA_IMAGE)
    return archives


@pytest.fixture(scope="module")
def fgo_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FGO's chart with its two dependency entries dropped (see test_step3_fgo_chart_as_shipped_needs_its_subcharts)."""
    assert FGO_SRC is not None
    chart = tmp_path_factory.mktemp("fgo") / "fake-gpu-operator"
    shutil.copytree(FGO_SRC / "chart", chart)
    for p in [chart, *chart.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert [d["name"] for d in meta.pop("dependencies")] == ["gpu-operator", "nvidia-dra-driver-gpu"]
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api())


# ---------------------------------------------------------------------------------------- helpers


def helm(
    cluster: Cluster, *args: str, values: str | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """helm as a user runs it (``-f -`` reads ``values``), with the cluster's admin kubeconfig."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(cluster.layout.base / "helm")}
    env["HELM_CONFIG_HOME"] = env["HELM_DATA_HOME"] = env["HELM_CACHE_HOME"]
    argv = [str(helm_binary()), *args] + (["-f", "-"] if values is not None else [])
    return subprocess.run(argv, input=values, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"{res.args}: {res.stderr or res.stdout}"
    return res.stdout


def mokka_install(
    cluster: Cluster, release: str = "mokka", *extra: str, sets: tuple[str, ...] = GUIDE_MOKKA_SETS
) -> Any:
    argv = ["install", release, str(REPO / "charts" / "mokka"), *extra]
    for s in sets:
        argv += ["--set", s]
    return helm(cluster, *argv, "--wait", "--timeout", "120s")


def fgo_install(cluster: Cluster, chart: Path, values: str, *extra: str, wait: bool = True) -> Any:
    argv = ["upgrade", "--install", "gpu-operator", str(chart), "-n", NS, *extra]
    for s in PULL_POLICIES:
        argv += ["--set", s]
    return helm(cluster, *argv, *(["--wait", "--timeout", "120s"] if wait else []), values=values)


def kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(*args, check=False)


def node_labels(core: Any, node: str) -> dict[str, str]:
    return dict(core.read_node(node).metadata.labels or {})


def pods_by_app(core: Any, namespace: str = NS) -> dict[str, set[str]]:
    """Live pods' ``app`` label -> the nodes they run on."""
    out: dict[str, set[str]] = {}
    for p in core.list_namespaced_pod(namespace).items:
        if p.metadata.deletion_timestamp is None and p.spec.node_name:
            out.setdefault((p.metadata.labels or {}).get("app", p.metadata.name), set()).add(p.spec.node_name)
    return out


def running(core: Any, namespace: str, selector: str, count: int) -> bool:
    items = core.list_namespaced_pod(namespace, label_selector=selector).items
    live = [p for p in items if p.metadata.deletion_timestamp is None]
    return len(live) == count and all(
        any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])) for p in live
    )


def topology_of(core: Any, node: str) -> dict[str, Any]:
    cm = core.read_namespaced_config_map(f"topology-{node}", NS)
    return yaml.safe_load(cm.data["topology.yml"])


def pod_output(core: Any, name: str, node_pool: str, command: list[str], **spec: Any) -> str:
    from cluster_fixtures import run_pod

    container = {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": command}
    container.update(spec.pop("container", {}))
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "nodeSelector": {POOL: node_pool}, "containers": [container], **spec},
    }
    res = run_pod(core, manifest, timeout=120)
    assert res.phase == "Succeeded", res.logs
    return res.logs


def refresh_fgo_nodes(cluster: Cluster, core: Any, nodes: list[str]) -> None:
    """What FGO 0.2.0 needs after its topology changes: its per-node ConfigMaps are made once, when
    status-updater first sees a node, and never rewritten; delete them and restart it."""
    for n in nodes:
        kubectl(cluster, "-n", NS, "delete", "cm", f"topology-{n}", "--ignore-not-found")
    ok(kubectl(cluster, "-n", NS, "rollout", "restart", "deployment", "status-updater"))
    ok(kubectl(cluster, "-n", NS, "rollout", "status", "deployment", "status-updater", "--timeout=120s"))


# ---------------------------------------------------------------------------------------- the guide


def test_fgo_images_under_fgos_names(cluster: Cluster, images: list[Path]) -> None:
    listed = set(cluster.nodes[0].ctr("images", "ls", "-q").stdout.split())
    for image in fgo_images.IMAGES:
        assert f"ghcr.io/run-ai/fake-gpu-operator/{image.target}:0.0.1" in listed
    assert {fgo_images.UBUNTU, MOKKA_IMAGE} <= listed


def test_step1_pool_labels(cluster: Cluster, core: Any) -> None:
    ok(kubectl(cluster, "label", "node", INTEGRATION, f"{POOL}=integration"))
    ok(kubectl(cluster, "label", "node", *SCALE, f"{POOL}=scale"))
    assert ok(kubectl(cluster, "get", "nodes", "-l", f"{POOL}=integration", "-o", "name")).split() == [
        f"node/{INTEGRATION}"
    ]


def test_failure_profiles_in_the_wrong_namespace(cluster: Cluster, images: Any) -> None:
    """The guide's Step 2 without targetNamespace: the ConfigMaps land in Mokka's release namespace
    and the name FGO gets in its own namespace is NotFound (the guide's own check). The release's
    pods are kept off every node (a pool nobody has): only the ConfigMaps matter here."""
    ok(kubectl(cluster, "create", "namespace", NS))
    sets = tuple(s for s in GUIDE_MOKKA_SETS if "targetNamespace" not in s and "nodeSelector" not in s)
    ok(
        mokka_install(
            cluster,
            "mokka-nons",
            "-n",
            "mokka-nons",
            "--create-namespace",
            sets=(*sets, "nodeSelector.run\\.ai/simulated-gpu-node-pool=nowhere"),
        )
    )
    try:
        res = kubectl(cluster, "get", "cm", "gpu-profile-h100", "-n", NS, "-o", "name")
        assert res.returncode == 1
        assert res.stderr.strip() == 'Error from server (NotFound): configmaps "gpu-profile-h100" not found'
        assert ok(kubectl(cluster, "get", "cm", "gpu-profile-h100", "-n", "mokka-nons", "-o", "name")).strip() == (
            "configmap/gpu-profile-h100"
        )
    finally:
        ok(helm(cluster, "uninstall", "mokka-nons", "-n", "mokka-nons", "--wait"))
        kubectl(cluster, "delete", "namespace", "mokka-nons", "--wait=false")


def test_step2_mokka_on_the_integration_pool(cluster: Cluster, core: Any, images: Any) -> None:
    started = time.monotonic()
    ok(mokka_install(cluster))
    took = time.monotonic() - started
    # helm --wait does not wait for a DaemonSet with one pod (maxUnavailable 1): it may return first.
    print(f"helm install --wait returned after {took:.1f}s")
    try:
        wait_for("Mokka's pod Ready", lambda: running(core, "default", "app.kubernetes.io/name=mokka", 1), 180)
    except AssertionError:
        raise AssertionError(kubectl(cluster, "describe", "pods", "-n", "default").stdout[-3000:]) from None


def test_step3_fgo_chart_as_shipped_needs_its_subcharts(cluster: Cluster) -> None:
    """FGO's chart directory (deploy/fake-gpu-operator at 0.2.0) lists NVIDIA's gpu-operator and DRA
    charts as dependencies without vendoring them: helm refuses it although both are disabled (the
    guide installs the packaged chart from ghcr.io, which carries them)."""
    assert FGO_SRC is not None
    res = fgo_install(cluster, FGO_SRC / "chart", GUIDE_TOPOLOGY, "--set", "builtinProfiles.enabled=false")
    assert res.returncode == 1
    assert "found in Chart.yaml, but missing in charts/ directory: gpu-operator, nvidia-dra-driver-gpu" in res.stderr


def test_failure_builtin_profiles_left_on_fgo_second(cluster: Cluster, fgo_chart: Path) -> None:
    """Step 3 without builtinProfiles.enabled=false, after Mokka: Helm's ownership error, nothing installed."""
    res = fgo_install(cluster, fgo_chart, GUIDE_TOPOLOGY)
    assert res.returncode == 1
    assert (
        'Error: Unable to continue with install: ConfigMap "gpu-profile-a100" in namespace "gpu-operator" exists '
        "and cannot be imported into the current release: invalid ownership metadata; annotation validation error: "
        'key "meta.helm.sh/release-name" must equal "gpu-operator": current value is "mokka"'
    ) in res.stderr, res.stderr
    assert ok(helm(cluster, "list", "-n", NS, "-a", "-q")).split() == []


def test_step3_fgo_with_the_guides_values_as_written(cluster: Cluster, core: Any, fgo_chart: Path) -> None:
    """Installs, but FGO 0.2.0 does not read the guide's pool shape: it falls back to the legacy
    `gpuCount` (8 GPUs per node), never reads a profile (product "" and memory 0 on every pool node,
    the integration node included), ignores `backend` (no nvml-mock DaemonSet), and keeps its chart's
    `default` pool (Helm merges maps). Its device plugin and status exporter land on the integration
    node too, and the exporter overwrites Mokka's GPU labels there."""
    ok(fgo_install(cluster, fgo_chart, GUIDE_TOPOLOGY, "--set", "builtinProfiles.enabled=false"))
    pools = yaml.safe_load(core.read_namespaced_config_map("topology", NS).data["topology.yml"])["nodePools"]
    assert sorted(pools) == ["default", "integration", "scale"]
    assert pools["integration"] == {"backend": "mock", "gpuCount": 8, "gpuProfile": "h100"}

    def served() -> bool:
        return all(
            node_labels(core, n).get("run.ai/fake.gpu") == "true"
            and core.read_node(n).status.allocatable.get("nvidia.com/gpu") == "8"
            for n in (INTEGRATION, *SCALE)
        )

    wait_for("FGO's device plugin and exporter on every pool node", served, 120)
    for n in (INTEGRATION, *SCALE):
        assert topology_of(core, n)["gpuProduct"] == ""
        labels = node_labels(core, n)
        assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.memory"]) == ("", "0"), n
    assert INTEGRATION in pods_by_app(core)["device-plugin"]
    assert INTEGRATION in pods_by_app(core)["nvidia-dcgm-exporter"]
    assert not core.list_namespaced_config_map(NS, label_selector="fake-gpu-operator/component=nvml-mock").items
    assert "nvml-mock-integration" not in ok(kubectl(cluster, "-n", NS, "get", "ds", "-o", "name"))


def test_step4_mokka_runs_only_on_the_integration_worker(cluster: Cluster) -> None:
    guide = kubectl(cluster, "get", "pods", "-l", "app.kubernetes.io/name=nvml-mock", "-o", "wide")
    assert guide.stderr.strip() == "No resources found in default namespace."  # the guide's label is nvml-mock's
    mine = ok(kubectl(cluster, "get", "pods", "-l", "app.kubernetes.io/name=mokka", "-o", "json"))
    assert [p["spec"]["nodeName"] for p in json.loads(mine)["items"]] == [INTEGRATION]


def test_step4_the_profile_configmaps_in_fgos_namespace(cluster: Cluster) -> None:
    out = ok(kubectl(cluster, "-n", NS, "get", "cm", "-l", "fake-gpu-operator/gpu-profile=true", "-o", "name"))
    # Eight, not the guide's seven: Mokka has h200, FGO's builtin set does not.
    assert out.split() == [
        f"configmap/gpu-profile-{p}" for p in ("a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4")
    ]


def test_step4_a_real_nvidia_smi(cluster: Cluster, core: Any) -> None:
    """`kubectl exec ds/nvml-mock -- nvidia-smi`: no such DaemonSet with Mokka's chart; with Mokka's
    name the image has no nvidia-smi on PATH (the plugin's pod is opted out of injection). The
    staged driver root's nvidia-smi in that container, and any pod on the integration node, are the
    real nvidia-smi on the 8 mock H100s."""
    res = kubectl(cluster, "exec", "ds/nvml-mock", "--", "nvidia-smi")
    assert 'daemonsets.apps "nvml-mock" not found' in res.stderr, res.stderr
    res = kubectl(cluster, "exec", "ds/mokka", "--", "nvidia-smi")
    assert res.returncode != 0 and 'exec: "nvidia-smi": executable file not found in $PATH' in res.stderr, res.stderr
    staged = "LD_LIBRARY_PATH=/var/lib/mokka/driver/usr/lib64 /var/lib/mokka/driver/usr/bin/nvidia-smi"
    table = ok(kubectl(cluster, "exec", "ds/mokka", "--", "sh", "-c", staged))
    assert table.count("H100 80GB HBM3") == 8 and "NVIDIA-SMI" in table, table
    listed = pod_output(core, "smi", "integration", ["nvidia-smi", "-L"])
    assert listed.count(H100) == 8, listed


def test_step4_fgo_on_the_scale_workers(cluster: Cluster, core: Any) -> None:
    """`kubectl get pods -l app=fake-gpu-operator`: no FGO pod carries that label (and the guide's
    command looks in namespace default). FGO's per-node pods are `app=device-plugin` and
    `app=nvidia-dcgm-exporter` in gpu-operator, and with the guide's topology they run on the
    integration worker as well."""
    assert kubectl(cluster, "get", "pods", "-l", "app=fake-gpu-operator", "-o", "wide").stderr.strip() == (
        "No resources found in default namespace."
    )
    assert kubectl(cluster, "get", "pods", "-A", "-l", "app=fake-gpu-operator").stderr.strip() == "No resources found"
    apps = pods_by_app(core)
    assert set(SCALE) <= apps["device-plugin"] and set(SCALE) <= apps["nvidia-dcgm-exporter"]
    assert {"status-updater", "topology-server", "kwok-gpu-device-plugin", "nvidia-dcgm-exporter-kwok"} <= set(apps)


def test_when_fgo_does_not_pick_up_the_profiles(cluster: Cluster) -> None:
    assert ok(kubectl(cluster, "get", "cm", "gpu-profile-h100", "-n", NS, "-o", "name")).strip() == (
        "configmap/gpu-profile-h100"
    )
    body = ok(kubectl(cluster, "get", "cm", "gpu-profile-h100", "-n", NS, "-o", "jsonpath={.data.profile\\.yaml}"))
    head = body.splitlines()[:5]
    assert head[0].startswith("# Generated by charts/mokka/update-profiles.py") and "version: '1.0'" in head, head
    res = kubectl(cluster, "rollout", "restart", "deployment", "fake-gpu-operator", "-n", NS)
    assert res.returncode == 1
    assert res.stderr.strip() == 'Error from server (NotFound): deployments.apps "fake-gpu-operator" not found'
    # FGO 0.2.0's profile reader is status-updater.
    assert "deployment.apps/status-updater restarted" in ok(
        kubectl(cluster, "rollout", "restart", "deployment", "status-updater", "-n", NS)
    )
    ok(kubectl(cluster, "-n", NS, "rollout", "status", "deployment", "status-updater", "--timeout=120s"))


def test_step3_fgo_with_the_shape_fgo_reads(cluster: Cluster, core: Any, fgo_chart: Path) -> None:
    """nodePools.<pool>.gpu.{backend,profile}: FGO reads Mokka's gpu-profile-h100 (product, memory,
    driver), once its per-node ConfigMaps are made again; `backend: mock` on the integration pool
    makes status-updater create nvml-mock-integration with upstream's image, whose pods cannot be
    created (FGO's chart makes the nvml-mock ServiceAccount only with gpuOperator or
    nvidiaDraDriver on), and FGO's device plugin stays on the integration node."""
    ok(fgo_install(cluster, fgo_chart, V020_TOPOLOGY, "--set", "builtinProfiles.enabled=false"))
    assert topology_of(core, SCALE[0])["gpuProduct"] == ""  # not rewritten by the upgrade
    refresh_fgo_nodes(cluster, core, [INTEGRATION, *SCALE])

    def profiled() -> bool:
        try:
            return all(topology_of(core, n).get("gpuProduct") == H100 for n in SCALE)
        except Exception:
            return False

    wait_for("FGO's node topologies from Mokka's profile", profiled, 90)
    topo = topology_of(core, SCALE[0])
    assert (topo["gpuMemory"], topo["driverVersion"]) == (81559, "580.105.08")
    wait_for(
        "the profile's labels on the scale nodes",
        lambda: all(node_labels(core, n).get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3" for n in SCALE),
        90,
    )
    ds = wait_for("nvml-mock-integration", lambda: _daemonset(cluster, "nvml-mock-integration"), 60)
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/nvidia/nvml-mock:sha-1706195"
    assert ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"

    def refused() -> str:
        out = kubectl(
            cluster, "-n", NS, "get", "events", "--field-selector", "involvedObject.name=nvml-mock-integration"
        )
        return out.stdout if 'serviceaccount "nvml-mock" not found' in out.stdout else ""

    wait_for("the DaemonSet's pods refused", refused, 60)
    assert INTEGRATION in pods_by_app(core)["device-plugin"]


def test_pairing_that_keeps_fgo_off_the_mokka_pool(cluster: Cluster, core: Any, fgo_chart: Path) -> None:
    """Only the scale pool in FGO's topology: status-updater leaves the integration node alone
    ("nodepool integration not found in cluster topology"), so FGO's device plugin and exporter stay
    off it once the labels FGO put there are removed; Mokka's pod, restarted, labels its node again."""
    ok(fgo_install(cluster, fgo_chart, SCALE_ONLY, "--set", "builtinProfiles.enabled=false"))
    wait_for("nvml-mock-integration deleted", lambda: not _daemonset(cluster, "nvml-mock-integration"), 60)
    refresh_fgo_nodes(cluster, core, [INTEGRATION])  # no status-updater of the old topology left after this
    wait_for(
        "one status-updater",
        lambda: len(core.list_namespaced_pod(NS, label_selector="app=status-updater").items) == 1,
        120,
    )
    fgo_labels = [k for k in node_labels(core, INTEGRATION) if k.startswith("nvidia.com/gpu.deploy.")] + [
        "run.ai/fake.gpu"
    ]
    ok(kubectl(cluster, "label", "node", INTEGRATION, *(f"{k}-" for k in fgo_labels)))
    wait_for("FGO's DaemonSet pods off the integration node", lambda: _only_deployments_on(core, INTEGRATION), 120)

    def refused() -> bool:
        live = [p for p in core.list_namespaced_pod(NS, label_selector="app=status-updater").items]
        logs = [
            core.read_namespaced_pod_log(p.metadata.name, NS) for p in live if p.metadata.deletion_timestamp is None
        ]
        return any("nodepool integration not found in cluster topology" in text for text in logs)

    wait_for("status-updater leaving the integration node alone", refused, 60)
    assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in node_labels(core, INTEGRATION))
    ok(kubectl(cluster, "rollout", "restart", "daemonset", "mokka"))
    ok(kubectl(cluster, "rollout", "status", "daemonset", "mokka", "--timeout=180s"))

    def relabelled() -> bool:  # the new pod's node-identity step (the old one's preStop removed its record)
        node = core.read_node(INTEGRATION).metadata
        labels = node.labels or {}
        return "mokka.io/node-identity" in (node.annotations or {}) and (
            labels.get("nvidia.com/gpu.product"),
            labels.get("nvidia.com/gpu.count"),
            labels.get("nvidia.com/gpu.memory"),
        ) == ("NVIDIA-H100-80GB-HBM3", "8", "81559")

    wait_for("Mokka's labels back on its node", relabelled, 60)
    assert "run.ai/fake.gpu" not in node_labels(core, INTEGRATION)


def _only_deployments_on(core: Any, node: str) -> bool:
    """No pod of FGO's DaemonSets on ``node`` (its Deployments may be scheduled anywhere)."""
    apps = pods_by_app(core)
    return all(node not in apps.get(a, set()) for a in ("device-plugin", "nvidia-dcgm-exporter"))


def _daemonset(cluster: Cluster, name: str) -> dict[str, Any]:
    res = kubectl(cluster, "-n", NS, "get", "ds", name, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else {}


# ---------------------------------------------------------------------------------------- failure modes


def test_failure_two_mokka_releases_with_the_integration(cluster: Cluster) -> None:
    """A second release with the guide's values collides on the seven (eight) names, in Mokka's
    namespace or any other: what collides is the target namespace."""
    for extra in ((), ("-n", "mokka-b", "--create-namespace")):
        res = mokka_install(cluster, "mokka-b", *extra)
        assert res.returncode == 1
        assert (
            'Error: INSTALLATION FAILED: Unable to continue with install: ConfigMap "gpu-profile-a100" in namespace '
            '"gpu-operator" exists and cannot be imported into the current release: invalid ownership metadata; '
            'annotation validation error: key "meta.helm.sh/release-name" must equal "mokka-b": '
            'current value is "mokka"'
        ) in res.stderr, res.stderr
    kubectl(cluster, "delete", "namespace", "mokka-b", "--wait=false")


def test_failure_profile_labels_cannot_remove_the_contract_label(cluster: Cluster, core: Any) -> None:
    labels = '{"my-org/custom-label":"gpu-sim","fake-gpu-operator/gpu-profile":"false"}'
    res = helm(
        cluster, "upgrade", "mokka", str(REPO / "charts" / "mokka"), "--reuse-values",
        "--set-json", f"integrations.fakeGpuOperator.profileLabels={labels}", "--wait", "--timeout", "120s",
    )  # fmt: skip
    ok(res)
    for cm in core.list_namespaced_config_map(NS, label_selector="app.kubernetes.io/instance=mokka").items:
        assert cm.metadata.labels["fake-gpu-operator/gpu-profile"] == "true", cm.metadata.name
        assert cm.metadata.labels["my-org/custom-label"] == "gpu-sim", cm.metadata.name
    out = ok(kubectl(cluster, "-n", NS, "get", "cm", "-l", "fake-gpu-operator/gpu-profile=true", "-o", "name"))
    assert len(out.split()) == 8


# ---------------------------------------------------------------------------------------- FGO's mock backend


NVML_MOCK_RBAC = """\
apiVersion: v1
kind: ServiceAccount
metadata: {name: nvml-mock, namespace: gpu-operator}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nvml-mock}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get, patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nvml-mock}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nvml-mock}
subjects: [{kind: ServiceAccount, name: nvml-mock, namespace: gpu-operator}]
"""
MOCK_NODE = SCALE[1]


def test_mock_backend_served_by_mokkas_image(cluster: Cluster, core: Any, fgo_chart: Path) -> None:
    """A pool `mock` (`gpu: {backend: mock, profile: h100}`) on a real node: status-updater's
    nvml-mock-mock DaemonSet pulls Mokka's node image from the local registry (policy Always), its
    pod stages the node through Mokka's host setup under /var/lib/nvml-mock, links /run/nvidia/driver
    there (FGO's wrapper then writes toolkit-ready), writes the CDI spec and labels the node; a plain
    pod reading the driver root as the GPU Operator's validator does runs the real nvidia-smi on the
    profile's 8 GPUs. Taking the pool out deletes the DaemonSet, and its preStop undoes all of it."""
    ref = registry.start(cluster, prepare.go_binary(versions.REGISTRY)) + "/mokka/node:1"
    assert registry.push(cluster, nodeimage.NODE_IMAGE, "mokka/node:1") == ref
    assert registry.manifest_exists(cluster, "mokka/node:1")
    ok(
        cluster.kubectl("apply", "-f", "-", input=NVML_MOCK_RBAC, check=False)
    )  # FGO renders these only with gpuOperator on
    ok(kubectl(cluster, "label", "node", MOCK_NODE, f"{POOL}=mock", "--overwrite"))
    values = SCALE_ONLY + "    mock:\n      gpu: {backend: mock, profile: h100}\n"
    values += f"nvmlMock:\n  image: {{repository: {ref.rsplit(':', 1)[0]}, tag: '1'}}\n"
    ok(fgo_install(cluster, fgo_chart, values, "--set", "builtinProfiles.enabled=false"))
    selector = "fake-gpu-operator/component=nvml-mock"
    try:
        wait_for("nvml-mock-mock's pod Ready", lambda: running(core, NS, selector, 1), 180)
    except AssertionError:
        raise AssertionError(kubectl(cluster, "-n", NS, "describe", "pods", "-l", selector).stdout[-4000:]) from None
    ds = _daemonset(cluster, "nvml-mock-mock")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == (ref, "Always")
    pod = core.list_namespaced_pod(NS, label_selector=selector).items[0]
    assert pod.spec.node_name == MOCK_NODE
    events = ok(
        kubectl(cluster, "-n", NS, "get", "events", "--field-selector", f"involvedObject.name={pod.metadata.name}")
    )
    assert f'Successfully pulled image "{ref}"' in events, events

    node = next(n for n in cluster.nodes if n.name == MOCK_NODE).layout
    run_nvidia, root = node.private("/run/nvidia"), node.private("/var/lib/nvml-mock")
    ready = run_nvidia / "validations" / "toolkit-ready"  # FGO's wrapper: once the driver link is there

    def staged() -> bool:  # the entrypoint's last line: CDI spec and labels written too
        logs = kubectl(cluster, "-n", NS, "logs", pod.metadata.name).stdout
        return f"nvml-mock: node {MOCK_NODE} staged at /var/lib/nvml-mock" in logs

    try:
        wait_for("the nvml-mock pod's entrypoint done", staged, 120)
    except AssertionError:
        raise AssertionError(kubectl(cluster, "-n", NS, "logs", pod.metadata.name, "--tail=40").stdout) from None
    assert ready.is_file()
    assert os.readlink(run_nvidia / "driver") == "/var/lib/nvml-mock/driver"
    assert json.loads((root / "node.json").read_text())["profile"] == "h100"
    spec = json.loads((node.private("/var/run/cdi") / "nvidia.com-gpu.json").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and len([d for d in spec["devices"] if d["name"].isdigit()]) == 8
    assert node_labels(core, MOCK_NODE)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"

    listed = pod_output(
        core, "driver-root-smi", "mock",
        ["sh", "-c", "LD_LIBRARY_PATH=/run/nvidia/driver/usr/lib64 /run/nvidia/driver/usr/bin/nvidia-smi -L"],
        container={"volumeMounts": [
            {"name": "run-nvidia", "mountPath": "/run/nvidia", "readOnly": True},
            {"name": "nvml-mock", "mountPath": "/var/lib/nvml-mock", "readOnly": True},
        ]},
        volumes=[
            {"name": "run-nvidia", "hostPath": {"path": "/run/nvidia"}},
            {"name": "nvml-mock", "hostPath": {"path": "/var/lib/nvml-mock"}},
        ],
    )  # fmt: skip
    assert listed.count(H100) == 8, listed

    ok(fgo_install(cluster, fgo_chart, SCALE_ONLY, "--set", "builtinProfiles.enabled=false"))
    wait_for("the nvml-mock pod gone", lambda: not core.list_namespaced_pod(NS, label_selector=selector).items, 120)
    assert not (run_nvidia / "driver").exists() and not (run_nvidia / "validations").exists()
    assert not any(root.iterdir()), list(root.iterdir())
    assert not (node.private("/var/run/cdi") / "nvidia.com-gpu.json").exists()
    assert "mokka.io/node-identity" not in (core.read_node(MOCK_NODE).metadata.annotations or {})


def test_failure_builtin_profiles_left_on_fgo_first(cluster: Cluster, core: Any, fgo_chart: Path) -> None:
    """FGO installed first with its builtin profiles on (the default): then Mokka's Step 2 fails with
    Helm's ownership error naming FGO's release."""
    ok(helm(cluster, "uninstall", "mokka", "--wait", "--timeout", "180s"))
    ok(helm(cluster, "uninstall", "gpu-operator", "-n", NS, "--wait", "--timeout", "180s"))
    ok(fgo_install(cluster, fgo_chart, SCALE_ONLY, wait=False))
    try:
        res = mokka_install(cluster)
        assert res.returncode == 1
        assert (
            'Error: INSTALLATION FAILED: Unable to continue with install: ConfigMap "gpu-profile-a100" in namespace '
            '"gpu-operator" exists and cannot be imported into the current release: invalid ownership metadata; '
            'annotation validation error: key "meta.helm.sh/release-name" must equal "mokka": current value is '
            '"gpu-operator"'
        ) in res.stderr, res.stderr
    finally:
        helm(cluster, "uninstall", "mokka", "--ignore-not-found")
        ok(helm(cluster, "uninstall", "gpu-operator", "-n", NS, "--wait", "--timeout", "180s"))
