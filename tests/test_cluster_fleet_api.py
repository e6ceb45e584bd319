"""The chart's VirtualGPUPool API (``fleet.enabled=true``) on a real API server (the session
cluster): the CustomResourceDefinition is accepted and Established; a pool gets its defaults; the
scale subresource works with ``kubectl scale``; and bad pools (an unknown profile, more nodes than
``fleet.maxReplicas``, a rack size that is no whole number of nodes, no profile or two) are refused
by the API server's own validation, each with one line naming the field."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_fixtures import fleet_crd

from gpumodel import profile
from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

CRD = "virtualgpupools.mokka.io"
MAX = 500  # fleet.maxReplicas for this release


def pool(name: str, **spec: Any) -> str:
    body = {"apiVersion": "mokka.io/v1alpha1", "kind": "VirtualGPUPool", "metadata": {"name": name}, "spec": spec}
    return json.dumps(body)


@pytest.fixture(scope="module")
def api(kube_cluster: Cluster) -> Iterator[Cluster]:
    with fleet_crd(kube_cluster, MAX):
        yield kube_cluster


def create(cluster: Cluster, body: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-f", "-", input=body, check=False)


def test_a_pool_gets_its_defaults(api: Cluster) -> None:
    assert create(api, pool("h100s", profile="h100")).returncode == 0
    try:
        got = json.loads(api.kubectl("get", "vgp", "h100s", "-o", "json").stdout)
        assert got["spec"] == {"profile": "h100", "replicas": 1, "allocator": "device-plugin", "migStrategy": "none"}
        header = api.kubectl("get", "virtualgpupools").stdout.splitlines()[0].split()
        assert header == ["NAME", "PROFILE", "GPUS/NODE", "REPLICAS", "READY", "ALLOCATABLE", "AGE"]
    finally:
        api.kubectl("delete", "vgp", "h100s", check=False)


def test_kubectl_scale_sets_the_replicas(api: Cluster) -> None:
    assert create(api, pool("racked", profile="gb200", rackSize=72, replicas=18)).returncode == 0
    try:
        assert "scaled" in api.kubectl("scale", "vgp/racked", "--replicas=36").stdout
        assert api.kubectl("get", "vgp", "racked", "-o", "jsonpath={.spec.replicas}").stdout == "36"
        res = api.kubectl("scale", "vgp/racked", f"--replicas={MAX + 1}", check=False)
        assert res.returncode == 1 and f"should be less than or equal to {MAX}" in res.stderr, res.stderr
        scale = json.loads(api.kubectl("get", "--raw", "/apis/mokka.io/v1alpha1/virtualgpupools/racked/scale").stdout)
        assert (scale["kind"], scale["spec"]["replicas"]) == ("Scale", 36)
    finally:
        api.kubectl("delete", "vgp", "racked", check=False)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"profile": "h300"}, 'spec.profile: Invalid value: "string": not a built-in profile (a100, b200, '),
        ({"profile": "h100", "replicas": MAX + 1}, f"spec.replicas: Invalid value: {MAX + 1}: spec.replicas in body"),
        ({"profile": "h100", "rackSize": 12}, 'spec.rackSize: Invalid value: "object": spec.rackSize (GPUs in one'),
        ({"profile": "h100", "gpusPerNode": 5, "rackSize": 72}, "spec.rackSize: Invalid value"),
        ({"replicas": 2}, 'spec: Invalid value: "object": give exactly one of spec.profile'),
        (
            {"profile": "h100", "profileConfigMap": {"name": "mine", "namespace": "default"}},
            'spec: Invalid value: "object": give exactly one of spec.profile',
        ),
        (
            {"profile": "h100", "allocator": "mig"},
            'spec.allocator: Invalid value: "string": must be device-plugin or dra',
        ),
        ({"profile": "h100", "taints": [{"key": "k", "effect": "Never"}]}, "spec.taints[0].effect: Invalid value"),
    ],
    ids=[
        "unknown-profile",
        "beyond-max",
        "rack-not-whole-nodes",
        "rack-vs-gpus",
        "no-profile",
        "two-profiles",
        "allocator",
        "taint",
    ],
)
def test_a_bad_pool_is_refused_with_one_line(api: Cluster, spec: dict[str, Any], says: str) -> None:
    res = create(api, pool("bad", **spec))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr
    assert lines[0].startswith('The VirtualGPUPool "bad" is invalid: ')
    assert api.kubectl("get", "vgp", "bad", check=False).returncode == 1  # nothing made


def test_every_builtin_profile_is_offered_with_its_gpus(api: Cluster) -> None:
    crd = json.loads(api.kubectl("get", "crd", CRD, "-o", "json").stdout)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    names = ", ".join(f"'{n}'" for n in profile.builtin_names())
    assert spec["properties"]["profile"]["x-kubernetes-validations"][0]["rule"] == f"self in [{names}]"
    rule = spec["x-kubernetes-validations"][1]["rule"]
    for name in profile.builtin_names():
        assert f"'{name}': {profile.load(name).gpu_count}" in rule


def test_the_api_group_is_mokkas(api: Cluster) -> None:
    resources = api.kubectl("api-resources", "--api-group=mokka.io", "-o", "wide").stdout
    row = next(line.split() for line in resources.splitlines() if line.startswith("virtualgpupools "))
    assert row[:5] == ["virtualgpupools", "vgp", "mokka.io/v1alpha1", "false", "VirtualGPUPool"], row  # cluster-wide
    assert row[-1] == "mokka"  # `kubectl get mokka` lists the pools
