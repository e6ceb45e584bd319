"""A real Kubernetes with mock GPUs for the tests (localcluster), and pod helpers.

``kube_cluster`` (session): one cluster for the whole run — NVIDIA's device plugin in envvar
mode, the h100 profile's 8 GPUs, GFD's labels on the node. ``start_cluster(base, **options)``
brings up another one (e.g. ``allocator="dra"``, ``device_list_strategy="cdi-cri"``) and checks,
when its block ends, that ``down`` left nothing. The binaries are built by ``.ci/setup``
(``python -m fetch.kube.binaries``); when they are missing, the fixture builds them first and
says so on the terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import parallel
import pytest

from fetch import dcgm_exporter, thirdparty
from fetch.kube import binaries
from localcluster import config
from localcluster.addons import gpu_operator, nvidia_dra
from localcluster.cluster import Cluster, Options, leftovers
from localcluster.images import WORKLOAD_IMAGE

# NVIDIA's DRA driver (its binaries and chart) beside the checkout, or where $MOKKA_NVIDIA_DRA_DIR says.
needs_nvidia_dra = pytest.mark.skipif(
    nvidia_dra.source_dir() is None,
    reason=f"no NVIDIA DRA driver (../shared/thirdparty/k8s-dra-driver-gpu or ${nvidia_dra.ENV_DIR})",
)


# NVIDIA's GPU Operator: the user's builds its chart runs beside the ones Mokka makes (NVIDIA's MIG
# manager and dcgm-exporter), beside the checkout or where their variables say.
needs_gpu_operator = pytest.mark.skipif(
    thirdparty.directory(gpu_operator.MIG_PARTED_ENV, "mig-parted") is None or dcgm_exporter.directory() is None,
    reason=f"no MIG manager (../shared/thirdparty/mig-parted or ${gpu_operator.MIG_PARTED_ENV}) or dcgm-exporter "
    f"(../shared/thirdparty/dcgm or ${dcgm_exporter.ENV_DIR})",
)


def _terminal(line: str) -> None:
    print(f"[kube] {line}", file=sys.__stderr__, flush=True)


def host_sysctls() -> dict[str, str]:
    """The host's values of the settings a cluster keeps private (:data:`localcluster.config.SYSCTLS`)."""
    return {key: Path("/proc/sys", key).read_text().strip() for key in config.SYSCTLS}


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("a local Kubernetes cluster needs root")


def ensure_binaries() -> None:
    if binaries.cached() is None:
        _terminal("Kubernetes binaries are not in the cache: building them (run .ci/setup to do it ahead)")
        binaries.ensure(progress=_terminal)


@contextlib.contextmanager
def start_cluster(base: Path, **options: Any) -> Iterator[Cluster]:
    """A cluster under ``base`` for the duration of the block; ``down`` must leave nothing."""
    require_root()
    ensure_binaries()
    before = host_sysctls()
    nodes = len(options.get("nodes") or ()) or 1
    with parallel.inotify_room(parallel.local_cluster_inotify(nodes), f"a local cluster of {nodes} nodes"):
        cluster = Cluster.up(Options(base=base, **options))
    try:
        yield cluster
    finally:
        spawned = {p.pid: p.name for p in cluster.procs}
        problems = cluster.down()
        left = leftovers(base) + [f"{name} a zombie" for pid, name in spawned.items() if zombie_child(pid)]
        assert not problems and not left, f"cluster down left: {problems + left}"
        assert host_sysctls() == before, "kubelet changed the host's sysctls"


