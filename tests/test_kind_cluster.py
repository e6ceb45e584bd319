"""The seed's user paths on real kind, one cluster for all of them, in this order:

1. ``kind create cluster`` (podman provider) with the node image built here, 1 control plane + 3
   workers as kind/cluster-containerd-2.yaml has them (one ``integration``, two ``scale``), Ready;
2. ``kind/bootstrap.sh`` as a developer runs it, in :mod:`kind.provider`'s namespaces (podman: no
   docker daemon): it finds the cluster, builds Mokka's image from the Dockerfile
   (:mod:`kind.dockerfile_image`), loads it and debian:bookworm-slim into the nodes (``kind load
   image-archive``), installs the chart on the integration worker, and a plain pod there lists the
   profile's GPUs with ``nvidia-smi -L``; the node carries ``nvidia.com/gpu.present=true``;
3. the quick start as a user types it: ``helm install`` of the chart with its default values (the
   image under the chart's default name, as ``kind load`` would put a published one), then
   ``helm upgrade --set gpu.profile=<name>`` for every built-in profile: every worker reports the
   profile's GPUs at the count of the server a user means by the name (gpumodel/profiles), in its
   labels and to a plain pod's nvidia-smi;
4. the FGO pairing guide step by step (tests/fgo_guide.py; the local cluster runs it too:
   tests/test_cluster_fgo_guide.py), on the guide's own topology;
5. ``bootstrap.sh --delete``, and nothing left: no podman container or volume, and once the
   environment is closed no process, mount or cgroup of it, and the host's network namespace (links,
   addresses, routes, iptables chains, forwarding sysctls) exactly as before.

kind v0.33.0 (Go module proxy), Debian's podman 4.3 with bookworm's runc, the node image of
:mod:`kind.nodeimage` (Debian bookworm, systemd, Debian's containerd 2.1, the project's Kubernetes
v1.34 with kubeadm, the control-plane images preloaded), all run by :mod:`kind.provider` in private
network and mount namespaces with podman's state under one directory. helm, kubectl and the
kubernetes client reach the API server from the host through :mod:`kind.relay`, as they would a kind
cluster's on a user's machine. Needs root and podman; kind, helm, the Kubernetes build and the node
image come from ``.ci/setup --tests`` (a missing one fails naming that command).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fgo_guide
import parallel
import pytest
import yaml
from cluster_fixtures import pod_manifest, run_pod, wait_for
from fgo_guide import MOKKA_IMAGE, POOL, Guide, core, fgo_chart, ok

from fetch import debcache, prepare, versions
from fetch.kube import binaries
from localcluster.addons import fgo_images

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpumodel import profile  # noqa: E402
from kind import nodeimage, provider  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (private namespaces, podman's private store)"),
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman is not installed (.ci/setup --tests installs it)"
    ),
]

__all__ = ["core", "fgo_chart"]  # fixtures the guide's steps use
NAME = "mokka"
CONFIG = REPO / "kind" / "cluster-containerd-2.yaml"
BOOTSTRAP = REPO / "kind" / "bootstrap.sh"
CHART = REPO / "charts" / "mokka"
PROFILE = "h100"  # bootstrap.sh's default
INTEGRATION, SCALE = f"{NAME}-worker", (f"{NAME}-worker2", f"{NAME}-worker3")
WORKERS = (INTEGRATION, *SCALE)
DEV_IMAGE = "docker.io/library/mokka:dev"  # what bootstrap.sh builds and loads
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
DEFAULT_PROFILE = yaml.safe_load((CHART / "values.yaml").read_text())["gpu"]["profile"]
HOW = prepare.HOW


@dataclass
class Kind:
    """The environment, the cluster in it, and what the steps share."""

    env: provider.KindEnvironment
    parts: dict[str, Path]
    base: Path
    before: dict[str, object]  # the host's network namespace before anything started
    kubeconfig: Path = Path()
    times: dict[str, float] = field(default_factory=dict)
    closed: bool = False

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl on the host, through the relay (never raises)."""
        argv = [str(self.parts["kubectl"]), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=300, check=False)

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return fgo_guide.run_helm(self.kubeconfig, self.base / "helm", *args, timeout=600)

    def api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def images_on(self, node: str) -> set[str]:
        return set(self.env.podman("exec", node, "ctr", "-n", "k8s.io", "images", "ls", "-q").split())

    def load(self, archive: Path) -> None:
        """``kind load image-archive``: into every node's containerd."""
        self.env.kind("load", "image-archive", str(archive), "--name", NAME, timeout=600)

    def tag(self, source: str, target: str) -> None:
        for node in WORKERS:
            self.env.podman("exec", node, "ctr", "-n", "k8s.io", "images", "tag", "--force", source, target)


