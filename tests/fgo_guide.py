"""The pairing guide "Run:ai Fake GPU Operator", step by step, on whichever cluster a test module
gives it: Mokka's chart on the `integration` pool, run:ai fake-gpu-operator's (FGO 0.2.0) own Helm
chart on the `scale` pool, FGO's images built without Docker from its binaries under FGO's own names,
real helm, real kubelets. tests/test_kind_cluster.py runs these steps on kind (the guide's own
cluster), tests/test_cluster_fgo_guide.py on the local cluster (``mokka cluster up``), each giving a
:class:`Guide` fixture (``guide``) and an ``images`` fixture that puts the images on the nodes.

Every step's command is the guide's; where the guide names nvml-mock's objects (its chart,
`app.kubernetes.io/name=nvml-mock`, `ds/nvml-mock`) the test runs the guide's command first, asserts
what a user sees, then Mokka's names. Two deviations, each forced and asserted: FGO's chart directory
needs its dependency entries dropped (helm refuses a chart whose disabled subcharts are not vendored)
and its images' pull policy set to IfNotPresent (nothing here serves ghcr.io). A module imports the
tests in this file's order; each is one step. Then the guide's failure modes (wrong namespace, FGO's
builtin profiles left on in either order, two Mokka releases, profileLabels) as a user meets them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_fixtures import wait_for

from fetch import prepare, thirdparty, versions
from fetch.kube import versions as kube_versions
from localcluster.addons import fgo_images

REPO = Path(__file__).resolve().parent.parent
FGO_SRC = thirdparty.directory("MOKKA_FGO_DIR", "fake-gpu-operator")
HAVE_FGO = FGO_SRC is not None and (FGO_SRC / "chart" / "Chart.yaml").is_file()
NO_FGO = "no fake-gpu-operator build and chart (../shared/thirdparty/fake-gpu-operator)"

POOL = "run.ai/simulated-gpu-node-pool"
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


@dataclass
class Guide:
    """What the steps need of a cluster: its admin kubeconfig (usable from this process), where helm
    keeps its state, kubectl, the API, the pool workers and a node's images."""

    kubeconfig: Path
    helm_home: Path
    kubectl: Callable[..., subprocess.CompletedProcess[str]]  # (*args, input=None), never raises
    api: Callable[[], Any]
    integration: str
    scale: tuple[str, str]
    images_on: Callable[[str], set[str]]  # a node's image references, as its containerd lists them
    workload_image: str  # an image on every node with a shell, for the plain pods
    label_pools: Callable[[], None]  # the guide's Step 1 labels, where the cluster's config has not set them


def helm_binary() -> Path:
    return prepare.go_binary(versions.HELM)  # built by .ci/setup --tests


def registry_binary() -> Path:
    return prepare.debian_program(kube_versions.REGISTRY)  # unpacked by .ci/setup --tests


# ---------------------------------------------------------------------------------------- fixtures


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
def core(guide: Guide) -> Any:
    from kubernetes import client

    return client.CoreV1Api(guide.api())


# ---------------------------------------------------------------------------------------- helpers