def zombie_child(pid: int) -> bool:
    """Process ``pid`` is this process's child and had ended unreaped (it is reaped now)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # not this process's child (any more)
        return False


# The session cluster serves a few modules. Idle, a cluster keeps about a quarter of a 2-core
# machine busy (measured: 30.7 % against 4.4 % with none), so it stops right after the last test
# that uses it instead of at the end of the session, beside every module that comes later.
_session_cluster = contextlib.ExitStack()
_last_user: list[pytest.Item] = []


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield _session_cluster.enter_context(start_cluster(tmp_path_factory.mktemp("kube")))
    _session_cluster.close()


@pytest.hookimpl(trylast=True)  # after the selection (-k, -m, deselection) has settled the order
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _last_user[:] = [i for i in items if "kube_cluster" in getattr(i, "fixturenames", ())][-1:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the item's own fixtures first (a module's release on the cluster, its namespaces)
    if _last_user and item is _last_user[0]:
        _session_cluster.close()  # its checks (nothing left, sysctls) fail this teardown


@pytest.fixture(scope="session")
def core(kube_cluster: Cluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube_cluster.api())


@dataclass
class PodResult:
    name: str
    phase: str
    logs: str
    pod: Any


def pod_manifest(
    name: str,
    command: list[str],
    *,
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
    image: str = WORKLOAD_IMAGE,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"restartPolicy": "Never", "containers": [container], "terminationGracePeriodSeconds": 0},
    }


# A claim pod's container: the GPUs nvidia-smi lists, then its /dev/nvidiaN nodes.
CLAIM_PROBE = "nvidia-smi -L; echo devices: $(ls /dev | grep -E '^nvidia[0-9]+$' | sort | tr '\\n' ' '); sleep 3600"


def gpu_and_its_nic(index: int, gpu_driver: str = "gpu.nvidia.com", nic_driver: str = "nic.mokka.io") -> str:
    """A claim's ``devices`` (for :func:`claim_pod`): GPU ``index`` and any InfiniBand adapter that shares
    its ``resource.kubernetes.io/pcieRoot`` (the adapter on its PCIe switch)."""
    gpu = json.dumps(f'device.attributes["{gpu_driver}"].index == {index}')
    return (
        f"{{requests: [{{name: gpu, exactly: {{deviceClassName: {gpu_driver}, selectors: [{{cel: {{expression: "
        f"{gpu}}}}}]}}}}, {{name: nic, exactly: {{deviceClassName: {nic_driver}}}}}], "
        "constraints: [{matchAttribute: resource.kubernetes.io/pcieRoot}]}"
    )


def claim_pod(
    name: str,
    template: str | None = None,
    *,
    selector: str | None = None,
    annotations: dict[str, str] | None = None,
    device_class: str = "gpu.nvidia.com",
    probe: str = CLAIM_PROBE,
    devices: str | None = None,
    image: str = WORKLOAD_IMAGE,
) -> str:
    """A ResourceClaimTemplate ``template`` (default: the pod's name) of one device of
    ``device_class`` (optionally CEL-selected), or of ``devices`` (the claim's ``devices`` as YAML
    flow text: its requests and constraints), and a pod ``name`` of ``image`` using it that runs
    ``probe`` (default :data:`CLAIM_PROBE`), as YAML for ``kubectl apply``."""
    template = template or name
    cel = f", selectors: [{{cel: {{expression: {json.dumps(selector)}}}}}]" if selector else ""
    wanted = devices or f"{{requests: [{{name: gpu, exactly: {{deviceClassName: {device_class}{cel}}}}}]}}"
    return textwrap.dedent(f"""
    apiVersion: resource.k8s.io/v1
    kind: ResourceClaimTemplate
    metadata: {{name: {template}}}
    spec:
      spec:
        devices: {wanted}
    ---
    apiVersion: v1
    kind: Pod
    metadata: {{name: {name}, annotations: {json.dumps(annotations or {})}}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 0
      resourceClaims:
      - {{name: gpu, resourceClaimTemplateName: {template}}}
      containers:
      - name: probe
        image: {image}
        imagePullPolicy: Never
        command: ["sh", "-c", {json.dumps(probe)}]
        resources:
          claims:
          - {{name: gpu}}
    """)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(0.2)


def run_pod(core: Any, manifest: dict[str, Any], namespace: str = "default", timeout: float = 90) -> PodResult:
    """Create the pod, wait until it has finished, return its phase and logs; the pod is deleted."""
    name = manifest["metadata"]["name"]
    core.create_namespaced_pod(namespace, manifest)
    try:

        def finished() -> Any:
            pod = core.read_namespaced_pod(name, namespace)
            return pod if pod.status.phase in ("Succeeded", "Failed") else None

        pod = wait_for(f"pod {name} to finish", finished, timeout)
        logs = core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()
        return PodResult(name, pod.status.phase, logs, pod)
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def install_chart(
    cluster: Cluster, namespace: str, values: dict[str, Any], tmp: Path, only: tuple[str, ...] = ()
) -> str:
    """Mokka's node image (built without Docker; with NVIDIA's GFD and KWOK where ``fleet.enabled``) imported
    into every node, and the Helm chart rendered for this cluster's Kubernetes version with
    ``values`` (the image filled in) — only the templates ``only`` names, where it names some —
    and applied server-side with strict validation into ``namespace``; the rendered manifests."""
    import json
    import subprocess

    import test_chart
    import yaml

    from fetch import nvidia_smi, prepare, versions
    from localcluster import nodeimage

    gfd = kwok = None
    if values.get("fleet", {}).get("enabled"):
        bins = binaries.cached()
        assert bins is not None
        gfd, kwok = bins["gpu-feature-discovery"], bins.kwok
    cluster.import_image(nodeimage.build(tmp / "node-image", nvidia_smi.fetch("550"), gfd=gfd, kwok=kwok))
    repository, tag = nodeimage.NODE_IMAGE.rsplit(":", 1)
    values = {**values, "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm = prepare.go_binary(versions.HELM)  # built by .ci/setup --tests
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    argv = [str(helm), "template", "node", str(test_chart.CHART), "-n", namespace, "-f", str(values_file), "--no-hooks"]
    argv += ["--kube-version", version.lstrip("v"), *(f"--show-only=templates/{t}" for t in only)]
    rendered = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "--server-side", "--validate=strict", "-f", "-", input=rendered)
    return rendered


PROMETHEUS_IMAGE = "localhost/mokka/prometheus:debian"


def import_prometheus(cluster: Cluster, tmp: Path) -> dict[str, str]:
    """A Prometheus image (Debian's binary on busybox, built without Docker) imported into every
    node; the chart's ``integrations.prometheus.image`` values naming it."""
    import shutil

    from containers import images as oci
    from fetch import prepare
    from fetch.kube import versions as kube_versions

    binary = prepare.debian_program(kube_versions.PROMETHEUS)  # unpacked by .ci/setup --tests
    root = oci.make_rootfs(tmp / "prometheus-root", programs=[binary])
    shutil.copy2(binary, root / "usr/bin/prometheus")
    for sub in ("prometheus", "etc/prometheus"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    archive = oci.oci_archive(
        root, tmp / "prometheus.tar", PROMETHEUS_IMAGE, entrypoint=["/usr/bin/prometheus"], cmd=[]
    )
    cluster.import_image(archive)
    repository, tag = PROMETHEUS_IMAGE.rsplit(":", 1)
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


@contextlib.contextmanager
def fleet_crd(cluster: Cluster, max_replicas: int = 100000) -> Iterator[None]:
    """The chart's VirtualGPUPool CustomResourceDefinition (``fleet.enabled=true``), rendered by
    helm for this cluster and applied server-side; deleted at the end (with every pool)."""
    import subprocess

    import test_chart
    import yaml

    from fetch import prepare, versions

    crd = "virtualgpupools.mokka.io"
    helm = prepare.go_binary(versions.HELM)  # built by .ci/setup --tests
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    argv = [str(helm), "template", "fleet", str(test_chart.CHART), "--kube-version", server.lstrip("v")]
    argv += ["--set", "fleet.enabled=true", "--set", f"fleet.maxReplicas={max_replicas}"]
    argv += ["--show-only", "templates/fleet-crd.yaml"]
    rendered = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    assert [d["kind"] for d in yaml.safe_load_all(rendered) if d] == ["CustomResourceDefinition"]
    cluster.kubectl("apply", "--server-side", "--validate=strict", "-f", "-", input=rendered)
    try:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        yield
    finally:
        cluster.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true", check=False)