@pytest.fixture(scope="module")
def kind() -> Iterator[Kind]:
    """The cluster, created by the provider from kind/cluster-containerd-2.yaml on the node image
    built here; bootstrap.sh finds it and reuses it (its own config names kindest/node, which nothing
    here can pull). Closed by the last test, or here if it did not get that far."""
    try:
        parts = {
            "kind": prepare.go_binary(versions.KIND),
            "helm": prepare.go_binary(versions.HELM),
        }
    except prepare.NotPrepared as exc:
        pytest.fail(str(exc))
    kube = binaries.cached()
    if kube is None:
        pytest.fail(f"the Kubernetes build is missing: {HOW}")
    try:
        image = nodeimage.cached()
    except nodeimage.ImageError as exc:
        pytest.fail(str(exc))
    if image is None:
        pytest.fail(f"kind's node image is not built: {HOW}")
    if not provider.dns_tools_cached():
        pytest.fail(f"the dnsname CNI plugin and dnsmasq for podman are not fetched: {HOW}")
    parts |= {"kubectl": kube.kubernetes / "kubectl", "image": image}
    # short: podman's sockets live below it (a Unix socket path has 108 bytes)
    base = Path(tempfile.mkdtemp(prefix="mokka-kind-", dir="/tmp"))
    k = Kind(provider.KindEnvironment(base, parts["kind"], parts["kubectl"]), parts, base, provider.host_state())
    t = time.monotonic()
    try:
        k.env.start()
        k.env.load_image(parts["image"], nodeimage.NODE_IMAGE)
        config = base / "cluster.yaml"
        config.write_text(provider.cluster_config(CONFIG, nodeimage.NODE_IMAGE, nodeimage.etcd_image_tag()))
        with parallel.inotify_room(parallel.KIND_INOTIFY, "kind's cluster"):
            created = k.env.kind("create", "cluster", "--name", NAME, "--config", str(config), check=False)
        assert created.returncode == 0, (created.stdout + created.stderr)[-3000:]
        assert len(k.env.record_containers()) == 4
        k.env.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=180s", timeout=200)
        k.kubeconfig = k.env.host_kubeconfig(base / "host-kubeconfig")
        k.times["create, nodes Ready"] = round(time.monotonic() - t, 1)
        yield k
    finally:
        if not k.closed:
            k.env.close()
        print(f"kind timings (s): {k.times}")


