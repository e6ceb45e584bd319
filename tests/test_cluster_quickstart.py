"""The quick start as a user types it, on a real kubelet: ``helm install`` of the chart with its
default values (only the image named, as no registry serves it here: Mokka's node image built
without Docker and imported), then ``helm upgrade --set gpu.profile=<name>`` for every built-in
profile. Each time the node reports the profile's GPUs at the count of the server a user means
by the name (gpumodel/profiles: an HGX A100 has eight, a GB300 compute tray four) to a plain pod's
nvidia-smi and in its labels."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_fixtures import pod_manifest, run_pod, start_cluster, wait_for

from fetch import nvidia_smi, prepare, versions
from gpumodel import profile
from localcluster import nodeimage
from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

CHART = Path(__file__).resolve().parent.parent / "charts" / "mokka"
RELEASE, NAMESPACE = "mokka", "mokka"  # the quick start's
DEFAULT_PROFILE = yaml.safe_load((CHART / "values.yaml").read_text())["gpu"]["profile"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # no GPU stack of the cluster's own: the chart's DaemonSet is the one
    with start_cluster(tmp_path_factory.mktemp("quickstart"), allocator="none", nri_plugin=False) as c:
        yield c


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``helm VERB mokka charts/mokka --namespace mokka ...`` against the cluster, the image imported."""
    cluster.import_image(nodeimage.build(tmp_path_factory.mktemp("node-image"), nvidia_smi.fetch("550")))
    repository, tag = nodeimage.NODE_IMAGE.rsplit(":", 1)
    image = ["--set", f"image.repository={repository}", "--set-string", f"image.tag={tag}"]
    image += ["--set", "image.pullPolicy=Never"]
    binary = prepare.go_binary(versions.HELM)  # built by .ci/setup --tests
    where = ["--namespace", NAMESPACE, "--kubeconfig", str(cluster.kubeconfig)]

    def run(verb: str, *args: str) -> str:
        argv = [str(binary), verb, RELEASE, str(CHART), *where]
        res = subprocess.run([*argv, *image, *args, "--wait", "--timeout", "300s"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        # helm's --wait can pass a DaemonSet whose status the controller has not filled in yet
        cluster.kubectl("rollout", "status", "daemonset", "-n", NAMESPACE, "--timeout=300s", timeout=310)
        return res.stdout

    yield run
    subprocess.run([str(binary), "uninstall", RELEASE, *where, "--wait"], capture_output=True, check=False)


@pytest.fixture(scope="module")
def core(cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api())


def check_node_reports(cluster: Cluster, core: Any, name: str) -> None:
    p = profile.load(name)

    def labelled() -> bool:
        labels = cluster.node().labels()
        return labels.get("nvidia.com/gpu.count") == str(p.gpu_count)

    wait_for(f"the node labelled with {p.gpu_count} GPUs of {name}", labelled, 120)
    res = run_pod(core, pod_manifest(f"smi-{name}", ["nvidia-smi", "-L"]), timeout=120)
    assert res.phase == "Succeeded", res.logs
    listed = [line for line in res.logs.splitlines() if line.startswith("GPU ")]
    assert len(listed) == p.gpu_count and all(p.gpu.name in line for line in listed), (name, res.logs)


def test_install_with_default_values(cluster: Cluster, core: Any, helm: Any) -> None:
    """``helm install ... --namespace mokka --create-namespace``: the chart's default profile."""
    helm("install", "--create-namespace")
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    assert [pod["status"]["phase"] for pod in pods] == ["Running"]
    check_node_reports(cluster, core, DEFAULT_PROFILE)


@pytest.mark.parametrize("name", [n for n in profile.builtin_names() if n != DEFAULT_PROFILE])
def test_set_gpu_profile(cluster: Cluster, core: Any, helm: Any, name: str) -> None:
    """``helm upgrade --set gpu.profile=<name>``: the node restaged as that server."""
    helm("upgrade", "--reuse-values", "--set", f"gpu.profile={name}")
    check_node_reports(cluster, core, name)
