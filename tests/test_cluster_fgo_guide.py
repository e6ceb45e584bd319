"""The pairing guide "Run:ai Fake GPU Operator" (tests/fgo_guide.py, step by step) on a real local
cluster, as `mokka cluster up --node ...` makes it: three real nodes (no device plugin, no NRI plugin
of the cluster's own: the charts bring the GPU stacks); h100-0 is the guide's `integration` worker,
h100-1 and h100-2 its two `scale` workers, labelled with kubectl as the guide's kind config labels
them. Mokka's chart pulls its default image name, under which the Docker-free node image is imported.

Then, here only, FGO's `mock` backend served by Mokka's node image (nvmlmock/): FGO's status-updater
creates its nvml-mock DaemonSet, which pulls Mokka's image from a local registry (CNCF distribution,
built by setup) under FGO's imagePullPolicy Always, stages the node through Mokka's host setup and is
undone by its preStop hook. The guide on kind: tests/test_kind_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fgo_guide
import pytest
from cluster_fixtures import start_cluster, wait_for
from fgo_guide import (
    FGO_SRC,
    H100,
    MOKKA_IMAGE,
    NS,
    POOL,
    REPO,
    SCALE_ONLY,
    Guide,
    core,
    daemonset,
    fgo_chart,
    fgo_install,
    helm,
    helm_binary,
    kubectl,
    node_labels,
    ok,
    pod_output,
    registry_binary,
    running,
)

from fetch import debcache, nvidia_smi
from fetch.kube import binaries
from localcluster import nodeimage, registry
from localcluster.addons import fgo_images
from localcluster.cluster import Cluster
from localcluster.images import WORKLOAD_IMAGE
from localcluster.nodespec import NodeSpec

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(not fgo_guide.HAVE_FGO, reason=fgo_guide.NO_FGO),
]

INTEGRATION, SCALE = "h100-0", ("h100-1", "h100-2")
__all__ = ["core", "fgo_chart"]  # fixtures the steps use


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    helm_binary()  # fail before a cluster comes up when setup did not build them
    registry_binary()
    nodes = (NodeSpec("h100", 1),) * 3
    with start_cluster(tmp_path_factory.mktemp("fgo-guide"), nodes=nodes, allocator="none", nri_plugin=False) as c:
        yield c


@pytest.fixture(scope="module")
def guide(cluster: Cluster) -> Guide:
    def label_pools() -> None:
        ok(cluster.kubectl("label", "node", INTEGRATION, f"{POOL}=integration", check=False))
        ok(cluster.kubectl("label", "node", *SCALE, f"{POOL}=scale", check=False))

    return Guide(
        kubeconfig=cluster.kubeconfig,
        helm_home=cluster.layout.base / "helm",
        kubectl=lambda *args, input=None: cluster.kubectl(*args, input=input, check=False),
        api=cluster.api,
        integration=INTEGRATION,
        scale=SCALE,
        images_on=lambda node: set(
            next(n for n in cluster.nodes if n.name == node).ctr("images", "ls", "-q").stdout.split()
        ),
        workload_image=WORKLOAD_IMAGE,
        label_pools=label_pools,
    )


@pytest.fixture(scope="module")
def images(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """FGO's images (from its binaries, under its names) and Mokka's node image (under the name its
    chart pulls by default, with the fleet's GFD and KWOK), imported into every node."""
    assert FGO_SRC is not None
    out = tmp_path_factory.mktemp("images")
    archives = fgo_images.build(FGO_SRC, out, debcache.default_cache())
    built = binaries.cached()  # NVIDIA's GFD and KWOK: the chart's fleet (test_bench_fleet_beside_fgos_chart)
    assert built is not None
    gfd, kwok = built["gpu-feature-discovery"], built.kwok
    archives.append(nodeimage.build(out, nvidia_smi.fetch("550"), gfd=gfd, kwok=kwok))
    for archive in archives:
        cluster.import_image(archive)
        archive.unlink()
    for n in cluster.nodes:
        n.ctr("images", "tag", "--force", nodeimage.NODE_IMAGE, MOKKA_IMAGE)
    return archives


# ---------------------------------------------------------------------------------------- the guide
globals().update(fgo_guide.steps(through_the_last=False))  # the guide's steps, in order


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
MOCK_NODE = SCALE[1]  # relabelled into a pool of its own


def test_mock_backend_served_by_mokkas_image(cluster: Cluster, guide: Guide, core: Any, fgo_chart: Path) -> None:
    """A pool `mock` (`gpu: {backend: mock, profile: h100}`) on a real node: status-updater's
    nvml-mock-mock DaemonSet pulls Mokka's node image from the local registry (policy Always), its
    pod stages the node through Mokka's host setup under /var/lib/nvml-mock, links /run/nvidia/driver
    there (FGO's wrapper then writes toolkit-ready), writes the CDI spec and labels the node; a plain
    pod reading the driver root as the GPU Operator's validator does runs the real nvidia-smi on the
    profile's 8 GPUs. Taking the pool out deletes the DaemonSet, and its preStop undoes all of it."""
    ref = registry.start(cluster, registry_binary()) + "/mokka/node:1"
    assert registry.push(cluster, nodeimage.NODE_IMAGE, "mokka/node:1") == ref
    assert registry.manifest_exists(cluster, "mokka/node:1")
    ok(
        cluster.kubectl("apply", "-f", "-", input=NVML_MOCK_RBAC, check=False)
    )  # FGO renders these only with gpuOperator on
    ok(kubectl(guide, "label", "node", MOCK_NODE, f"{POOL}=mock", "--overwrite"))
    values = SCALE_ONLY + "    mock:\n      gpu: {backend: mock, profile: h100}\n"
    values += f"nvmlMock:\n  image: {{repository: {ref.rsplit(':', 1)[0]}, tag: '1'}}\n"
    ok(fgo_install(guide, fgo_chart, values, "--set", "builtinProfiles.enabled=false"))
    selector = "fake-gpu-operator/component=nvml-mock"
    try:
        wait_for("nvml-mock-mock's pod Ready", lambda: running(core, NS, selector, 1), 180)
    except AssertionError:
        raise AssertionError(kubectl(guide, "-n", NS, "describe", "pods", "-l", selector).stdout[-4000:]) from None
    ds = daemonset(guide, "nvml-mock-mock")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == (ref, "Always")
    pod = core.list_namespaced_pod(NS, label_selector=selector).items[0]
    assert pod.spec.node_name == MOCK_NODE
    events = ok(
        kubectl(guide, "-n", NS, "get", "events", "--field-selector", f"involvedObject.name={pod.metadata.name}")
    )
    assert f'Successfully pulled image "{ref}"' in events, events

    node = next(n for n in cluster.nodes if n.name == MOCK_NODE).layout
    run_nvidia, root = node.private("/run/nvidia"), node.private("/var/lib/nvml-mock")
    ready = run_nvidia / "validations" / "toolkit-ready"  # FGO's wrapper: once the driver link is there

    def staged() -> bool:  # the entrypoint's last line: CDI spec and labels written too
        logs = kubectl(guide, "-n", NS, "logs", pod.metadata.name).stdout
        return f"nvml-mock: node {MOCK_NODE} staged at /var/lib/nvml-mock" in logs

    try:
        wait_for("the nvml-mock pod's entrypoint done", staged, 120)
    except AssertionError:
        raise AssertionError(kubectl(guide, "-n", NS, "logs", pod.metadata.name, "--tail=40").stdout) from None
    assert ready.is_file()
    assert os.readlink(run_nvidia / "driver") == "/var/lib/nvml-mock/driver"
    assert json.loads((root / "node.json").read_text())["profile"] == "h100"
    spec = json.loads((node.private("/var/run/cdi") / "nvidia.com-gpu.json").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and len([d for d in spec["devices"] if d["name"].isdigit()]) == 8
    assert node_labels(core, MOCK_NODE)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"

    listed = pod_output(
        guide, core, "driver-root-smi", "mock",
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

    ok(fgo_install(guide, fgo_chart, SCALE_ONLY, "--set", "builtinProfiles.enabled=false"))
    wait_for("the nvml-mock pod gone", lambda: not core.list_namespaced_pod(NS, label_selector=selector).items, 120)
    assert not (run_nvidia / "driver").exists() and not (run_nvidia / "validations").exists()
    assert not any(root.iterdir()), list(root.iterdir())
    assert not (node.private("/var/run/cdi") / "nvidia.com-gpu.json").exists()
    assert "mokka.io/node-identity" not in (core.read_node(MOCK_NODE).metadata.annotations or {})


# ---------------------------------------------------------------------------------------- the fleet beside FGO


def bench_fleet(guide: Guide, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mokka.cli", "bench", "fleet", "--kubeconfig", str(guide.kubeconfig)]
    return subprocess.run([*argv, "--namespace", "default", *args], capture_output=True, text=True, timeout=600)


def test_bench_fleet_beside_fgos_chart(guide: Guide, core: Any, tmp_path: Path) -> None:
    """On this cluster as the guide leaves it (FGO's chart serving its pool `scale` with the fake
    backend), Mokka's release upgraded with the fleet on as a user does (`--set fleet.enabled=true`):
    `mokka bench fleet --fgo scale` times a pool of Mokka's virtual nodes and as many of FGO's KWOK
    nodes (kept Ready by the chart's KWOK, served by FGO's kwok-gpu-device-plugin and
    status-exporter-kwok), GPU pods on each, the ratios and their plot; both sides' nodes are gone after.
    A pool FGO does not serve and a namespace without FGO are one line each, before anything is made."""
    upgrade = ("upgrade", "mokka", str(REPO / "charts" / "mokka"), "--reuse-values", "--wait", "--timeout", "180s")
    ok(helm(guide, *upgrade, "--set", "fleet.enabled=true"))
    try:
        wait_for(
            "the fleet controller holding its Lease",
            lambda: kubectl(guide, "get", "lease", "mokka-fleet-controller", "-o", "name").returncode == 0,
            180,
        )
        for args, message in (
            (
                ("--fgo", "nosuch"),
                "--fgo nosuch: fake-gpu-operator's topology has no pool nosuch (it has: default, scale)",
            ),
            (
                ("--fgo", "scale", "--fgo-namespace", "nowhere"),
                "--fgo scale: no fake-gpu-operator topology here (ConfigMap nowhere/topology): install its chart, "
                "or name its namespace with --fgo-namespace",
            ),
        ):
            res = bench_fleet(guide, "--nodes", "5", *args)
            assert (res.returncode, res.stderr.strip()) == (1, f"mokka: error: {message}"), res.stdout + res.stderr
            assert not kubectl(guide, "get", "vgp", "-o", "name").stdout.strip()

        argv = ("--nodes", "20", "--pods", "20", "--settle", "5", "--timeout", "240", "--pool", "bench")
        res = bench_fleet(guide, *argv, "--fgo", "scale", "--svg", str(tmp_path))
        assert res.returncode == 0, res.stdout + res.stderr
        rows = {line.split("  ")[0]: line for line in res.stdout.splitlines()}
        for figure in (
            "20 nodes Ready",
            "20 one-GPU pods bound",
            "20 one-GPU pods Running",
            "pool deleted -> every node gone",
            "fake-gpu-operator: 20 nodes made (pool scale)",
            "fake-gpu-operator: 20 nodes Ready with GPUs",
            "fake-gpu-operator: 20 one-GPU pods bound",
            "fake-gpu-operator: 20 one-GPU pods Running",
            "fake-gpu-operator: nodes deleted -> every node gone",
            "ratio 20 nodes Ready (Mokka / FGO)",
            "ratio 20 pods bound (Mokka / FGO)",
            "ratio 20 pods Running (Mokka / FGO)",
        ):
            assert figure in rows, res.stdout
        assert "<= 1" in rows["ratio 20 pods Running (Mokka / FGO)"]
        assert "fake-gpu-operator: 20 nodes Ready with GPUs" in res.stderr  # told as it goes
        svg = (tmp_path / "fleet.svg").read_text()
        assert "fake-gpu-operator" in svg and "20 pods Running" in svg
        assert not core.list_node(label_selector="mokka.io/bench-fgo=bench").items
        assert not core.list_node(label_selector="mokka.io/virtual-pool=bench").items
        assert not core.list_namespaced_pod("default", label_selector="app=bench-schedule").items
    finally:
        ok(helm(guide, *upgrade, "--set", "fleet.enabled=false"))


# ---------------------------------------------------------------------------------------- last: both releases gone

test_failure_builtin_profiles_left_on_fgo_first = fgo_guide.test_failure_builtin_profiles_left_on_fgo_first
