"""The DRA plugin on a real single-node Kubernetes (kube-apiserver, scheduler, controller-manager,
kubelet 1.34 on containerd 2.1 with CDI): ResourceSlice -> scheduler allocation ->
NodePrepareResources -> the project's CDI device applied by containerd -> nvidia-smi in an
unmodified image sees exactly the claimed GPU.

The node has four GPUs of which GPU 2 is another product, so a CEL selector on ``productName``
has exactly one right answer. Pods are annotated ``mokka.io/inject: "false"`` nowhere: what a pod
sees comes from its claim alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_fixtures import claim_pod, gpu_and_its_nic

pytestmark = [pytest.mark.slow, pytest.mark.root]

DRIVER = "gpu.nvidia.com"
OTHER_PRODUCT = "NVIDIA H100 NVL"  # GPU 2's product; the others are the h100 profile's
GPUS = 4
TIMEOUT = 90.0
PLUGIN = "dra-driver"  # the name the cluster runs the DRA driver under (its log: logs/dra-driver.log)


def mixed_profile(path: Path) -> Path:
    """The built-in h100 profile with four GPUs, GPU 2 another product."""
    data = yaml.safe_load((resources.files("gpumodel") / "profiles" / "h100.yaml").read_text())
    data.update(name="h100-mixed", gpu_count=GPUS)
    # Overrides only for GPUs the profile has (one for GPU 5 of a 4-GPU profile is an error).
    data["gpus"] = {index: override for index, override in data.get("gpus", {}).items() if index < GPUS}
    data["gpus"][2] = {"name": OTHER_PRODUCT}
    path.write_text(yaml.safe_dump(data))
    return path


def plugin_argv(cluster: Any) -> list[str]:
    from localcluster import gpustack

    argv = gpustack.dra_driver_argv(cluster.node().layout)
    if argv is not None:
        return list(argv)
    return [  # the cluster has no DRA hook yet: run the plugin as the hook would
        sys.executable,
        "-m",
        "mokka.cli",
        "dra-plugin",
        "--root",
        str(cluster.node().layout.node_root),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--node-name",
        cluster.node_name,
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A cluster of its own (``--allocator dra``, the mixed profile), torn down leaving nothing."""
    if os.geteuid() != 0:
        pytest.skip("a local cluster needs root")
    pytest.importorskip("localcluster.cluster", reason="the local cluster (localcluster) is not here yet")
    from cluster_fixtures import start_cluster

    prof = mixed_profile(tmp_path_factory.mktemp("profile") / "h100-mixed.yaml")
    with start_cluster(tmp_path_factory.mktemp("kube-dra"), profile=str(prof), allocator="dra") as c:
        if c.proc(PLUGIN) is None:  # a cluster that does not run the DRA driver itself
            c.spawn(PLUGIN, plugin_argv(c))
        wait("the plugin registered with kubelet", lambda: "kubelet registered the plugin" in plugin_log(c))
        yield c


def plugin_log(cluster: Any) -> str:
    path = cluster.node().layout.logs / f"{PLUGIN}.log"
    return path.read_text() if path.exists() else ""


