"""The Helm chart on a real API server (the session cluster): `helm template` applied server-side
with strict field validation; the node component's RBAC is get/patch of Nodes (a denied call is
made with the ServiceAccount's own token) and, with dra.enabled, the DRA plugin's ResourceSlices;
the ValidatingAdmissionPolicies' CEL allows a label change (and a slice of its node) by a token
bound to a pod on that node and rejects a spec change, another node's slice and an unbound token; the
fake-gpu-operator profile ConfigMaps land in the target namespace; k8snode.nodeinfo's labels land
on the real Node and are undone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_chart
import yaml
from cluster_fixtures import wait_for

from fetch import prepare, versions
from localcluster import pki
from localcluster.cluster import Cluster
from localcluster.images import WORKLOAD_IMAGE

pytestmark = [pytest.mark.root, pytest.mark.slow]

RELEASE, NAMESPACE, FGO_NAMESPACE = "gpu", "mokka-system", "fgo"
SERVICE_ACCOUNT = f"{RELEASE}-mokka"
NODE = "localhost"
PROBE = "probe.mokka.io/by-service-account"


@pytest.fixture(scope="module")
def helm() -> Path:
    return prepare.go_binary(versions.HELM)  # built by .ci/setup --tests


@pytest.fixture(scope="module")
def release(kube_cluster: Cluster, helm: Path) -> Iterator[list[dict[str, Any]]]:
    """The chart rendered for the cluster's Kubernetes version and applied server-side (strict)."""
    version = kube_cluster.kubectl("version", "-o", "json").stdout
    server = json.loads(version)["serverVersion"]["gitVersion"].lstrip("v")
    argv = [str(helm), "template", RELEASE, str(test_chart.CHART), "--namespace", NAMESPACE, "--kube-version", server]
    argv += ["--api-versions", test_chart.VAP]
    argv += ["--set", "integrations.fakeGpuOperator.enabled=true", "--set", "dra.enabled=true"]
    argv += ["--set", f"integrations.fakeGpuOperator.targetNamespace={FGO_NAMESPACE}"]
    # The DaemonSet's pods stay off this node: no Mokka image here (the objects are what is checked).
    argv += ["--set-string", "nodeSelector.mokka\\.io/no-such-node=true"]
    rendered = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for ns in (NAMESPACE, FGO_NAMESPACE):
        kube_cluster.kubectl("create", "namespace", ns)
    try:
        applied = kube_cluster.kubectl(
            "apply", "--server-side", "--validate=strict", "--field-manager=mokka-test", "-f", "-", input=rendered
        )
        assert applied.stdout.count("serverside-applied") == len(docs), applied.stdout
        yield docs
    finally:
        kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=rendered, check=False)
        for ns in (NAMESPACE, FGO_NAMESPACE):
            kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def client_for(kube_cluster: Cluster) -> Any:
    from kubernetes import client

    def make(token: str) -> Any:
        conf = client.Configuration()
        conf.host = kube_cluster.server
        conf.ssl_ca_cert = str(kube_cluster.layout.pki / "ca.crt")
        conf.api_key = {"authorization": f"Bearer {token}"}
        return client.CoreV1Api(client.ApiClient(conf))

    return make


@pytest.fixture(scope="module")
def core(kube_cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube_cluster.api())


@pytest.fixture(scope="module")
def pod_on_node(release: list[dict[str, Any]], core: Any) -> Iterator[Any]:
    """A pod of the release's ServiceAccount on the node (as the DaemonSet's would be)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "identity", "annotations": {"mokka.io/inject": "false"}},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}
            ],
        },
    }
    pod = core.create_namespaced_pod(NAMESPACE, manifest)
    yield pod
    core.delete_namespaced_pod("identity", NAMESPACE, grace_period_seconds=0)


def token(core: Any, pod: Any = None) -> str:
    """A token of the release's ServiceAccount, bound to ``pod`` (its node name included) or unbound."""
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
    res = core.create_namespaced_service_account_token(SERVICE_ACCOUNT, NAMESPACE, {"spec": spec})
    return str(res.status.token)


def forbidden(call: Any) -> str:
    from kubernetes.client import ApiException

    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value
    return str(info.value.body)


