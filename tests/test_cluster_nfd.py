"""Node Feature Discovery on the local cluster (`mokka cluster up --nfd`): NFD's own nfd-master and
an nfd-worker per node, built from the Go module proxy, label each real node from the feature file
Mokka writes into that node's features.d (the seed's NFD row: pci-10de.present and the class form,
by which the GPU Operator and NVIDIA's DRA chart find GPU nodes), through NFD's own NodeFeature
API, beside what NFD's other sources read of the node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_fixtures import start_cluster

from k8snode import nodeinfo
from localcluster.addons import nfd
from localcluster.cluster import Cluster
from localcluster.nodespec import NodeSpec
from virtualfleet.pool import VIRTUAL_LABEL, VirtualSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nodes = (NodeSpec("h100", 1), NodeSpec("l40s", 1))
    virtual = (VirtualSpec.parse("h100:1=2"),)
    with start_cluster(tmp_path_factory.mktemp("nfd-cluster"), nodes=nodes, virtual=virtual, nfd=True) as c:
        yield c


def node(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get(f"/api/v1/nodes/{name}")


def test_every_node_carries_its_gpus_pci_labels_from_nfd(cluster: Cluster) -> None:
    for n in cluster.nodes:
        labels = n.labels()
        assert labels.get("feature.node.kubernetes.io/pci-10de.present") == "true", n.name
        assert labels.get("feature.node.kubernetes.io/pci-0302_10de.present") == "true", n.name


def test_the_labels_are_nfds_own(cluster: Cluster) -> None:
    """nfd-master set them (its record of the labels it owns names them), from the NodeFeature
    object the node's nfd-worker published with the feature file's features."""
    for n in cluster.nodes:
        owned = node(cluster, n.name)["metadata"]["annotations"].get("nfd.node.kubernetes.io/feature-labels", "")
        assert {"pci-10de.present", "pci-0302_10de.present"} <= set(owned.split(",")), owned
        feature = cluster.get(f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{nfd.NAMESPACE}/nodefeatures/{n.name}")
        assert feature["metadata"]["labels"]["nfd.node.kubernetes.io/node-name"] == n.name
        local = feature["spec"]["features"]["attributes"]["local.feature"]["elements"]
        assert local.get("pci-10de.present") == "true", json.dumps(local)


def test_nfds_own_pci_source_finds_the_nodes_gpus(cluster: Cluster) -> None:
    """NFD's pci source reads the node's PCI tree, where the node's namespace shows its mock GPUs:
    exactly the profile's GPUs (vendor 10de, the board's class and device id) beside its NVSwitches."""
    for n in cluster.nodes:
        feature = cluster.get(f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{nfd.NAMESPACE}/nodefeatures/{n.name}")
        devices = feature["spec"]["features"]["instances"]["pci.device"]["elements"]
        nvidia = [d["attributes"] for d in devices if d["attributes"].get("vendor") == "10de"]
        gpus = [a for a in nvidia if a["class"].startswith("03")]  # not the board's NVSwitches (0680)
        spec = cluster.profiles[n.name]
        assert len(gpus) == spec.gpu_count, gpus
        pci = spec.gpu.pci
        assert {(g["class"], g["device"]) for g in gpus} == {(f"{pci.class_code >> 8:04x}", f"{pci.device_id:04x}")}


def test_nfd_reads_the_node_itself_too(cluster: Cluster) -> None:
    """The other sources are NFD's own reading of the node (kernel, CPU), as on any host."""
    labels = cluster.nodes[0].labels()
    assert labels.get("feature.node.kubernetes.io/kernel-version.full"), sorted(labels)
    assert any(key.startswith("feature.node.kubernetes.io/cpu-") for key in labels), sorted(labels)


def test_the_feature_file_is_the_one_mokka_writes(cluster: Cluster) -> None:
    """What the node's features.d holds is what Mokka's chart writes on a real node (one writer)."""
    for n in cluster.nodes:
        features = n.layout.private("/etc/kubernetes") / str(nodeinfo.NFD_FEATURES_DIR.relative_to("/etc/kubernetes"))
        written = (features / nodeinfo.NFD_FILE_NAME).read_text()
        assert written == nodeinfo.nfd_feature_file(cluster.profiles[n.name])


def test_virtual_nodes_carry_the_pci_labels_nfd_gives_a_real_node_of_their_profile(cluster: Cluster) -> None:
    """A virtual H100 node has no NFD worker, but carries what NFD put on the real H100 node from
    Mokka's feature file: one node model, whoever made the node."""
    real = {k: v for k, v in cluster.node("h100-0").labels().items() if k.startswith("feature.node.kubernetes.io/pci-")}
    assert real["feature.node.kubernetes.io/pci-15b3.present"] == "true"  # its ConnectX-7 adapters too
    assert real["feature.node.kubernetes.io/pci-0207_15b3.present"] == "true"
    found = cluster.get(f"/api/v1/nodes?labelSelector={VIRTUAL_LABEL}=true")["items"]
    assert len(found) == 2
    for item in found:
        labels = item["metadata"]["labels"]
        assert real.items() <= labels.items(), item["metadata"]["name"]


def test_status_lists_nfd(cluster: Cluster) -> None:
    status = cluster.status()
    assert status["processes"]["nfd-master"] == "running"
    assert all(n["processes"]["nfd-worker"] == "running" for n in status["nodes"])
