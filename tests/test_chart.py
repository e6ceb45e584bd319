"""The Helm chart: `helm lint` and `helm template` over a matrix of values, every rendered
manifest validated against the Kubernetes schemas of the version it is rendered for
(kubernetes-validate, strict: unknown fields are errors), and the fake-gpu-operator
contract asserted on the rendered ConfigMaps.

helm is built once by `.ci/setup --tests` (fetch.prepare) from the Go module proxy at the
version pinned in fetch/versions.py, with the Kubernetes version its release builds stamp
in, so `helm install --dry-run` works offline; no test builds it.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fetch import prepare, versions
from gpumodel import profile
from k8snode import nodeinfo
from virtualfleet import crd as fleet_crd_module

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "mokka"
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
CONTRACT_LABEL = "fake-gpu-operator/gpu-profile"
RELEASE, NAMESPACE = "gpu", "mokka-system"

Docs = list[dict[str, Any]]


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return prepare.go_binary(versions.HELM)
    except prepare.NotPrepared as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def render(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Docs]:
    tmp = tmp_path_factory.mktemp("values")
    counter = iter(range(10**6))

    def _render(
        values: dict[str, Any] | None = None,
        *args: str,
        kube: str = "1.31.0",
        api_versions: tuple[str, ...] = (),
        validate: bool = True,
    ) -> Docs:
        argv = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube, *args]
        if values is not None:
            path = tmp / f"values-{next(counter)}.yaml"
            path.write_text(yaml.safe_dump(values))
            argv += ["-f", str(path)]
        for api in api_versions:
            argv += ["--api-versions", api]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"helm template failed:\n{res.stderr}"
        docs = [d for d in yaml.safe_load_all(res.stdout) if d]
        if validate:
            for doc in docs:
                try:
                    kubernetes_validate.validate(doc, kube, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} is not valid Kubernetes {kube}: {exc}")
        return docs

    return _render


def fails(helm: Path, *args: str) -> str:
    argv = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.31.0", *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0, f"helm template accepted {args}"
    return res.stderr


def one(docs: Docs, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def kinds(docs: Docs) -> list[str]:
    return sorted(d["kind"] for d in docs)


def is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def mokka_docs(docs: Docs) -> Docs:
    """The release's documents without the dcgm-exporter integration's."""
    return [d for d in docs if not d["metadata"]["name"].endswith("dcgm-exporter")]


def pod_spec(docs: Docs) -> dict[str, Any]:
    spec: dict[str, Any] = one(mokka_docs(docs), "DaemonSet")["spec"]["template"]["spec"]
    return spec


def containers(docs: Docs) -> dict[str, dict[str, Any]]:
    spec = pod_spec(docs)
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


# --------------------------------------------------------------------------- the matrix

CUSTOM = yaml.safe_load(profile.load("t4").model_dump_json()) | {"name": "my-t4"}
MATRIX: dict[str, tuple[dict[str, Any], str, tuple[str, ...]]] = {
    "defaults-1.27": ({}, "1.27.0", ()),
    "defaults-1.31-vap": ({}, "1.31.0", (VAP,)),
    "defaults-1.33": ({}, "1.33.0", (VAP,)),
    "all-on": (
        {
            "gpu": {"profile": "gb200", "count": 4},
            "plugin": {"allocator": "external"},
            "containerdConfig": {"install": True},
            "hostSetup": {"runNvidia": {"toolkitReady": True}},
            "integrations": {
                "fakeGpuOperator": {"enabled": True, "targetNamespace": "gpu-operator"},
                "dcgmExporter": {"enabled": True, "image": {"tag": "4.2.3-4.1.3-ubuntu22.04"}},
                "prometheus": {"enabled": True},
            },
            "nodeSelector": {"run.ai/simulated-gpu-node-pool": "integration"},
            "imagePullSecrets": [{"name": "regcred"}],
            "podAnnotations": {"example.com/a": "b"},
            "podLabels": {"team": "gpu"},
        },
        "1.33.0",
        (VAP,),
    ),
    "minimal": (
        {
            "nodeInfo": {"enabled": False},
            "hostSetup": {"cleanupOnTermination": False, "runNvidia": {"enabled": False}, "nvidiaSmi": ""},
            "tolerations": [],
            "priorityClassName": "",
        },
        "1.29.0",
        (),
    ),
    "no-nfd-no-cleanup": ({"nodeInfo": {"nfd": False}, "hostSetup": {"cleanupOnTermination": False}}, "1.31.0", ()),
    "custom-profile": ({"gpu": {"customProfile": CUSTOM, "count": 2}}, "1.31.0", ()),
    "existing-sa": ({"serviceAccount": {"create": False, "name": "node-sa"}, "rbac": {"create": False}}, "1.31.0", ()),
    "names": ({"fullnameOverride": "gpu-sim", "image": {"tag": "dev", "pullPolicy": "Never"}}, "1.31.0", ()),
    "policy-forced": ({"rbac": {"ownNodePolicy": True}}, "1.31.0", ()),
    "policy-off": ({"rbac": {"ownNodePolicy": False}}, "1.31.0", (VAP,)),
    "faults": ({"faults": {"enabled": True}}, "1.31.0", (VAP,)),
    "faults-own-configmap": (
        {"faults": {"enabled": True, "configMap": "node-faults", "create": False}, "nodeInfo": {"enabled": False}},
        "1.29.0",
        (),
    ),
    "faults-no-rbac": ({"faults": {"enabled": True}, "rbac": {"create": False}}, "1.31.0", ()),
    "dra": ({"dra": {"enabled": True}}, "1.33.0", (VAP,)),
    "dra-gpus-alone": (
        {"dra": {"enabled": True, "nicDriverName": "", "deviceClasses": False}, "nodeInfo": {"enabled": False}},
        "1.31.0",
        (VAP,),
    ),
    "dra-no-cleanup": ({"dra": {"enabled": True}, "hostSetup": {"cleanupOnTermination": False}}, "1.31.0", (VAP,)),
    **{f"profile-{n}": ({"gpu": {"profile": n}}, "1.31.0", ()) for n in profile.builtin_names()},
}


@pytest.mark.parametrize("case", MATRIX)
def test_renders_valid_manifests(render: Callable[..., Docs], case: str) -> None:
    values, kube, apis = MATRIX[case]
    docs = render(values, kube=kube, api_versions=apis)
    hooks = [d for d in docs if is_hook(d)]
    docs = [d for d in docs if not is_hook(d)]
    check_daemonset(docs, values)
    policy_expected = bool(apis) or values.get("rbac", {}).get("ownNodePolicy") is True
    dra_docs = [d for d in docs if d["metadata"]["name"].startswith(f"{RELEASE}-mokka-dra")]
    check_rbac([d for d in docs if d not in dra_docs], values, policy_expected)
    check_dra_rbac(dra_docs, values, policy_expected)
    check_uninstall_hook(hooks, docs, values)


def check_uninstall_hook(hooks: Docs, docs: Docs, given: dict[str, Any]) -> None:
    """helm uninstall's pre-delete Job ends the DaemonSet while the RBAC its preStop needs stands:
    only when the chart made that RBAC and the preStop exists; it may get and delete that DaemonSet,
    nothing else, and prefers the DaemonSet's nodes without being bound to them."""
    v = merged(given)
    rbac = (v["nodeInfo"]["enabled"] or v["dra"]["enabled"]) and v["rbac"]["create"]
    if not (v["hostSetup"]["cleanupOnTermination"] and rbac):
        assert hooks == []
        return
    assert kinds(hooks) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    ds = one(mokka_docs(docs), "DaemonSet")["metadata"]["name"]
    name = f"{ds}-uninstall"
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert hook["metadata"]["name"] == name and hook["metadata"]["namespace"] == NAMESPACE
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert int(annotations["helm.sh/hook-weight"]) == (0 if hook["kind"] == "Job" else -1)
    assert one(hooks, "Role")["rules"] == [
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [ds], "verbs": ["get", "delete"]}
    ]
    assert one(hooks, "RoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    job = one(hooks, "Job")["spec"]["template"]["spec"]
    (container,) = job["containers"]
    grace = v["terminationGracePeriodSeconds"]
    assert container["command"] == [
        "python3", "-m", "k8snode.uninstall", "--release", RELEASE, "--namespace", NAMESPACE, "--daemonset", ds,
        "--timeout", str(grace + 90),
    ]  # fmt: skip
    assert container["image"] == containers(docs)["nri-plugin"]["image"]
    assert job["serviceAccountName"] == name and job["restartPolicy"] == "Never"
    assert job["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    spec = pod_spec(docs)
    for key in ("tolerations", "imagePullSecrets"):
        assert job.get(key) == spec.get(key), key
    # beside the DaemonSet's pods where there are any (the image is there), never on a virtual node,
    # and not bound to the DaemonSet's nodes: one that matches none must not hold up the uninstall
    assert "nodeSelector" not in job
    (term,) = job["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = one(mokka_docs(docs), "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    (required,) = job["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"]: e["operator"] for e in required["matchExpressions"]} == {
        "type": "NotIn",
        "mokka.io/virtual": "DoesNotExist",
    }


def merged(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(a: dict[str, Any], b: dict[str, Any]) -> None:
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict) and v:
                merge(a[k], v)
            else:
                a[k] = copy.deepcopy(v)

    merge(out, values)
    return out


def check_daemonset(docs: Docs, given: dict[str, Any]) -> None:
    v = merged(given)
    ds = one(mokka_docs(docs), "DaemonSet")
    spec = pod_spec(docs)
    by_name = containers(docs)
    assert ds["metadata"]["namespace"] == NAMESPACE
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert ds["spec"]["template"]["metadata"]["annotations"]["mokka.io/inject"] == "false"

    # Host setup is an init step, the plugin the long-running container.
    init = [c["name"] for c in spec["initContainers"]]
    assert init == [
        *(["containerd-config"] if v["containerdConfig"]["install"] else []),
        "host-setup",
        *(["node-identity"] if v["nodeInfo"]["enabled"] else []),
    ]
    assert [c["name"] for c in spec["containers"]] == [
        "nri-plugin",
        *(["fault-watcher"] if v["faults"]["enabled"] else []),
        *(["dra-plugin"] if v["dra"]["enabled"] else []),
    ]

    # Privileged only where staging needs it.
    privileged = sorted(n for n, c in by_name.items() if c.get("securityContext", {}).get("privileged"))
    assert privileged == sorted(["host-setup", *(["containerd-config"] if v["containerdConfig"]["install"] else [])])
    assert spec.get("hostPID", False) is v["containerdConfig"]["install"]
    assert not spec.get("hostNetwork", False)
    plugin = by_name["nri-plugin"]
    sc = plugin["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"].get("add", [])) <= {"DAC_OVERRIDE", "FOWNER"}

    # The plugin: `mokka nri-plugin` with its flags, probes on /healthz and /readyz.
    assert plugin["command"] == ["mokka", "nri-plugin"]
    args = dict(zip(plugin["args"][::2], plugin["args"][1::2], strict=True))
    assert args == {
        "--socket": v["plugin"]["socket"],
        "--idx": str(v["plugin"]["idx"]),
        "--allocator": "external" if v["dra"]["enabled"] else v["plugin"]["allocator"],
        "--root": v["hostSetup"]["root"],
        "--health-addr": f"0.0.0.0:{v['plugin']['healthPort']}",
    }
    port = {p["name"]: p["containerPort"] for p in plugin["ports"]}["health"]
    assert port == v["plugin"]["healthPort"]
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert plugin["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert plugin["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}

    # Cleanup on termination.
    pre_stop = plugin.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if v["hostSetup"]["cleanupOnTermination"]:
        assert pre_stop is not None and f"mokka host cleanup --root '{v['hostSetup']['root']}'" in pre_stop[-1]
        assert ("k8snode.nodeinfo remove" in pre_stop[-1]) is v["nodeInfo"]["enabled"]
    else:
        assert pre_stop is None

    # Host setup stages the chosen profile under the root.
    setup = by_name["host-setup"]["args"][0]
    assert "exec mokka host setup " in setup and f"--root '{v['hostSetup']['root']}'" in setup
    custom = bool(v["gpu"]["customProfile"])
    want_profile = "/etc/mokka/profile/profile.yaml" if custom else v["gpu"]["profile"]
    assert f"--profile '{want_profile}'" in setup
    assert ("--gpus" in setup) is (v["gpu"]["count"] is not None)
    assert ("--run-nvidia" in setup) is v["hostSetup"]["runNvidia"]["enabled"]
    if v["nodeInfo"]["enabled"]:
        node_args = by_name["node-identity"]["args"]
        assert node_args[node_args.index("--profile") + 1] == want_profile
        assert spec["automountServiceAccountToken"] is True
    else:
        assert spec["automountServiceAccountToken"] is (v["faults"]["enabled"] or v["dra"]["enabled"])
    if v["faults"]["enabled"]:
        check_fault_watcher(docs, v)
    if v["dra"]["enabled"]:
        check_dra_plugin(docs, v)

    # Every mount names a volume, every volume is mounted, host paths are where the CLI looks.
    volumes = {vol["name"]: vol for vol in spec["volumes"]}
    mounted = {m["name"] for c in by_name.values() for m in c.get("volumeMounts", [])}
    assert mounted == set(volumes), f"mounted {sorted(mounted)} vs volumes {sorted(volumes)}"
    for c in by_name.values():
        for m in c.get("volumeMounts", []):
            host = volumes[m["name"]].get("hostPath")
            if host:  # node.json and the NRI adjustments carry host paths: mount them at the same place
                assert m["mountPath"] == host["path"], (c["name"], m)
    assert volumes["root"]["hostPath"]["path"] == v["hostSetup"]["root"]

    # The profile ConfigMap, and the checksum that rolls the pods when it changes.
    cm = one(docs, "ConfigMap", ds["metadata"]["name"])
    assert cm["data"]["profile"] == (v["gpu"]["customProfile"]["name"] if custom else v["gpu"]["profile"])
    if custom:
        assert yaml.safe_load(cm["data"]["profile.yaml"]) == v["gpu"]["customProfile"]
    assert re.fullmatch(r"[0-9a-f]{64}", ds["spec"]["template"]["metadata"]["annotations"]["checksum/profile"])

    # Scheduling values pass through.
    assert spec.get("nodeSelector", {}) == v["nodeSelector"]
    assert spec.get("tolerations", []) == v["tolerations"]
    assert spec.get("priorityClassName", "") == v["priorityClassName"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = f"{v['image']['repository']}:{v['image']['tag'] or app_version}"
    assert {c["image"] for c in by_name.values()} == {image}


def check_fault_watcher(docs: Docs, v: dict[str, Any]) -> None:
    """The fault watcher: `python3 -m k8snode.faultwatch` on the staged root, its ConfigMap, no privileges."""
    watcher = containers(docs)["fault-watcher"]
    name = v["faults"]["configMap"] or f"{RELEASE}-mokka-faults"
    assert watcher["command"] == ["python3", "-m", "k8snode.faultwatch"]
    assert watcher["args"] == ["--root", v["hostSetup"]["root"], "--configmap", name]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in watcher["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace"}
    sc = watcher["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    assert {m["name"]: m.get("readOnly", False) for m in watcher["volumeMounts"]} == {"root": False, "tmp": False}
    made = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    assert len(made) == int(v["faults"]["create"])
    if made:
        assert made[0]["data"] == {} and made[0]["metadata"]["namespace"] == NAMESPACE


def check_dra_plugin(docs: Docs, v: dict[str, Any]) -> None:
    """`mokka dra-plugin` on the staged root, kubelet's plugin directories and the CDI directory at the
    node's paths, root without privileges; its preStop unpublishes the node's slices of both drivers."""
    dra = v["dra"]
    plugin = containers(docs)["dra-plugin"]
    names = ["--driver-name", dra["driverName"], "--nic-driver-name", dra["nicDriverName"]]
    assert plugin["command"] == ["mokka", "dra-plugin"]
    assert plugin["args"] == [
        *names, "--root", v["hostSetup"]["root"], "--kubelet-dir", dra["kubeletDir"], "--cdi-dir", dra["cdiDir"],
        "--device-class" if dra["deviceClasses"] else "--no-device-class",
    ]  # fmt: skip
    pre_stop = plugin.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    assert pre_stop == (
        ["mokka", "dra-plugin", "--unpublish", *names] if v["hostSetup"]["cleanupOnTermination"] else None
    )
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in plugin["env"]} == {"NODE_NAME": "spec.nodeName"}
    sc = plugin["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 0
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in plugin["volumeMounts"]}
    assert mounts == {
        v["hostSetup"]["root"]: True,
        f"{dra['kubeletDir']}/plugins": False,
        f"{dra['kubeletDir']}/plugins_registry": False,
        dra["cdiDir"]: False,
        "/tmp": False,
    }


def check_dra_rbac(docs: Docs, given: dict[str, Any], policy_expected: bool) -> None:
    """The DRA plugin's ClusterRole: its slices, the claims it prepares, the Node, the DeviceClasses it
    may create; with the own-node policy, slices only of the pod's own Node."""
    v = merged(given)
    if not (v["dra"]["enabled"] and v["rbac"]["create"]):
        assert docs == []
        return
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]  # fmt: skip
    if v["dra"]["deviceClasses"]:
        rules.append({"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get", "create"]})
    assert one(docs, "ClusterRole")["rules"] == rules
    sa = pod_spec(docs)["serviceAccountName"] if any(d["kind"] == "DaemonSet" for d in docs) else None
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [sa or f"{RELEASE}-mokka"]
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    if policy_expected and v["rbac"]["ownNodePolicy"] is not False:
        policy = one(docs, "ValidatingAdmissionPolicy")
        assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["resourceslices"]
        assert "spec.nodeName" in policy["spec"]["validations"][0]["expression"]
        assert one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]
    else:
        assert policies == []