def test_every_object_is_accepted(release: list[dict[str, Any]], kube_cluster: Cluster) -> None:
    kinds = sorted({d["kind"] for d in release})
    assert {"DaemonSet", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"} <= set(kinds)
    for doc in release:
        ns = ["-n", doc["metadata"].get("namespace", NAMESPACE)] if doc["kind"] not in CLUSTER_SCOPED else []
        kube_cluster.kubectl("get", doc["kind"], doc["metadata"]["name"], *ns)


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_rbac_grants_get_and_patch_of_nodes_and_nothing_more(core: Any, pod_on_node: Any, client_for: Any) -> None:
    api = client_for(token(core, pod_on_node))
    assert api.read_node(NODE).metadata.name == NODE
    forbidden(lambda: api.list_namespaced_secret("kube-system"))
    forbidden(lambda: api.list_namespaced_pod(NAMESPACE))
    # The profile reaches the pod as a volume (kubelet reads it): the token reads no ConfigMap.
    forbidden(lambda: api.read_namespaced_config_map(f"{RELEASE}-mokka", NAMESPACE))
    forbidden(lambda: api.delete_node(NODE))
    forbidden(lambda: api.create_namespace({"metadata": {"name": "mokka-denied"}}))


def test_policy_allows_labels_from_a_pod_on_that_node(core: Any, pod_on_node: Any, client_for: Any) -> None:
    api = client_for(token(core, pod_on_node))
    try:
        api.patch_node(NODE, {"metadata": {"labels": {PROBE: "yes"}}})
        assert core.read_node(NODE).metadata.labels[PROBE] == "yes"
    finally:
        core.patch_node(NODE, {"metadata": {"labels": {PROBE: None}}})


def test_policy_rejects_a_spec_change(core: Any, pod_on_node: Any, client_for: Any) -> None:
    api = client_for(token(core, pod_on_node))
    body = forbidden(lambda: api.patch_node(NODE, {"spec": {"unschedulable": True}}))
    assert "Mokka may change only the labels and annotations of its Node" in body, body
    assert not core.read_node(NODE).spec.unschedulable


def test_policy_rejects_a_token_not_bound_to_a_pod_on_the_node(core: Any, release: Any, client_for: Any) -> None:
    api = client_for(token(core))
    body = forbidden(lambda: api.patch_node(NODE, {"metadata": {"labels": {PROBE: "no"}}}))
    assert "Mokka may change only the Node its pod runs on" in body, body
    assert PROBE not in (core.read_node(NODE).metadata.labels or {})


def slice_body(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"probe-{node}"},
        "spec": {"driver": "probe.mokka.io", "nodeName": node, "pool": {"name": node, "generation": 1,
                 "resourceSliceCount": 1}, "devices": []},
    }  # fmt: skip


def test_dra_policy_allows_slices_of_the_pods_node_alone(core: Any, pod_on_node: Any, client_for: Any) -> None:
    """dra.enabled: the DRA plugin's token may create and delete a ResourceSlice of its own node; another
    node's, or one written with a token bound to no pod, is refused by the policy in one line."""
    from kubernetes import client

    own = client.ResourceV1Api(client_for(token(core, pod_on_node)).api_client)
    unbound = client.ResourceV1Api(client_for(token(core)).api_client)
    admin = client.ResourceV1Api(core.api_client)
    try:
        own.create_resource_slice(slice_body(NODE))
        body = forbidden(lambda: own.create_resource_slice(slice_body("other-node")))
        assert "Mokka may publish devices only of the Node its pod runs on" in body, body
        body = forbidden(lambda: unbound.delete_resource_slice(f"probe-{NODE}"))
        assert "Mokka may publish devices only of the Node its pod runs on" in body, body
        own.delete_resource_slice(f"probe-{NODE}")
    finally:
        for node in (NODE, "other-node"):
            try:
                admin.delete_resource_slice(f"probe-{node}")
            except client.ApiException as exc:
                assert exc.status == 404, exc
    forbidden(lambda: own.list_resource_claim_for_all_namespaces())  # claims: get alone, by name


def test_fgo_profile_configmaps_in_the_target_namespace(release: Any, core: Any) -> None:
    found = core.list_namespaced_config_map(FGO_NAMESPACE, label_selector="fake-gpu-operator/gpu-profile=true")
    names = sorted(cm.metadata.name for cm in found.items)
    assert names == sorted(f"gpu-profile-{p.stem}" for p in (test_chart.CHART / "profiles").glob("*.yaml"))
    h100 = yaml.safe_load(next(cm for cm in found.items if cm.metadata.name == "gpu-profile-h100").data["profile.yaml"])
    assert h100["device_defaults"]["name"] == "NVIDIA H100 80GB HBM3"


def test_nodeinfo_labels_land_on_the_node_and_are_undone(
    kube_cluster: Cluster, core: Any, pod_on_node: Any, tmp_path: Path
) -> None:
    """`python -m k8snode.nodeinfo apply` (what the DaemonSet's init container runs), with the pod's
    token: the labels of a 4-GPU profile replace GFD's count; `remove` puts GFD's value back."""
    before = dict(core.read_node(NODE).metadata.labels)
    kubeconfig = pki.token_kubeconfig(
        kube_cluster.server, kube_cluster.layout.pki / "ca.crt", token(core, pod_on_node), tmp_path / "sa.conf"
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NODE_NAME": NODE}
    env.pop("KUBERNETES_SERVICE_HOST", None)

    def nodeinfo(*args: str) -> str:
        res = subprocess.run(
            [sys.executable, "-m", "k8snode.nodeinfo", *args, "--no-nfd"], env=env, capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert "labels set" in nodeinfo("apply", "--profile", "h100", "--gpus", "4")
    try:
        node = core.read_node(NODE)
        assert node.metadata.labels["nvidia.com/gpu.count"] == "4"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        record = json.loads(node.metadata.annotations["mokka.io/node-identity"])
        assert record["previous"]["nvidia.com/gpu.count"] == before["nvidia.com/gpu.count"]
    finally:
        nodeinfo("remove")
    after = core.read_node(NODE)
    assert after.metadata.labels == before
    assert "mokka.io/node-identity" not in (after.metadata.annotations or {})
    wait_for("node still Ready", kube_cluster.node_ready, timeout=10)