def wait(what: str, check: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(0.2)


def get(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def apply(cluster: Any, text: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=textwrap.dedent(text))


def phase(cluster: Any, pod: str) -> str:
    return str(get(cluster, "pod", pod)["status"].get("phase", ""))


def running(cluster: Any, pod: str) -> dict[str, Any]:
    """Wait for ``pod`` to run and print its GPUs; its GPU UUIDs and /dev/nvidiaN nodes."""
    wait(f"pod {pod} Running", lambda: phase(cluster, pod) == "Running")
    wait(f"pod {pod} output", lambda: "devices:" in cluster.kubectl("logs", pod, check=False).stdout)
    out = cluster.kubectl("logs", pod).stdout
    return {
        "uuids": re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)", out),
        "names": re.findall(r"^GPU \d+: (.*) \(UUID", out, re.M),
        "nodes": out.split("devices:", 1)[1].split(),
        "log": out,
    }


def allocated(cluster: Any, pod: str) -> list[str]:
    """The devices the scheduler allocated to ``pod``'s claim."""
    status = get(cluster, "pod", pod)["status"]
    claim = next(s["resourceClaimName"] for s in status["resourceClaimStatuses"])
    results = get(cluster, "resourceclaim", claim)["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {DRIVER}
    return [str(r["device"]) for r in results]


def the_slice(cluster: Any) -> dict[str, Any]:
    items = get(cluster, "resourceslices", f"--field-selector=spec.nodeName={cluster.node_name}")["items"]
    mine = [s for s in items if s["spec"]["driver"] == DRIVER]
    assert len(mine) == 1, [s["metadata"]["name"] for s in mine]
    return dict(mine[0])


def uuid_of(cluster: Any, device: str) -> str:
    devices = {d["name"]: d for d in the_slice(cluster)["spec"]["devices"]}
    return str(devices[device]["attributes"]["uuid"]["string"])


def delete(cluster: Any, *objects: str) -> None:
    cluster.kubectl("delete", "--ignore-not-found", "--wait=true", "--grace-period=0", *objects)
    wait("claims released", lambda: not get(cluster, "resourceclaims")["items"])


def checkpointed(cluster: Any) -> dict[str, Any]:
    res = cluster.run(["cat", f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"])
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout)["claims"])


# ---- the tests ---------------------------------------------------------------------------------


def test_the_slice_has_the_nodes_gpus_under_nvidias_names(cluster: Any) -> None:
    spec = the_slice(cluster)["spec"]
    assert (spec["driver"], spec["pool"]["name"]) == (DRIVER, cluster.node_name)
    devices = {d["name"]: d["attributes"] for d in spec["devices"]}
    assert sorted(devices) == [f"gpu-{i}" for i in range(GPUS)]
    products = {name: a["productName"]["string"] for name, a in devices.items()}
    assert products == {
        "gpu-0": "NVIDIA H100 80GB HBM3",
        "gpu-1": "NVIDIA H100 80GB HBM3",
        "gpu-2": OTHER_PRODUCT,
        "gpu-3": "NVIDIA H100 80GB HBM3",
    }
    reported = yaml.safe_load((resources.files("gpumodel") / "profiles" / "h100.yaml").read_text())["driver"]["version"]
    driver_version = ".".join(str(int(p)) for p in str(reported).split("."))  # 580.105.08 -> 580.105.8
    for attrs in devices.values():
        assert attrs["type"] == {"string": "gpu"}
        assert attrs["driverVersion"] == {"version": driver_version}
        assert attrs["resource.kubernetes.io/pcieRoot"]["string"].startswith("pci0000:")
    dc = get(cluster, "deviceclass", DRIVER)
    assert dc["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )


def test_a_claim_template_pod_sees_exactly_its_gpu(cluster: Any) -> None:
    apply(cluster, claim_pod("one-gpu", "one-gpu"))
    try:
        seen = running(cluster, "one-gpu")
        (device,) = allocated(cluster, "one-gpu")
        assert seen["uuids"] == [uuid_of(cluster, device)], seen["log"]
        assert seen["nodes"] == [f"nvidia{device.removeprefix('gpu-')}"]
        assert re.search(
            rf"prepare default/one-gpu-gpu-\w+ \(uid [0-9a-f-]+\): {device} for request gpu -> "
            rf"nvidia.com/gpu={seen['uuids'][0]}$",
            plugin_log(cluster),
            re.M,
        )
    finally:
        delete(cluster, "pod/one-gpu", "resourceclaimtemplate/one-gpu")
    wait("unprepared", lambda: checkpointed(cluster) == {})
    assert re.search(
        r"unprepare default/one-gpu-gpu-\w+ \(uid [0-9a-f-]+\): released gpu-\d$", plugin_log(cluster), re.M
    )


def test_a_cel_selector_on_product_name_picks_the_right_gpu(cluster: Any) -> None:
    selector = f'device.attributes["{DRIVER}"].productName == "{OTHER_PRODUCT}"'
    apply(cluster, claim_pod("nvl", "nvl", selector=selector))
    apply(
        cluster, claim_pod("absent", "absent", selector=f'device.attributes["{DRIVER}"].productName == "NVIDIA B200"')
    )
    try:
        seen = running(cluster, "nvl")
        assert allocated(cluster, "nvl") == ["gpu-2"]
        assert seen["names"] == [OTHER_PRODUCT]
        assert seen["uuids"] == [uuid_of(cluster, "gpu-2")]

        def unschedulable() -> bool:
            conditions = get(cluster, "pod", "absent")["status"].get("conditions", [])
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

        wait("the B200 pod is unschedulable", unschedulable)
        assert phase(cluster, "absent") == "Pending"
    finally:
        delete(cluster, "pod/nvl", "pod/absent", "resourceclaimtemplate/nvl", "resourceclaimtemplate/absent")


NIC_DRIVER = "nic.mokka.io"
RDMA_IMAGE = "localhost/mokka/rdma:1"


@pytest.fixture(scope="module")
def rdma_image(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian's ibv_devices in an image the node holds (nvidia-smi comes with the GPU's CDI device)."""
    import rdma_image as builder

    from fetch import nvidia_smi
    from gpumodel.native import library_path

    mounted = [nvidia_smi.fetch("550"), library_path()]
    cluster.import_image(builder.build(tmp_path_factory.mktemp("rdma"), RDMA_IMAGE, ["ibv_devices"], mounted=mounted))
    return RDMA_IMAGE


def test_a_claim_pairs_a_gpu_with_the_adapter_on_its_pcie_switch(cluster: Any, rdma_image: str) -> None:
    """The adapters are devices of a second driver; a claim for GPU 3 and any adapter that shares
    its resource.kubernetes.io/pcieRoot gets mlx5_3, and the pod sees exactly that pair: one GPU and
    one NIC, PIX apart, in nvidia-smi topo -m; the one adapter in ibv_devices."""
    wait("the NIC driver registered", lambda: f"kubelet registered the plugin {NIC_DRIVER}" in plugin_log(cluster))
    nics = [s for s in get(cluster, "resourceslices")["items"] if s["spec"]["driver"] == NIC_DRIVER]
    assert [s["spec"]["nodeName"] for s in nics] == [cluster.node_name]
    roots = {
        d["name"]: d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"] for d in nics[0]["spec"]["devices"]
    }
    assert sorted(roots) == [f"mlx5-{i}" for i in range(GPUS)]
    gpu_root = {
        d["name"]: d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for d in the_slice(cluster)["spec"]["devices"]
    }
    assert [n for n, r in roots.items() if r == gpu_root["gpu-3"]] == ["mlx5-3"]
    probe = "nvidia-smi topo -m; echo ---; ibv_devices; echo devices: $(ls /dev/infiniband); sleep 3600"
    apply(cluster, claim_pod("gpu-nic", probe=probe, devices=gpu_and_its_nic(3, DRIVER, NIC_DRIVER), image=rdma_image))
    try:
        wait("pod gpu-nic Running", lambda: phase(cluster, "gpu-nic") == "Running")
        wait("its output", lambda: "devices:" in cluster.kubectl("logs", "gpu-nic", check=False).stdout)
        out = cluster.kubectl("logs", "gpu-nic").stdout
        status = get(cluster, "pod", "gpu-nic")["status"]
        claim = get(cluster, "resourceclaim", status["resourceClaimStatuses"][0]["resourceClaimName"])
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted((r["driver"], r["device"]) for r in results) == [(DRIVER, "gpu-3"), (NIC_DRIVER, "mlx5-3")]
        topo, verbs = out.split("---\n", 1)
        assert re.findall(r"(GPU\d+|NIC\d+)\t", topo.splitlines()[0]) == ["GPU0", "NIC0"], out
        assert "GPU1" not in topo and "NIC1" not in topo and "NIC0: mlx5_3" in topo, out
        row = next(ln.split("\t") for ln in topo.splitlines() if ln.startswith("GPU0"))
        assert row[2].strip() == "PIX", out
        listed = [ln.split()[0] for ln in verbs.split("devices:")[0].splitlines()[2:] if ln.strip()]
        assert listed == ["mlx5_3"], out
        assert verbs.split("devices:")[1].split() == ["issm3", "rdma_cm", "umad3", "uverbs3"], out
        assert re.search(
            r"prepare default/gpu-nic-gpu-\w+ \(uid [0-9a-f-]+\): mlx5-3 for request nic -> mokka.io/hca=mlx5_3$",
            plugin_log(cluster),
            re.M,
        ), plugin_log(cluster)
    finally:
        delete(cluster, "pod/gpu-nic", "resourceclaimtemplate/gpu-nic")


def test_claims_never_share_a_gpu(cluster: Any) -> None:
    pods = [f"share-{i}" for i in range(GPUS + 1)]
    for pod in pods:
        apply(cluster, claim_pod(pod, "share"))
    try:
        wait(
            f"{GPUS} pods running",
            lambda: sum(phase(cluster, p) == "Running" for p in pods) == GPUS,
        )
        runners = [p for p in pods if phase(cluster, p) == "Running"]
        (waiting,) = set(pods) - set(runners)
        seen = {p: running(cluster, p) for p in runners}
        devices = {p: allocated(cluster, p) for p in runners}
        assert sorted(d for ds in devices.values() for d in ds) == [f"gpu-{i}" for i in range(GPUS)]
        uuids = [u for s in seen.values() for u in s["uuids"]]
        assert all(len(s["uuids"]) == 1 for s in seen.values())
        assert sorted(uuids) == sorted(uuid_of(cluster, f"gpu-{i}") for i in range(GPUS))
        assert phase(cluster, waiting) == "Pending"
        assert len(checkpointed(cluster)) == GPUS
    finally:
        delete(cluster, *(f"pod/{p}" for p in pods), "resourceclaimtemplate/share")


def dra_call(cluster: Any, method: str, claim: dict[str, str]) -> dict[str, Any]:
    """Call the plugin's DRAPlugin v1 service on kubelet's socket, as kubelet does."""
    script = textwrap.dedent(
        f"""
        import asyncio, json
        from grpclib.client import Channel
        from k8snode.dra.api import dra_v1 as v1

        async def main():
            channel = Channel(path="/var/lib/kubelet/plugins/{DRIVER}/dra.sock")
            stub = v1.DraPluginStub(channel)
            claim = v1.Claim(**{json.dumps(claim)})
            if "{method}" == "prepare":
                answer = await stub.node_prepare_resources(v1.NodePrepareResourcesRequest(claims=[claim]))
            else:
                answer = await stub.node_unprepare_resources(v1.NodeUnprepareResourcesRequest(claims=[claim]))
            channel.close()
            print(json.dumps(answer.to_pydict()))

        asyncio.run(main())
        """
    )
    res = cluster.run([sys.executable, "-c", script], timeout=60)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout)["claims"][claim["uid"]])


def test_unprepare_and_restarts_are_idempotent(cluster: Any) -> None:
    before = the_slice(cluster)
    apply(cluster, claim_pod("survivor", "survivor"))
    try:
        seen = running(cluster, "survivor")
        status = get(cluster, "pod", "survivor")["status"]
        claim_name = status["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = get(cluster, "resourceclaim", claim_name)["metadata"]
        ref = {"namespace": "default", "name": claim_name, "uid": claim["uid"]}
        first = dra_call(cluster, "prepare", ref)
        assert first["devices"][0]["cdiDeviceIds"] == [f"nvidia.com/gpu={seen['uuids'][0]}"]

        for how in (signal.SIGTERM, signal.SIGKILL):  # a clean stop, then a crash
            proc = cluster.proc(PLUGIN)
            registrations = plugin_log(cluster).count("kubelet registered the plugin")
            proc.signal(how)
            wait("the plugin gone", lambda p=proc: not p.alive())
            cluster.stop_process(PLUGIN)
            cluster.spawn(PLUGIN, plugin_argv(cluster))
            wait(
                "the restarted plugin registered",
                lambda n=registrations: plugin_log(cluster).count("kubelet registered the plugin") > n,
            )
            assert dra_call(cluster, "prepare", ref) == first  # from the checkpoint
            assert phase(cluster, "survivor") == "Running"
        after = the_slice(cluster)
        assert after["metadata"]["name"] == before["metadata"]["name"]
        assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"]
    finally:
        delete(cluster, "pod/survivor", "resourceclaimtemplate/survivor")
    wait("unprepared", lambda: checkpointed(cluster) == {})
    assert dra_call(cluster, "unprepare", ref) == {}  # again: nothing to do, no error
    assert plugin_log(cluster).count(f"(uid {ref['uid']}): released") == 1