def check_rbac(docs: Docs, given: dict[str, Any], policy_expected: bool) -> None:
    v = merged(given)
    wanted = v["nodeInfo"]["enabled"] and v["rbac"]["create"]
    roles = [d for d in docs if d["kind"] == "ClusterRole"]
    fault_roles = [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    if v["faults"]["enabled"] and v["rbac"]["create"]:
        # list and watch of the one fault ConfigMap, in the release's namespace.
        name = v["faults"]["configMap"] or f"{RELEASE}-mokka-faults"
        assert one(docs, "Role")["rules"] == [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name], "verbs": ["list", "watch"]}
        ]
        binding = one(docs, "RoleBinding")
        assert binding["roleRef"]["name"] == one(docs, "Role")["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": pod_spec(docs)["serviceAccountName"], "namespace": NAMESPACE}
        ]
    else:
        assert fault_roles == []
    if not wanted:
        assert roles == [] and not [d for d in docs if d["kind"] == "ClusterRoleBinding"]
        assert not [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
        return
    # RBAC limited to what is used: get and patch of Nodes, nothing else.
    assert one(docs, "ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = one(docs, "ClusterRoleBinding")
    sa = pod_spec(docs)["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    if policy_expected and v["rbac"]["ownNodePolicy"] is not False:
        policy = one(docs, "ValidatingAdmissionPolicy")
        assert policy["spec"]["matchConditions"][0]["expression"] == (
            f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{sa}"'
        )
        assert "authentication.kubernetes.io/node-name" in policy["spec"]["validations"][0]["expression"]
        assert one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]
    else:
        assert policies == []


def test_profile_change_rolls_the_pods(render: Callable[..., Docs]) -> None:
    def checksum(values: dict[str, Any]) -> str:
        docs = render(values, validate=False)
        return str(one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["checksum/profile"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"gpu": {"profile": "a100"}}) != checksum({"gpu": {"profile": "a100", "count": 2}})


def test_validation_is_real(render: Callable[..., Docs]) -> None:
    """A negative control: the schema check rejects what a typo in a template would produce."""
    ds = one(render({}), "DaemonSet")
    broken = copy.deepcopy(ds)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {"path": "/healthz"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.31.0", strict=True)


# --------------------------------------------------------------------------- values and schema


def test_schema_rejects_bad_values(helm: Path) -> None:
    assert "gpu.profile" in fails(helm, "--set", "gpu.profile=v100") or "profile" in fails(
        helm, "--set", "gpu.profile=v100"
    )
    for bad in (
        ["--set", "gpu.count=0"],
        ["--set", f"gpu.count={profile.MAX_GPUS + 1}"],
        ["--set", "gpu.customProfile.description=no-name-no-gpu"],
        ["--set", "hostSetup.root=relative/path"],
        ["--set", "hostSetup.majors=sometimes"],
        ["--set", "image.pullPolicy=Sometimes"],
        ["--set", "unknownTopLevel=1"],
        ["--set", "plugin.idx=100"],
        ["--set", "plugin.allocator=kubelet"],
        ["--set", "integrations.fakeGpuOperator.profileLabels.flag=true"],  # a bool is not a label value
        ["--set", "integrations.fakeGpuOperator.targetNamespace=Not_A_Namespace"],
        ["--set", "rbac.ownNodePolicy=maybe"],
    ):
        assert "values don't meet the specifications of the schema" in fails(helm, *bad), bad


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, sub in schema.get("properties", {}).items():
        out.add(prefix + key)
        if sub.get("type") == "object" and "properties" in sub and sub.get("additionalProperties") is False:
            out |= schema_paths(sub, prefix + key + ".")
    return out


def value_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        out.add(prefix + key)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False and "properties" in sub:
            out |= value_paths(value, sub, prefix + key + ".")
    return out


def test_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = value_paths(values, schema) - schema_paths(schema)
    assert not missing, f"values without a schema entry: {sorted(missing)}"
    # The other way round for the chart's own keys (optional fields of resources/probes may stay unset).
    undocumented = {p for p in schema_paths(schema) if p != "global" and p.count(".") < 2} - value_paths(values, schema)
    assert not undocumented, f"schema entries with no default in values.yaml: {sorted(undocumented)}"
    assert schema["properties"]["gpu"]["properties"]["profile"]["enum"] == profile.builtin_names()
    assert schema["properties"]["gpu"]["properties"]["count"]["maximum"] == profile.MAX_GPUS


def test_lint(helm: Path, tmp_path: Path) -> None:
    for i, (values, _, _) in enumerate(MATRIX[c] for c in ("defaults-1.27", "all-on", "minimal", "custom-profile")):
        path = tmp_path / f"v{i}.yaml"
        path.write_text(yaml.safe_dump(values))
        res = subprocess.run(
            [str(helm), "lint", "--strict", str(CHART), "-f", str(path), "--kube-version", "1.31.0"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert "0 chart(s) failed" in res.stdout


def test_notes(helm: Path, tmp_path: Path) -> None:
    """NOTES.txt renders (helm renders it only on a real install: here through tpl in a copy)."""
    import shutil

    chart = tmp_path / "mokka"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "notes-under-test.yaml").write_text(
        'notes: |\n  {{- tpl (.Files.Get "notes-under-test.txt") . | nindent 2 }}\n'
    )
    res = subprocess.run(
        [
            *(str(helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE),
            *("--show-only", "templates/notes-under-test.yaml"),
            *("--set", "integrations.fakeGpuOperator.enabled=true", "--set-string", "nodeSelector.pool=integration"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    notes = yaml.safe_load(res.stdout)["notes"]
    assert f"rollout status daemonset/{RELEASE}-mokka" in notes
    assert "nvidia-smi -L" in notes and '"pool":"integration"' in notes
    assert "gpu-profile-<profile>" in notes and "builtinProfiles.enabled=false" in notes
    assert "targetNamespace is empty" in notes


# --------------------------------------------------------------------------- the FGO contract


def fgo_configmaps(docs: Docs) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap" and "gpu-profile-" in d["metadata"]["name"]
    }


def fgo_load(docs: Docs, namespace: str, name: str) -> dict[str, Any]:
    """FGO's loader, restated: Get gpu-profile-<name> in ITS namespace, read key profile.yaml."""
    found = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"gpu-profile-{name}"
        and d["metadata"]["namespace"] == namespace
    ]  # fmt: skip
    assert found, f"NotFound: configmaps gpu-profile-{name} in {namespace}"
    assert "profile.yaml" in found[0]["data"], "missing key profile.yaml"
    body: dict[str, Any] = yaml.safe_load(found[0]["data"]["profile.yaml"])
    assert isinstance(body, dict)
    return body


def test_fleet_api_off_by_default(render: Callable[..., Docs]) -> None:
    assert [d for d in render({}) if d["kind"] in ("CustomResourceDefinition", "Deployment")] == []


def test_fleet_kwok_is_the_local_clusters(render: Callable[..., Docs]) -> None:
    """The chart's KWOK runs as the local cluster's does (its workers, pod CIDR, node selection and
    the module's stages, where the Dockerfile and the node image put them)."""
    from fetch.kube import binaries
    from localcluster import nodeimage
    from localcluster.addons import kwok

    docs = render({"fleet": {"enabled": True}})
    (deploy,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-kwok")]
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-kwok")]
    assert yaml.safe_load(config["data"]["kwok.yaml"]) == kwok.configuration()
    command = deploy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == nodeimage.KWOK_PATH.name
    stages = [c.removeprefix("--config=") for c in command if c.startswith(f"--config=/{nodeimage.KWOK_STAGES}/")]
    assert stages == [f"/{nodeimage.KWOK_STAGES}/{Path(s).name}" for s in binaries.KWOK_STAGES]
    assert f"--cidr={kwok.POD_CIDR}" in command
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in command
    no_kwok = render({"fleet": {"enabled": True, "kwok": {"enabled": False}}})
    assert [d for d in no_kwok if d["metadata"]["name"].endswith("-kwok")] == []


def test_fleet_controller_runs_gfd_from_the_image_keeps_off_virtual_nodes_and_apart_from_the_daemonset(
    render: Callable[..., Docs],
) -> None:
    """tests/test_cluster_fleet_controller.py runs it; here: what the Deployment is made of."""
    from localcluster import nodeimage

    docs = render({"fleet": {"enabled": True, "controller": {"replicas": 2, "nfdLabels": False}}})
    (deploy,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-fleet")]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert f"--gfd=/{nodeimage.GFD_PATH}" in container["command"]  # where the Dockerfile and the node image put it
    assert {"--no-nfd-labels", "--leader-elect"} <= set(container["command"])
    selector = ds["spec"]["selector"]["matchLabels"]
    assert not all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())  # not the DaemonSet's pods
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    off_kwok = [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == off_kwok
    fleet = [d for d in docs if d["metadata"]["name"].endswith("-fleet") or d["kind"] == "CustomResourceDefinition"]
    kinds = sorted(d["kind"] for d in fleet)
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment", "Role", "RoleBinding",
        "ServiceAccount",
    ]  # fmt: skip


def test_fleet_api_offers_every_builtin_profile(render: Callable[..., Docs]) -> None:
    """The VirtualGPUPool definition (tests/test_cluster_fleet_api.py runs it on an API server): its
    profiles are the built-in ones, each with its GPUs per node in the rack-size rule; its replicas
    are bounded by fleet.maxReplicas; helm uninstall keeps it (deleting it would delete the pools)."""
    crds = [
        d for d in render({"fleet": {"enabled": True, "maxReplicas": 2000}}) if d["kind"] == "CustomResourceDefinition"
    ]
    assert [c["metadata"]["name"] for c in crds] == ["virtualgpupools.mokka.io"]
    crd = crds[0]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    names = ", ".join(f"'{n}'" for n in profile.builtin_names())
    assert spec["properties"]["profile"]["x-kubernetes-validations"][0]["rule"] == f"self in [{names}]"
    assert spec["properties"]["replicas"]["maximum"] == 2000
    gpus = ", ".join(f"'{n}': {profile.load(n).gpu_count}" for n in profile.builtin_names())
    assert "{" + gpus + "}[self.profile]" in spec["x-kubernetes-validations"][1]["rule"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    # The one definition (mokka cluster up --virtual applies it): the chart only adds its labels.
    assert crd == fleet_crd_module.definition(2000, labels=crd["metadata"]["labels"])


def test_fgo_off_by_default(render: Callable[..., Docs]) -> None:
    assert fgo_configmaps(render({})) == {}


@pytest.mark.parametrize(
    ("target", "labels"),
    [
        ("", {}),
        ("gpu-operator", {}),
        ("gpu-operator", {"my-org/custom-label": "gpu-sim", "team": "infra"}),
        # Overrides that must not break discovery: the contract label always stays "true".
        ("gpu-operator", {CONTRACT_LABEL: "false", "app.kubernetes.io/part-of": "sim"}),
        ("run-ai", {CONTRACT_LABEL: ""}),
    ],
)
def test_fgo_contract(render: Callable[..., Docs], target: str, labels: dict[str, str]) -> None:
    values = {
        "integrations": {"fakeGpuOperator": {"enabled": True, "targetNamespace": target, "profileLabels": labels}}
    }
    docs = render(values)
    cms = fgo_configmaps(docs)
    names = profile.builtin_names()
    assert sorted(cms) == [f"gpu-profile-{n}" for n in names], "one ConfigMap per built-in profile"
    namespace = target or NAMESPACE
    for n in names:
        cm = cms[f"gpu-profile-{n}"]
        assert cm["metadata"]["namespace"] == namespace
        assert list(cm["data"]) == ["profile.yaml"]
        got = cm["metadata"]["labels"]
        assert got[CONTRACT_LABEL] == "true"
        for key, value in labels.items():
            if key != CONTRACT_LABEL:
                assert got[key] == value
        assert got["app.kubernetes.io/instance"] == RELEASE
        body = fgo_load(docs, namespace, n)
        assert body == yaml.safe_load((CHART / "profiles" / f"{n}.yaml").read_text())
        assert body == json.loads(json.dumps(nodeinfo.fgo_profile(profile.load(n))))
        p = profile.load(n)
        dd = body["device_defaults"]
        assert dd["name"] == p.gpu.name
        assert dd["memory"]["total_bytes"] // 2**20 == p.gpu.memory.total_mib
        assert body["system"]["driver_version"] == p.driver.version
        assert body["system"]["cuda_version"] == p.driver.cuda
        assert (body.get("device_count") or len(body["devices"])) == p.gpu_count


def test_fgo_does_not_depend_on_the_release_profile(render: Callable[..., Docs]) -> None:
    """The ConfigMaps describe the built-in profiles, whatever this release stages itself."""
    base = {"integrations": {"fakeGpuOperator": {"enabled": True}}}
    a = fgo_configmaps(render(base))
    b = fgo_configmaps(render(base | {"gpu": {"profile": "t4", "count": 1}}))
    assert {k: v["data"] for k, v in a.items()} == {k: v["data"] for k, v in b.items()}


def exporter_docs(docs: Docs) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs if d["metadata"]["name"].endswith("dcgm-exporter")}


def test_dcgm_exporter_off_by_default(render: Callable[..., Docs]) -> None:
    assert exporter_docs(render({})) == {}


def test_dcgm_exporter_contract(render: Callable[..., Docs]) -> None:
    """The exporter asks for every GPU as GPU Operator's does (the NRI plugin then mounts the mock
    libdcgm and NVML), reads the kubelet's pod-resources socket, and never shares a selector with
    Mokka's own DaemonSet."""
    values = {"integrations": {"dcgmExporter": {"enabled": True, "image": {"tag": "4.2.3-4.1.3-ubuntu22.04"}}}}
    docs = render(values)
    found = exporter_docs(docs)
    assert sorted(found) == ["DaemonSet", "Service"]
    ds = found["DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
    assert "--kubernetes" in c["args"]
    (volume,) = ds["spec"]["template"]["spec"]["volumes"]
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert c["volumeMounts"][0]["mountPath"] == "/var/lib/kubelet/pod-resources"
    ours = next(d for d in docs if d["kind"] == "DaemonSet" and d is not ds)
    mine, theirs = ds["spec"]["selector"]["matchLabels"], ours["spec"]["selector"]["matchLabels"]
    assert not (mine.items() <= ours["spec"]["template"]["metadata"]["labels"].items())
    assert not (theirs.items() <= ds["spec"]["template"]["metadata"]["labels"].items())
    assert found["Service"]["spec"]["ports"][0]["port"] == 9400


def test_dcgm_exporter_needs_a_tag(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"integrations": {"dcgmExporter": {"enabled": True}}}))
    res = subprocess.run([str(helm), "template", "r", str(CHART), "-f", str(values)], capture_output=True, text=True)
    assert res.returncode != 0 and "integrations.dcgmExporter.image.tag" in res.stderr, res.stderr


def test_chart_generated_files_in_sync() -> None:
    """profiles/ and templates/fleet-crd.yaml are what charts/mokka/update-generated.py writes."""
    res = subprocess.run(
        [sys.executable, str(CHART / "update-generated.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr


def test_helmignore_keeps_the_script_out(helm: Path, tmp_path: Path) -> None:
    res = subprocess.run(
        [str(helm), "package", str(CHART), "--destination", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    import tarfile

    (archive,) = tmp_path.glob("mokka-*.tgz")
    with tarfile.open(archive) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers()}
    assert "update-generated.py" not in members
    assert {f"profiles/{n}.yaml" for n in profile.builtin_names()} <= members
    assert {"values.schema.json", "templates/NOTES.txt", "Chart.yaml", "values.yaml"} <= members


def test_prometheus_finds_the_controller_and_the_exporters_through_dns(render: Callable[..., Docs]) -> None:
    """integrations.prometheus: a headless Service per component (the fleet controller, dcgm-exporter)
    lists its pods, and Prometheus scrapes each through DNS: no API access (no RBAC) at all; the pods
    carry prometheus.io/* annotations for a Prometheus of one's own."""
    values = {
        "fleet": {"enabled": True},
        "integrations": {
            "prometheus": {"enabled": True, "scrapeInterval": "2s"},
            "dcgmExporter": {"enabled": True, "image": {"tag": "4.2.3-4.1.3-ubuntu22.04"}},
        },
    }
    docs = render(values)
    prefix = f"{RELEASE}-mokka-"
    mine = {
        (d["kind"], d["metadata"]["name"].removeprefix(prefix))
        for d in docs
        if d["metadata"]["name"] in (f"{prefix}prometheus", f"{prefix}fleet-metrics", f"{prefix}dcgm-exporter-pods")
    }
    assert mine == {
        ("ConfigMap", "prometheus"),
        ("Deployment", "prometheus"),
        ("Service", "prometheus"),
        ("Service", "fleet-metrics"),
        ("Service", "dcgm-exporter-pods"),
    }
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole") and "prometheus" in d["metadata"]["name"]]
    config = yaml.safe_load(one_named(docs, "ConfigMap", f"{prefix}prometheus")["data"]["prometheus.yml"])
    assert config["global"]["scrape_interval"] == "2s"
    jobs = {j["job_name"]: j["dns_sd_configs"][0] for j in config["scrape_configs"]}
    assert jobs["fleet-controller"]["names"] == [f"{prefix}fleet-metrics.{NAMESPACE}.svc"]
    assert jobs["fleet-controller"]["port"] == 8080 and jobs["dcgm-exporter"]["port"] == 9400
    for svc in ("fleet-metrics", "dcgm-exporter-pods"):
        assert one_named(docs, "Service", prefix + svc)["spec"]["clusterIP"] == "None"
    for kind, name in (("Deployment", "fleet"), ("DaemonSet", "dcgm-exporter")):
        annotations = one_named(docs, kind, prefix + name)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"]
    pod = one_named(docs, "Deployment", f"{prefix}prometheus")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "kwok" in json.dumps(pod["affinity"])  # never on a virtual node
    assert one_named(docs, "Service", f"{prefix}prometheus")["spec"]["ports"][0]["port"] == 9090


def one_named(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found