def run_helm(
    kubeconfig: Path, home: Path, *args: str, values: str | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """helm as a user runs it (``-f -`` reads ``values``) against ``kubeconfig``, its state under ``home``."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": str(home)}
    env["HELM_CONFIG_HOME"] = env["HELM_DATA_HOME"] = env["HELM_CACHE_HOME"]
    argv = [str(helm_binary()), *args] + (["-f", "-"] if values is not None else [])
    return subprocess.run(argv, input=values, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def helm(guide: Guide, *args: str, values: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """helm with the cluster's admin kubeconfig."""
    return run_helm(guide.kubeconfig, guide.helm_home, *args, values=values, timeout=timeout)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"{res.args}: {res.stderr or res.stdout}"
    return res.stdout


def mokka_install(guide: Guide, release: str = "mokka", *extra: str, sets: tuple[str, ...] = GUIDE_MOKKA_SETS) -> Any:
    argv = ["install", release, str(REPO / "charts" / "mokka"), *extra]
    for s in sets:
        argv += ["--set", s]
    return helm(guide, *argv, "--wait", "--timeout", "120s")


def fgo_install(guide: Guide, chart: Path, values: str, *extra: str, wait: bool = True) -> Any:
    argv = ["upgrade", "--install", "gpu-operator", str(chart), "-n", NS, *extra]
    for s in PULL_POLICIES:
        argv += ["--set", s]
    return helm(guide, *argv, *(["--wait", "--timeout", "120s"] if wait else []), values=values)


def kubectl(guide: Guide, *args: str) -> subprocess.CompletedProcess[str]:
    return guide.kubectl(*args)


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
    topology: dict[str, Any] = yaml.safe_load(cm.data["topology.yml"])
    return topology


def pod_output(guide: Guide, core: Any, name: str, node_pool: str, command: list[str], **spec: Any) -> str:
    from cluster_fixtures import run_pod

    container = {"name": "main", "image": guide.workload_image, "imagePullPolicy": "Never", "command": command}
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


def refresh_fgo_nodes(guide: Guide, core: Any, nodes: list[str]) -> None:
    """What FGO 0.2.0 needs after its topology changes: its per-node ConfigMaps are made once, when
    status-updater first sees a node, and never rewritten; delete them and restart it."""
    for n in nodes:
        kubectl(guide, "-n", NS, "delete", "cm", f"topology-{n}", "--ignore-not-found")
    ok(kubectl(guide, "-n", NS, "rollout", "restart", "deployment", "status-updater"))
    ok(kubectl(guide, "-n", NS, "rollout", "status", "deployment", "status-updater", "--timeout=120s"))


# ---------------------------------------------------------------------------------------- the guide


def test_fgo_images_under_fgos_names(guide: Guide, images: list[Path]) -> None:
    listed = guide.images_on(guide.integration)
    for image in fgo_images.IMAGES:
        assert f"ghcr.io/run-ai/fake-gpu-operator/{image.target}:0.0.1" in listed
    assert {fgo_images.UBUNTU, MOKKA_IMAGE} <= listed


def test_step1_pool_labels(guide: Guide, core: Any) -> None:
    """One `integration` worker and two `scale` workers (kind: the guide's kind config; the local
    cluster: the same labels with kubectl)."""
    guide.label_pools()
    pools = {n.metadata.name: (n.metadata.labels or {}).get(POOL) for n in core.list_node().items}
    assert {n: p for n, p in pools.items() if p} == {
        guide.integration: "integration",
        guide.scale[0]: "scale",
        guide.scale[1]: "scale",
    }
    assert ok(kubectl(guide, "get", "nodes", "-l", f"{POOL}=integration", "-o", "name")).split() == [
        f"node/{guide.integration}"
    ]


def test_failure_profiles_in_the_wrong_namespace(guide: Guide, images: Any) -> None:
    """The guide's Step 2 without targetNamespace: the ConfigMaps land in Mokka's release namespace
    and the name FGO gets in its own namespace is NotFound (the guide's own check). The release's
    pods are kept off every node (a pool nobody has): only the ConfigMaps matter here."""
    ok(kubectl(guide, "create", "namespace", NS))
    sets = tuple(s for s in GUIDE_MOKKA_SETS if "targetNamespace" not in s and "nodeSelector" not in s)
    ok(
        mokka_install(
            guide,
            "mokka-nons",
            "-n",
            "mokka-nons",
            "--create-namespace",
            sets=(*sets, "nodeSelector.run\\.ai/simulated-gpu-node-pool=nowhere"),
        )
    )
    try:
        res = kubectl(guide, "get", "cm", "gpu-profile-h100", "-n", NS, "-o", "name")
        assert res.returncode == 1
        assert res.stderr.strip() == 'Error from server (NotFound): configmaps "gpu-profile-h100" not found'
        assert ok(kubectl(guide, "get", "cm", "gpu-profile-h100", "-n", "mokka-nons", "-o", "name")).strip() == (
            "configmap/gpu-profile-h100"
        )
    finally:
        ok(helm(guide, "uninstall", "mokka-nons", "-n", "mokka-nons", "--wait"))
        kubectl(guide, "delete", "namespace", "mokka-nons", "--wait=false")


def test_step2_mokka_on_the_integration_pool(guide: Guide, core: Any, images: Any) -> None:
    started = time.monotonic()
    ok(mokka_install(guide))
    took = time.monotonic() - started
    # helm --wait does not wait for a DaemonSet with one pod (maxUnavailable 1): it may return first.
    print(f"helm install --wait returned after {took:.1f}s")
    try:
        wait_for("Mokka's pod Ready", lambda: running(core, "default", "app.kubernetes.io/name=mokka", 1), 180)
    except AssertionError:
        raise AssertionError(kubectl(guide, "describe", "pods", "-n", "default").stdout[-3000:]) from None


def test_step3_fgo_chart_as_shipped_needs_its_subcharts(guide: Guide) -> None:
    """FGO's chart directory (deploy/fake-gpu-operator at 0.2.0) lists NVIDIA's gpu-operator and DRA
    charts as dependencies without vendoring them: helm refuses it although both are disabled (the
    guide installs the packaged chart from ghcr.io, which carries them)."""
    assert FGO_SRC is not None
    res = fgo_install(guide, FGO_SRC / "chart", GUIDE_TOPOLOGY, "--set", "builtinProfiles.enabled=false")
    assert res.returncode == 1
    assert "found in Chart.yaml, but missing in charts/ directory: gpu-operator, nvidia-dra-driver-gpu" in res.stderr


def test_failure_builtin_profiles_left_on_fgo_second(guide: Guide, fgo_chart: Path) -> None:
    """Step 3 without builtinProfiles.enabled=false, after Mokka: Helm's ownership error, nothing installed."""
    res = fgo_install(guide, fgo_chart, GUIDE_TOPOLOGY)
    assert res.returncode == 1
    assert (
        'Error: Unable to continue with install: ConfigMap "gpu-profile-a100" in namespace "gpu-operator" exists '
        "and cannot be imported into the current release: invalid ownership metadata; annotation validation error: "
        'key "meta.helm.sh/release-name" must equal "gpu-operator": current value is "mokka"'
    ) in res.stderr, res.stderr
    assert ok(helm(guide, "list", "-n", NS, "-a", "-q")).split() == []


def test_step3_fgo_with_the_guides_values_as_written(guide: Guide, core: Any, fgo_chart: Path) -> None:
    """Installs, but FGO 0.2.0 does not read the guide's pool shape: it falls back to the legacy
    `gpuCount` (8 GPUs per node), never reads a profile (product "" and memory 0 on every pool node,
    the integration node included), ignores `backend` (no nvml-mock DaemonSet), and keeps its chart's
    `default` pool (Helm merges maps). Its device plugin and status exporter land on the integration
    node too, and the exporter overwrites Mokka's GPU labels there."""
    ok(fgo_install(guide, fgo_chart, GUIDE_TOPOLOGY, "--set", "builtinProfiles.enabled=false"))
    pools = yaml.safe_load(core.read_namespaced_config_map("topology", NS).data["topology.yml"])["nodePools"]
    assert sorted(pools) == ["default", "integration", "scale"]
    assert pools["integration"] == {"backend": "mock", "gpuCount": 8, "gpuProfile": "h100"}

    def served() -> bool:
        return all(
            node_labels(core, n).get("run.ai/fake.gpu") == "true"
            and core.read_node(n).status.allocatable.get("nvidia.com/gpu") == "8"
            for n in (guide.integration, *guide.scale)
        )

    wait_for("FGO's device plugin and exporter on every pool node", served, 120)
    for n in (guide.integration, *guide.scale):
        assert topology_of(core, n)["gpuProduct"] == ""
        labels = node_labels(core, n)
        assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.memory"]) == ("", "0"), n
    assert guide.integration in pods_by_app(core)["device-plugin"]
    assert guide.integration in pods_by_app(core)["nvidia-dcgm-exporter"]
    assert not core.list_namespaced_config_map(NS, label_selector="fake-gpu-operator/component=nvml-mock").items
    assert "nvml-mock-integration" not in ok(kubectl(guide, "-n", NS, "get", "ds", "-o", "name"))


def test_step4_mokka_runs_only_on_the_integration_worker(guide: Guide) -> None:
    res = kubectl(guide, "get", "pods", "-l", "app.kubernetes.io/name=nvml-mock", "-o", "wide")
    assert res.stderr.strip() == "No resources found in default namespace."  # the guide's label is nvml-mock's
    mine = ok(kubectl(guide, "get", "pods", "-l", "app.kubernetes.io/name=mokka", "-o", "json"))
    assert [p["spec"]["nodeName"] for p in json.loads(mine)["items"]] == [guide.integration]


def test_step4_the_profile_configmaps_in_fgos_namespace(guide: Guide) -> None:
    out = ok(kubectl(guide, "-n", NS, "get", "cm", "-l", "fake-gpu-operator/gpu-profile=true", "-o", "name"))
    # Eight, not the guide's seven: Mokka has h200, FGO's builtin set does not.
    assert out.split() == [
        f"configmap/gpu-profile-{p}" for p in ("a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4")
    ]


def test_step4_a_real_nvidia_smi(guide: Guide, core: Any) -> None:
    """`kubectl exec ds/nvml-mock -- nvidia-smi`: no such DaemonSet with Mokka's chart; with Mokka's
    name the image has no nvidia-smi on PATH (the plugin's pod is opted out of injection). The
    staged driver root's nvidia-smi in that container, and any pod on the integration node, are the
    real nvidia-smi on the 8 mock H100s."""
    res = kubectl(guide, "exec", "ds/nvml-mock", "--", "nvidia-smi")
    assert 'daemonsets.apps "nvml-mock" not found' in res.stderr, res.stderr
    res = kubectl(guide, "exec", "ds/mokka", "--", "nvidia-smi")
    assert res.returncode != 0 and 'exec: "nvidia-smi": executable file not found in $PATH' in res.stderr, res.stderr
    staged = "LD_LIBRARY_PATH=/var/lib/mokka/driver/usr/lib64 /var/lib/mokka/driver/usr/bin/nvidia-smi"
    table = ok(kubectl(guide, "exec", "ds/mokka", "--", "sh", "-c", staged))
    assert table.count("H100 80GB HBM3") == 8 and "NVIDIA-SMI" in table, table
    listed = pod_output(guide, core, "smi", "integration", ["nvidia-smi", "-L"])
    assert listed.count(H100) == 8, listed


def test_step4_fgo_on_the_scale_workers(guide: Guide, core: Any) -> None:
    """`kubectl get pods -l app=fake-gpu-operator`: no FGO pod carries that label (and the guide's
    command looks in namespace default). FGO's per-node pods are `app=device-plugin` and
    `app=nvidia-dcgm-exporter` in gpu-operator, and with the guide's topology they run on the
    integration worker as well."""
    assert kubectl(guide, "get", "pods", "-l", "app=fake-gpu-operator", "-o", "wide").stderr.strip() == (
        "No resources found in default namespace."
    )
    assert kubectl(guide, "get", "pods", "-A", "-l", "app=fake-gpu-operator").stderr.strip() == "No resources found"
    apps = pods_by_app(core)
    assert set(guide.scale) <= apps["device-plugin"] and set(guide.scale) <= apps["nvidia-dcgm-exporter"]
    assert {"status-updater", "topology-server", "kwok-gpu-device-plugin", "nvidia-dcgm-exporter-kwok"} <= set(apps)


def test_when_fgo_does_not_pick_up_the_profiles(guide: Guide) -> None:
    assert ok(kubectl(guide, "get", "cm", "gpu-profile-h100", "-n", NS, "-o", "name")).strip() == (
        "configmap/gpu-profile-h100"
    )
    body = ok(kubectl(guide, "get", "cm", "gpu-profile-h100", "-n", NS, "-o", "jsonpath={.data.profile\\.yaml}"))
    head = body.splitlines()[:5]
    assert head[0].startswith("# Generated by charts/mokka/update-generated.py") and "version: '1.0'" in head, head
    res = kubectl(guide, "rollout", "restart", "deployment", "fake-gpu-operator", "-n", NS)
    assert res.returncode == 1
    assert res.stderr.strip() == 'Error from server (NotFound): deployments.apps "fake-gpu-operator" not found'
    # FGO 0.2.0's profile reader is status-updater.
    assert "deployment.apps/status-updater restarted" in ok(
        kubectl(guide, "rollout", "restart", "deployment", "status-updater", "-n", NS)
    )
    ok(kubectl(guide, "-n", NS, "rollout", "status", "deployment", "status-updater", "--timeout=120s"))


def test_step3_fgo_with_the_shape_fgo_reads(guide: Guide, core: Any, fgo_chart: Path) -> None:
    """nodePools.<pool>.gpu.{backend,profile}: FGO reads Mokka's gpu-profile-h100 (product, memory,
    driver), once its per-node ConfigMaps are made again; `backend: mock` on the integration pool
    makes status-updater create nvml-mock-integration with upstream's image, whose pods cannot be
    created (FGO's chart makes the nvml-mock ServiceAccount only with gpuOperator or
    nvidiaDraDriver on), and FGO's device plugin stays on the integration node."""
    ok(fgo_install(guide, fgo_chart, V020_TOPOLOGY, "--set", "builtinProfiles.enabled=false"))
    assert topology_of(core, guide.scale[0])["gpuProduct"] == ""  # not rewritten by the upgrade
    refresh_fgo_nodes(guide, core, [guide.integration, *guide.scale])

    def profiled() -> bool:
        try:
            return all(topology_of(core, n).get("gpuProduct") == H100 for n in guide.scale)
        except Exception:
            return False

    wait_for("FGO's node topologies from Mokka's profile", profiled, 90)
    topo = topology_of(core, guide.scale[0])
    assert (topo["gpuMemory"], topo["driverVersion"]) == (81559, "580.105.08")
    wait_for(
        "the profile's labels on the scale nodes",
        lambda: all(node_labels(core, n).get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3" for n in guide.scale),
        90,
    )
    ds = wait_for("nvml-mock-integration", lambda: daemonset(guide, "nvml-mock-integration"), 60)
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/nvidia/nvml-mock:sha-1706195"
    assert ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"

    def refused() -> str:
        out = kubectl(guide, "-n", NS, "get", "events", "--field-selector", "involvedObject.name=nvml-mock-integration")
        return out.stdout if 'serviceaccount "nvml-mock" not found' in out.stdout else ""

    wait_for("the DaemonSet's pods refused", refused, 60)
    assert guide.integration in pods_by_app(core)["device-plugin"]


def test_pairing_that_keeps_fgo_off_the_mokka_pool(guide: Guide, core: Any, fgo_chart: Path) -> None:
    """Only the scale pool in FGO's topology: status-updater leaves the integration node alone
    ("nodepool integration not found in cluster topology"), so FGO's device plugin and exporter stay
    off it once the labels FGO put there are removed; Mokka's pod, restarted, labels its node again."""
    ok(fgo_install(guide, fgo_chart, SCALE_ONLY, "--set", "builtinProfiles.enabled=false"))
    wait_for("nvml-mock-integration deleted", lambda: not daemonset(guide, "nvml-mock-integration"), 60)
    refresh_fgo_nodes(guide, core, [guide.integration])  # no status-updater of the old topology left after this
    wait_for(
        "one status-updater",
        lambda: len(core.list_namespaced_pod(NS, label_selector="app=status-updater").items) == 1,
        120,
    )
    fgo_labels = [k for k in node_labels(core, guide.integration) if k.startswith("nvidia.com/gpu.deploy.")] + [
        "run.ai/fake.gpu"
    ]
    ok(kubectl(guide, "label", "node", guide.integration, *(f"{k}-" for k in fgo_labels)))
    wait_for(
        "FGO's DaemonSet pods off the integration node", lambda: _only_deployments_on(core, guide.integration), 120
    )

    def refused() -> bool:
        live = [p for p in core.list_namespaced_pod(NS, label_selector="app=status-updater").items]
        logs = [
            core.read_namespaced_pod_log(p.metadata.name, NS) for p in live if p.metadata.deletion_timestamp is None
        ]
        return any("nodepool integration not found in cluster topology" in text for text in logs)

    wait_for("status-updater leaving the integration node alone", refused, 60)
    assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in node_labels(core, guide.integration))
    ok(kubectl(guide, "rollout", "restart", "daemonset", "mokka"))
    ok(kubectl(guide, "rollout", "status", "daemonset", "mokka", "--timeout=180s"))

    def relabelled() -> bool:  # the new pod's node-identity step (the old one's preStop removed its record)
        node = core.read_node(guide.integration).metadata
        labels = node.labels or {}
        return "mokka.io/node-identity" in (node.annotations or {}) and (
            labels.get("nvidia.com/gpu.product"),
            labels.get("nvidia.com/gpu.count"),
            labels.get("nvidia.com/gpu.memory"),
        ) == ("NVIDIA-H100-80GB-HBM3", "8", "81559")

    wait_for("Mokka's labels back on its node", relabelled, 60)
    assert "run.ai/fake.gpu" not in node_labels(core, guide.integration)


def _only_deployments_on(core: Any, node: str) -> bool:
    """No pod of FGO's DaemonSets on ``node`` (its Deployments may be scheduled anywhere)."""
    apps = pods_by_app(core)
    return all(node not in apps.get(a, set()) for a in ("device-plugin", "nvidia-dcgm-exporter"))


def daemonset(guide: Guide, name: str) -> dict[str, Any]:
    res = kubectl(guide, "-n", NS, "get", "ds", name, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else {}


# ---------------------------------------------------------------------------------------- failure modes


def test_failure_two_mokka_releases_with_the_integration(guide: Guide) -> None:
    """A second release with the guide's values collides on the seven (eight) names, in Mokka's
    namespace or any other: what collides is the target namespace."""
    for extra in ((), ("-n", "mokka-b", "--create-namespace")):
        res = mokka_install(guide, "mokka-b", *extra)
        assert res.returncode == 1
        assert (
            'Error: INSTALLATION FAILED: Unable to continue with install: ConfigMap "gpu-profile-a100" in namespace '
            '"gpu-operator" exists and cannot be imported into the current release: invalid ownership metadata; '
            'annotation validation error: key "meta.helm.sh/release-name" must equal "mokka-b": '
            'current value is "mokka"'
        ) in res.stderr, res.stderr
    kubectl(guide, "delete", "namespace", "mokka-b", "--wait=false")


def test_failure_profile_labels_cannot_remove_the_contract_label(guide: Guide, core: Any) -> None:
    labels = '{"my-org/custom-label":"gpu-sim","fake-gpu-operator/gpu-profile":"false"}'
    res = helm(
        guide, "upgrade", "mokka", str(REPO / "charts" / "mokka"), "--reuse-values",
        "--set-json", f"integrations.fakeGpuOperator.profileLabels={labels}", "--wait", "--timeout", "120s",
    )  # fmt: skip
    ok(res)
    for cm in core.list_namespaced_config_map(NS, label_selector="app.kubernetes.io/instance=mokka").items:
        assert cm.metadata.labels["fake-gpu-operator/gpu-profile"] == "true", cm.metadata.name
        assert cm.metadata.labels["my-org/custom-label"] == "gpu-sim", cm.metadata.name
    out = ok(kubectl(guide, "-n", NS, "get", "cm", "-l", "fake-gpu-operator/gpu-profile=true", "-o", "name"))
    assert len(out.split()) == 8


def test_failure_builtin_profiles_left_on_fgo_first(guide: Guide, core: Any, fgo_chart: Path) -> None:
    """FGO installed first with its builtin profiles on (the default): then Mokka's Step 2 fails with
    Helm's ownership error naming FGO's release."""
    ok(helm(guide, "uninstall", "mokka", "--wait", "--timeout", "180s"))
    ok(helm(guide, "uninstall", "gpu-operator", "-n", NS, "--wait", "--timeout", "180s"))
    ok(fgo_install(guide, fgo_chart, SCALE_ONLY, wait=False))
    try:
        res = mokka_install(guide)
        assert res.returncode == 1
        assert (
            'Error: INSTALLATION FAILED: Unable to continue with install: ConfigMap "gpu-profile-a100" in namespace '
            '"gpu-operator" exists and cannot be imported into the current release: invalid ownership metadata; '
            'annotation validation error: key "meta.helm.sh/release-name" must equal "mokka": current value is '
            '"gpu-operator"'
        ) in res.stderr, res.stderr
    finally:
        helm(guide, "uninstall", "mokka", "--ignore-not-found")
        ok(helm(guide, "uninstall", "gpu-operator", "-n", NS, "--wait", "--timeout", "180s"))


def steps(through_the_last: bool = True) -> dict[str, Callable[..., None]]:
    """The guide's steps, in this file's order, for a module to take as its tests
    (``globals().update(fgo_guide.steps())``); without the last (FGO installed first, which
    leaves the cluster without either release) when the module has tests of its own before it."""
    found = {name: fn for name, fn in globals().items() if name.startswith("test_") and callable(fn)}
    if not through_the_last:
        found.pop("test_failure_builtin_profiles_left_on_fgo_first")
    return found