@pytest.fixture(scope="module")
def dockerfile_image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Mokka's image as bootstrap.sh builds it (and debian:bookworm-slim), built on the host's
    network: bootstrap.sh's own build in the private namespace, which reaches no network, then takes
    every layer from the cache."""
    out = tmp_path_factory.mktemp("dockerfile-image")
    archives = {"mokka": out / "mokka.tar", "base": out / "base.tar"}
    argv: list[str | Path] = [sys.executable, "-m", "kind.dockerfile_image", "--out", archives["mokka"],
            "--base-out", archives["base"], "--tag", "mokka:dev", "--nvidia-smi", "550"]  # fmt: skip
    built = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False,
        env={**os.environ, "MOKKA_CACHE": str(debcache.default_cache())},
    )  # fmt: skip
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    return archives


@pytest.fixture(scope="module")
def chart_image(kind: Kind, dockerfile_image: dict[str, Path]) -> str:
    """Mokka's image under the chart's default name (``mokka`` at the chart's appVersion), and
    debian:bookworm-slim, on every worker: what ``kind load docker-image`` of a published image
    would leave. Loaded here only if bootstrap.sh did not get that far."""
    present = kind.images_on(INTEGRATION)
    for name, archive in ((DEV_IMAGE, dockerfile_image["mokka"]), (BASE_IMAGE, dockerfile_image["base"])):
        if name not in present:
            kind.load(archive)
    kind.tag(DEV_IMAGE, MOKKA_IMAGE)
    return MOKKA_IMAGE


@pytest.fixture(scope="module")
def kube(kind: Kind) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kind.api())


# ---------------------------------------------------------------------------------------- 1. the cluster


def test_kind_create_cluster_nodes_ready(kind: Kind) -> None:
    columns = (
        "N:.metadata.name,V:.status.nodeInfo.kubeletVersion,R:.status.nodeInfo.containerRuntimeVersion,"
        "P:.metadata.labels.run\\.ai/simulated-gpu-node-pool"
    )
    nodes = ok(kind.kubectl("get", "nodes", "--no-headers", "-o", f"custom-columns={columns}")).split("\n")
    rows = sorted(line.split() for line in nodes if line.strip())
    assert [r[0] for r in rows] == [f"{NAME}-control-plane", *WORKERS]
    assert {r[1] for r in rows} == {"v1.34.4"}
    assert all(r[2].startswith("containerd://2.1.") for r in rows), rows
    assert [r[3] for r in rows[1:]] == ["integration", "scale", "scale"]

    # what podman's CNI made lives in the private network namespace, not the host's
    inside = kind.env.run(["ip", "-o", "link"]).stdout + kind.env.run(["iptables-save"]).stdout
    assert "cni-podman" in inside and "CNI-" in inside
    host = provider.host_state()
    assert isinstance(host["links"], list) and not any("cni-podman" in link for link in host["links"])
    # the kubelets ran and wrote their kernel settings into their nodes' shadows, not the host's kernel
    assert host["sysctls"] == kind.before["sysctls"]
    assert kind.env.podman("exec", WORKERS[0], "cat", "/proc/sys/kernel/panic").strip() == "10"  # the kubelet's


# ---------------------------------------------------------------------------------------- 2. bootstrap.sh


def bootstrap(kind: Kind, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """kind/bootstrap.sh in the environment's namespaces, with kind, helm and kubectl on PATH."""
    tools = (kind.parts["helm"], kind.parts["kind"], kind.parts["kubectl"], Path(sys.executable))
    path = ":".join(str(p.parent) for p in tools)
    return kind.env.run(
        ["bash", BOOTSTRAP, "--name", NAME, "--profile", PROFILE, *args],
        env={"PATH": f"{path}:{kind.env.env()['PATH']}", "MOKKA_CACHE": str(debcache.default_cache())},
        timeout=timeout,
        check=False,
    )


def test_bootstrap_sh(kind: Kind, dockerfile_image: dict[str, Path]) -> None:
    t = time.monotonic()
    res = bootstrap(kind, timeout=1500)
    out = res.stdout + res.stderr
    kind.times["bootstrap.sh"] = round(time.monotonic() - t, 1)
    assert res.returncode == 0, out[-4000:]
    assert "exists: reusing it" in out
    assert "== image mokka:dev (nvidia-smi 550, podman)" in out
    gpus = profile.load(PROFILE).gpu_count
    assert gpus == 8
    listed = [line for line in out.splitlines() if line.startswith("GPU ") and "NVIDIA H100" in line]
    assert len(listed) == gpus, out[-4000:]
    assert f"== ok: {gpus} mock GPUs in a plain pod on cluster {NAME} (context kind-{NAME})" in out

    # the chart's pod runs on the integration worker only, from the loaded image
    columns = "custom-columns=N:.spec.nodeName,P:.status.phase,I:.spec.containers[0].image"
    pods = ok(kind.kubectl("-n", "mokka", "get", "pods", "--no-headers", "-o", columns)).split("\n")
    assert [line.split() for line in pods if line.strip()] == [[INTEGRATION, "Running", "mokka:dev"]]
    labelled = kind.kubectl("get", "nodes", "-l", f"{POOL}=integration,nvidia.com/gpu.present=true", "-o", "name")
    assert ok(labelled).split() == [f"node/{INTEGRATION}"]
    # the next steps install their own releases
    ok(kind.helm("uninstall", "mokka", "--namespace", "mokka", "--wait", "--timeout", "180s"))
    ok(kind.kubectl("delete", "namespace", "mokka", "--wait=true", "--timeout=120s"))


# ---------------------------------------------------------------------------------------- 3. the quick start


def quickstart(kind: Kind, verb: str, *args: str) -> None:
    """``helm VERB mokka charts/mokka --namespace mokka ...``, then every pod of the DaemonSet rolled out
    (helm's --wait can pass a DaemonSet whose status the controller has not filled in yet)."""
    ok(kind.helm(verb, "mokka", str(CHART), "--namespace", "mokka", *args, "--wait", "--timeout", "300s"))
    ok(kind.kubectl("rollout", "status", "daemonset", "-n", "mokka", "--timeout=300s"))


def check_workers_report(kind: Kind, kube: Any, name: str, smi_on: tuple[str, ...]) -> None:
    """Every worker labelled with the profile's GPUs; a plain pod on each of ``smi_on`` lists them."""
    p = profile.load(name)
    product = p.gpu.name.replace(" ", "-")

    def labelled() -> bool:
        for node in WORKERS:
            labels = kube.read_node(node).metadata.labels or {}
            if (labels.get("nvidia.com/gpu.count"), labels.get("nvidia.com/gpu.product")) != (
                str(p.gpu_count),
                product,
            ):
                return False
        return True

    wait_for(f"every worker labelled with {p.gpu_count} GPUs of {name}", labelled, 180)
    for node in smi_on:
        manifest = pod_manifest(f"smi-{name}-{node}", ["nvidia-smi", "-L"], image=BASE_IMAGE)
        manifest["spec"]["nodeName"] = node
        res = run_pod(kube, manifest, timeout=120)
        assert res.phase == "Succeeded", res.logs
        listed = [line for line in res.logs.splitlines() if line.startswith("GPU ")]
        assert len(listed) == p.gpu_count and all(p.gpu.name in line for line in listed), (name, node, res.logs)


def test_quickstart_install_with_default_values(kind: Kind, kube: Any, chart_image: str) -> None:
    """``helm install mokka charts/mokka --namespace mokka --create-namespace``: the chart's default
    profile on every worker (the control plane is tainted: no pod there)."""
    t = time.monotonic()
    quickstart(kind, "install", "--create-namespace")
    pods = json.loads(ok(kind.kubectl("get", "pods", "-n", "mokka", "-o", "json")))["items"]
    assert sorted((pod["spec"]["nodeName"], pod["status"]["phase"]) for pod in pods) == [
        (node, "Running") for node in WORKERS
    ]
    assert {pod["spec"]["containers"][0]["image"] for pod in pods} == {"mokka:0.1.0"}
    check_workers_report(kind, kube, DEFAULT_PROFILE, WORKERS)
    kind.times["quick start: install"] = round(time.monotonic() - t, 1)


@pytest.mark.parametrize("name", [n for n in profile.builtin_names() if n != DEFAULT_PROFILE])
def test_quickstart_set_gpu_profile(kind: Kind, kube: Any, chart_image: str, name: str) -> None:
    """``helm upgrade --set gpu.profile=<name>``: every worker restaged as that server; the plain pod
    runs on each worker in turn."""
    t = time.monotonic()
    quickstart(kind, "upgrade", "--reuse-values", "--set", f"gpu.profile={name}")
    turn = profile.builtin_names().index(name) % len(WORKERS)
    check_workers_report(kind, kube, name, (WORKERS[turn],))
    kind.times[f"quick start: {name}"] = round(time.monotonic() - t, 1)


def test_quickstart_uninstall(kind: Kind, kube: Any) -> None:
    """``helm uninstall``: every worker's GPU labels go with the pods (their preStop)."""
    ok(kind.helm("uninstall", "mokka", "--namespace", "mokka", "--wait", "--timeout", "180s"))
    wait_for(
        "the GPU labels gone from every worker",
        lambda: not any("nvidia.com/gpu.present" in (kube.read_node(n).metadata.labels or {}) for n in WORKERS),
        120,
    )
    ok(kind.kubectl("delete", "namespace", "mokka", "--wait=true", "--timeout=120s"))


# ---------------------------------------------------------------------------------------- 4. the FGO guide


@pytest.fixture(scope="module")
def guide(kind: Kind) -> Guide:
    if not fgo_guide.HAVE_FGO:
        pytest.skip(fgo_guide.NO_FGO)
    return Guide(
        kubeconfig=kind.kubeconfig,
        helm_home=kind.base / "helm",
        kubectl=kind.kubectl,
        api=kind.api,
        integration=INTEGRATION,
        scale=SCALE,
        images_on=kind.images_on,
        workload_image=BASE_IMAGE,
        label_pools=lambda: None,  # Step 1 is the kind config's
    )


@pytest.fixture(scope="module")
def images(kind: Kind, chart_image: str, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """FGO's images (from its binaries, under its names) loaded with ``kind load image-archive``;
    Mokka's under the name its chart pulls by default."""
    assert fgo_guide.FGO_SRC is not None
    out = tmp_path_factory.mktemp("fgo-images")
    archives = fgo_images.build(fgo_guide.FGO_SRC, out, debcache.default_cache())
    for archive in archives:
        kind.load(archive)
        archive.unlink()
    return archives


globals().update(fgo_guide.steps())  # the guide's steps, in order


# ---------------------------------------------------------------------------------------- 5. delete


def test_bootstrap_delete_leaves_nothing(kind: Kind) -> None:
    t = time.monotonic()
    deleted = bootstrap(kind, "--delete", timeout=300)
    assert deleted.returncode == 0, (deleted.stdout + deleted.stderr)[-3000:]
    assert kind.env.podman("ps", "--all", "--quiet").split() == []
    assert kind.env.podman("volume", "ls", "--quiet").split() == []
    assert NAME not in kind.env.kind("get", "clusters").stdout.split()
    # kind leaves its podman network (bridge, CNI chains, forwarding): close() removes it and ends the
    # namespace it lives in
    assert "kind" in kind.env.podman("network", "ls", "--format", "{{.Name}}").split()
    kind.closed = True
    problems = kind.env.close()
    kind.times["delete, close"] = round(time.monotonic() - t, 1)
    assert problems == []
    assert kind.env.leftovers() == []
    after = provider.host_state()
    changed = {k: after[k] for k in kind.before if after[k] != kind.before[k]}
    assert changed == {}, "the host's network namespace or kernel settings changed"
