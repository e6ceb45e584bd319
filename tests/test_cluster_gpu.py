"""NVIDIA's device plugin and GPU Feature Discovery against the mock node, on a real kubelet and API
server (the session cluster of cluster_fixtures: device plugin in envvar mode, 8 H100s).

Pods run an unmodified image (busybox and glibc, nothing NVIDIA inside) and `nvidia-smi -L`.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from cluster_fixtures import host_sysctls, pod_manifest, run_pod, wait_for

from gpumodel import pcie, profile
from hostsetup import sysfs
from k8snode import nodeinfo
from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

PROFILE = profile.load("h100")
UUID = re.compile(r"\(UUID: (GPU-[0-9a-f-]+)\)")
SMI = "nvidia-smi -L; echo devices: $(ls /dev | grep '^nvidia[0-9]' | sort); echo visible: $NVIDIA_VISIBLE_DEVICES"


def node(core: Any) -> Any:
    return core.read_node("localhost")


def listed(logs: str) -> list[str]:
    return UUID.findall(logs)


def line(logs: str, key: str) -> list[str]:
    found = next((ln for ln in logs.splitlines() if ln.startswith(f"{key}:")), f"{key}:")
    return found.split(":", 1)[1].replace(",", " ").split()


def test_allocatable_is_the_profile_count(kube_cluster: Cluster, core: Any) -> None:
    status = node(core).status
    assert status.capacity["nvidia.com/gpu"] == str(PROFILE.gpu_count)
    assert status.allocatable["nvidia.com/gpu"] == str(PROFILE.gpu_count)


def test_pod_with_two_gpus_sees_exactly_its_two(kube_cluster: Cluster, core: Any) -> None:
    res = run_pod(core, pod_manifest("two-gpus", ["sh", "-c", SMI], gpus=2))
    assert res.phase == "Succeeded", res.logs
    allocated = line(res.logs, "visible")  # what the device plugin's Allocate answered (envvar mode)
    assert len(allocated) == 2, res.logs
    assert sorted(listed(res.logs)) == sorted(allocated), res.logs
    assert set(allocated) <= {d.uuid for d in PROFILE.devices()}


def test_pod_with_two_gpus_gets_exactly_their_device_nodes(kube_cluster: Cluster, core: Any) -> None:
    assert kube_cluster.state.nri_external  # the NRI plugin leaves allocation to the device plugin
    res = run_pod(core, pod_manifest("two-gpus-nodes", ["sh", "-c", SMI], gpus=2))
    assert res.phase == "Succeeded", res.logs
    minors = {d.uuid: d.index for d in PROFILE.devices()}
    wanted = sorted(f"nvidia{minors[u]}" for u in line(res.logs, "visible"))
    assert sorted(line(res.logs, "devices")) == wanted, res.logs


def test_pod_without_a_gpu_request_sees_none(kube_cluster: Cluster, core: Any) -> None:
    assert kube_cluster.state.nri_external  # the NRI plugin leaves allocation to the device plugin
    res = run_pod(core, pod_manifest("no-gpus", ["sh", "-c", SMI + "; true"]))
    assert listed(res.logs) == [], res.logs
    assert line(res.logs, "devices") == [], res.logs


def test_pod_asking_for_more_than_the_node_has_stays_pending(kube_cluster: Cluster, core: Any) -> None:
    name = "too-many-gpus"
    core.create_namespaced_pod("default", pod_manifest(name, ["true"], gpus=PROFILE.gpu_count + 1))
    try:

        def unschedulable() -> Any:
            pod = core.read_namespaced_pod(name, "default")
            cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
            return pod if cond is not None and cond.status == "False" else None

        pod = wait_for("the scheduler's verdict", unschedulable)
        cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
        assert pod.status.phase == "Pending"
        assert cond.reason == "Unschedulable"
        assert "Insufficient nvidia.com/gpu" in cond.message, cond.message
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_gfd_labels_the_node(kube_cluster: Cluster, core: Any) -> None:
    labels = node(core).metadata.labels
    d = "nvidia.com"
    gpu = PROFILE.gpu
    major, minor = gpu.compute_capability.split(".")
    expected = {
        f"{d}/gpu.product": nodeinfo.gfd_product(gpu.name),
        f"{d}/gpu.count": str(PROFILE.gpu_count),
        f"{d}/gpu.memory": str(gpu.memory.total_mib),
        f"{d}/gpu.compute.major": major,
        f"{d}/gpu.compute.minor": minor,
        f"{d}/cuda.driver-version.full": PROFILE.driver.version,
        f"{d}/cuda.runtime-version.full": PROFILE.driver.cuda,
        f"{d}/gpu.family": "hopper",
        f"{d}/gpu.mode": "compute",  # read from the PCI class under /sys/bus/pci/devices
    }
    assert {k: labels.get(k) for k in expected} == expected
    assert labels[f"{d}/gpu.machine"] not in ("", "unknown")  # DMI product_name


def test_gfd_agrees_with_mokkas_own_labels(kube_cluster: Cluster, core: Any) -> None:
    """k8snode.nodeinfo predicts what GFD sets: every label both know has the same value."""
    labels = node(core).metadata.labels
    ours = nodeinfo.gfd_labels(PROFILE)
    gfd = {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}
    common = sorted(set(ours) & set(gfd))
    assert len(common) >= 20, common
    assert {k: ours[k] for k in common} == {k: gfd[k] for k in common}


def test_pci_root_is_a_real_symlink_chain_in_the_namespace(kube_cluster: Cluster) -> None:
    """What NVIDIA's tools read: readlink of /sys/bus/pci/devices/<bus id> names the PCI root; the
    machine's own devices stay visible beside the mock ones."""
    behind = pcie.switches(PROFILE)  # a GPU paired with an InfiniBand adapter sits behind their PCIe switch
    for device in PROFILE.devices()[:2]:
        bus = device.bus_id.lower()[4:]  # 0000:53:00.0
        res = kube_cluster.run(["readlink", "-f", f"/sys/bus/pci/devices/{bus}"])
        assert res.stdout.strip() == "/" + str(sysfs.device_dir(device, behind.get(device.index))), res.stderr
        vendor = kube_cluster.run(["cat", f"/sys/bus/pci/devices/{bus}/vendor", f"/sys/bus/pci/devices/{bus}/class"])
        assert vendor.stdout.split() == ["0x10de", "0x030200"]
    own = kube_cluster.run(["ls", "/sys/bus/pci/devices"]).stdout.split()
    assert len(own) > PROFILE.gpu_count
    dmi = kube_cluster.run(["cat", "/sys/class/dmi/id/product_name"])
    assert dmi.stdout.strip().startswith("Mokka"), dmi.stderr


def test_kubelet_left_the_hosts_sysctls_alone(kube_cluster: Cluster) -> None:
    # what kubelet writes for the whole machine (where the host's value differs)
    kubelet = {
        "vm/overcommit_memory": "1",
        "kernel/panic": "10",
        "kernel/panic_on_oops": "1",
        "vm/panic_on_oom": "0",
        "kernel/keys/root_maxkeys": "1000000",
        "kernel/keys/root_maxbytes": "25000000",
    }
    before = kube_cluster.state.host_sysctls  # read when the cluster came up
    assert sorted(before) == sorted([*kubelet, "net/ipv4/ip_forward"])
    assert host_sysctls() == before
    private = kube_cluster.node().layout.ns / "sysctl"
    # kubelet did set them -- in the cluster's private files
    assert {key: (private / key.replace("/", ".")).read_text().strip() for key in kubelet} == kubelet
