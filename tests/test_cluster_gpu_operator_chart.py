"""NVIDIA's GPU Operator over Mokka's chart, as docs/guides/gpu-operator.md tells a user to run it on a cluster of
their own: Mokka's chart (its DaemonSet from Mokka's node image) stages each node at
/var/lib/mokka, runs the NRI plugin with ``plugin.allocator=external`` and writes the NFD feature
file; the operator's images are on the nodes (``mokka gpu-operator images``); the operator's chart
is installed with Mokka's values file alone. The operator is the user's own
(``MOKKA_GPU_OPERATOR_DIR``). The cluster runs no GPU stack of its own (and its containerd already
has the ``nvidia`` handler ``containerdConfig.install`` adds on a real node)."""

from __future__ import annotations

import json
import lzma
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import install_chart, needs_gpu_operator, pod_manifest, run_pod, start_cluster, wait_for

from fetch import debcache, prepare, versions
from fetch.kube import gpu_operator as build
from localcluster.addons import gpu_operator
from localcluster.addons.gpu_operator import install
from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow, needs_gpu_operator]

MOKKA_NS = "mokka-system"
USERS_CHART = "v25.3.4-user.1"
GPUS = 2
# What docs/guides/gpu-operator.md gives for Mokka's chart under the GPU Operator (containerdConfig.install aside).
MOKKA_VALUES = {"gpu": {"profile": "h100", "count": GPUS}, "plugin": {"allocator": "external"}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("gpu-operator-chart")
    with start_cluster(base, profile="h100", gpus=GPUS, allocator="none", nri_plugin=False) as c:
        yield c


@pytest.fixture(scope="module")
def users_operator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A user's own GPU Operator in ``MOKKA_GPU_OPERATOR_DIR``: here the built one repackaged as a
    user brings it (its programs xz-compressed, its chart marked as theirs)."""
    built = build.cached(debcache.default_cache())
    assert built is not None
    user = tmp_path_factory.mktemp("users-operator")
    for name in ("chart", "assets", "manifests"):
        shutil.copytree(built.operator / name, user / name, symlinks=True)
    chart = user / "chart" / "Chart.yaml"
    chart.write_text(chart.read_text().replace("version: v1.0.0-devel", f"version: {USERS_CHART}"))
    for program in gpu_operator.OPERATOR_PROGRAMS:
        (user / f"{program}.xz").write_bytes(lzma.compress((built.operator / program).read_bytes(), preset=0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gpu_operator.OPERATOR_ENV, str(user))
        yield user


@pytest.fixture(scope="module")
def installed(cluster: Cluster, users_operator: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    mokka = install_chart(cluster, MOKKA_NS, MOKKA_VALUES, tmp_path_factory.mktemp("mokka-chart"))

    def staged() -> bool:
        ds = json.loads(cluster.kubectl("get", "daemonset", "-n", MOKKA_NS, "-o", "json").stdout)["items"]
        return bool(ds) and ds[0]["status"].get("numberReady", 0) == 1

    wait_for("Mokka's DaemonSet Ready (the node staged at /var/lib/mokka)", staged, 180)
    out = tmp_path_factory.mktemp("gpu-operator-images")
    made = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "gpu-operator", "images", "--out", str(out)],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(made) == len(gpu_operator.image_names(gpu_operator.values())) - 1, made  # gfd: the plugin's image
    for line in made:
        cluster.import_image(Path(line.split()[0]))
    cache = debcache.default_cache()
    built = build.cached(cache)
    assert built is not None
    chart = gpu_operator.operator(built, cache).chart  # the user's
    t0 = time.monotonic()
    install.install(cluster, prepare.go_binary(versions.HELM), chart, mig_strategy="single")  # the chart's default
    install.served(cluster, "single", t0)
    yield cluster
    cluster.kubectl("delete", "namespace", gpu_operator.NAMESPACE, "--wait=false", check=False)
    cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=mokka, check=False)


def test_the_policy_is_reconciled_on_the_node_mokkas_chart_staged(installed: Cluster) -> None:
    assert install.policy_ready(installed)
    node = installed.node()
    assert install.missing(node) == []
    driver = dict(
        line.split("=", 1) for line in (install.validations(node) / "driver-ready").read_text().splitlines() if line
    )
    assert driver["NVIDIA_DRIVER_ROOT"] == "/var/lib/mokka/driver"  # the chart's staged root
    labels = node.labels()
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"  # from the chart's feature file
    assert labels["nvidia.com/gpu.count"] == str(GPUS)  # the operator's GFD
    assert node.allocatable() == GPUS  # the operator's device plugin


def test_the_users_own_operator_is_the_one_installed(installed: Cluster) -> None:
    """MOKKA_GPU_OPERATOR_DIR: its chart installed (the release's chart label), its programs in the
    operator's image, with Mokka's values unchanged."""
    deployment = installed.get(f"/apis/apps/v1/namespaces/{gpu_operator.NAMESPACE}/deployments/gpu-operator")
    assert deployment["metadata"]["labels"]["helm.sh/chart"] == f"gpu-operator-{USERS_CHART}"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v25.3.4")  # the values' pin


def test_a_gpu_pod_gets_its_gpu_from_the_operators_device_plugin_and_mokkas_nri_plugin(installed: Cluster) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(installed.api())
    res = run_pod(core, pod_manifest("smi", ["sh", "-c", "nvidia-smi -L"], gpus=1), timeout=120)
    assert res.phase == "Succeeded", res.logs
    assert len([ln for ln in res.logs.splitlines() if ln.startswith("GPU ")]) == 1, res.logs


def test_with_the_toolkit_operand_off_mokkas_handler_serves_the_nvidia_runtime_class(installed: Cluster) -> None:
    """The shipped values leave the toolkit operand off: the validator's toolkit check (a pod of
    ``runtimeClassName: nvidia`` running nvidia-smi) passed through the node's own ``nvidia``
    handler, plain runc with Mokka's NRI plugin giving the GPUs."""
    import tomlkit

    node = installed.node()
    config = tomlkit.parse(node.layout.containerd_config.read_text()).unwrap()
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert cri["default_runtime_name"] == "runc"
    assert Path(cri["runtimes"]["nvidia"]["options"]["BinaryName"]).name == "runc"
    daemonsets = installed.get(f"/apis/apps/v1/namespaces/{gpu_operator.NAMESPACE}/daemonsets")["items"]
    assert "nvidia-container-toolkit-daemonset" not in {d["metadata"]["name"] for d in daemonsets}
    assert (install.validations(node) / "toolkit-ready").is_file()
