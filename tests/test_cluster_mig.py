"""MIG on a real kubelet: NVIDIA's device plugin and GPU Feature Discovery v0.18.0 against a mock
node whose profile declares a MIG layout, with --mig-strategy mixed and single.

Mixed: two H100s, GPU 0 split into 3g.40gb + 2g.20gb + 2 x 1g.10gb, GPU 1 whole. The plugin
advertises nvidia.com/mig-3g.40gb etc. beside nvidia.com/gpu, GFD labels each MIG profile, and a
pod given one nvidia.com/mig-3g.40gb sees its parent GPU with that MIG device alone.
Single: two H100s, each split into 2 x 3g.40gb: four nvidia.com/gpu, labelled as MIG 3g.40gb.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import pod_manifest, run_pod, start_cluster
from mig_fixtures import mig_profile_data, write_profile

from gpumodel import mig_state, profile
from localcluster.cluster import Cluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

MIXED = mig_profile_data(
    "h100",
    2,
    {1: {"mig": {"mode": False, "instances": []}}},
    mode=True,
    instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}, {"profile": "1g.10gb"}, {"profile": "1g.10gb"}],
)
SINGLE = mig_profile_data("h100", 2, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "3g.40gb"}])
SMI = "nvidia-smi -L; echo visible: $NVIDIA_VISIBLE_DEVICES"
MIG_LINE = re.compile(r"^  MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f-]+)\)$")
D = "nvidia.com"


def cluster_with(
    tmp: Path, data: dict[str, Any], strategy: str, **options: Any
) -> Iterator[tuple[Cluster, Any, list[mig_state.GpuMig]]]:
    from kubernetes import client

    source = write_profile(tmp / "profile.yaml", data)
    with start_cluster(tmp / "kube", profile=str(source), mig_strategy=strategy, **options) as cluster:
        core = client.CoreV1Api(cluster.api())
        layout = mig_state.read(cluster.node().layout.node_root / "driver" / "usr" / "lib64" / "libnvidia-ml.so.1")
        yield cluster, core, layout


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Any, list[mig_state.GpuMig]]]:
    yield from cluster_with(tmp_path_factory.mktemp("mig-mixed"), MIXED, "mixed")


def labels(core: Any) -> dict[str, str]:
    return {k: v for k, v in core.read_node("localhost").metadata.labels.items() if k.startswith(f"{D}/")}


def allocatable(core: Any) -> dict[str, str]:
    return {k: v for k, v in core.read_node("localhost").status.allocatable.items() if k.startswith(f"{D}/")}


def test_mixed_resources(mixed: tuple[Cluster, Any, list[mig_state.GpuMig]]) -> None:
    _, core, _ = mixed
    assert allocatable(core) == {
        f"{D}/gpu": "1",
        f"{D}/mig-3g.40gb": "1",
        f"{D}/mig-2g.20gb": "1",
        f"{D}/mig-1g.10gb": "2",
    }


def test_mixed_labels_as_on_real_hardware(mixed: tuple[Cluster, Any, list[mig_state.GpuMig]]) -> None:
    """GFD's per-profile labels (NVIDIA's GPU Operator documents the H100's: 1g.10gb with 9984 MiB
    and 16 SMs, 2g.20gb with 20096 MiB)."""
    _, core, _ = mixed
    got = labels(core)
    assert got[f"{D}/mig.strategy"] == "mixed" and got[f"{D}/mig.capable"] == "true"
    want = {
        "3g.40gb": {"count": "1", "memory": "40448", "multiprocessors": "60", "slices.gi": "3", "slices.ci": "3"},
        "2g.20gb": {"count": "1", "memory": "20096", "multiprocessors": "32", "slices.gi": "2", "engines.copy": "2"},
        "1g.10gb": {"count": "2", "memory": "9984", "multiprocessors": "16", "engines.jpeg": "1", "engines.ofa": "0"},
    }
    for name, values in want.items():
        for key, value in values.items():
            assert got[f"{D}/mig-{name}.{key}"] == value, (name, key)
        assert got[f"{D}/mig-{name}.product"] == f"NVIDIA-H100-80GB-HBM3-MIG-{name}"
        assert got[f"{D}/mig-{name}.replicas"] == "1"
    assert got[f"{D}/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_a_pod_gets_one_slice_and_sees_it_alone(mixed: tuple[Cluster, Any, list[mig_state.GpuMig]]) -> None:
    _, core, layout = mixed
    manifest = pod_manifest("mig-3g", ["sh", "-c", SMI])
    manifest["spec"]["containers"][0]["resources"] = {"limits": {f"{D}/mig-3g.40gb": "1"}}
    res = run_pod(core, manifest)
    assert res.phase == "Succeeded", res.logs
    slice_3g = next(d for d in layout[0].devices if d.profile == "3g.40gb")
    assert f"visible: {slice_3g.uuid}" in res.logs, res.logs  # the device plugin's allocation (uuid ids)
    lines = res.logs.splitlines()
    assert lines[0] == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {layout[0].uuid})", res.logs
    migs = [m.groups() for m in map(MIG_LINE.match, lines) if m]
    assert migs == [("3g.40gb", "0", slice_3g.uuid)], res.logs


@pytest.fixture(scope="module")
def mixed_cdi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Any, list[mig_state.GpuMig]]]:
    yield from cluster_with(tmp_path_factory.mktemp("mig-cdi"), MIXED, "mixed", device_list_strategy="cdi-cri")


def test_a_slice_through_the_device_plugins_cdi_spec(mixed_cdi: tuple[Cluster, Any, list[mig_state.GpuMig]]) -> None:
    """The device plugin in CDI mode writes its own spec (NVIDIA's nvcdi) for MIG devices: the
    parent's node and the two capability nodes from mig-minors; the container sees its slice."""
    _, core, layout = mixed_cdi
    manifest = pod_manifest("mig-1g-cdi", ["sh", "-c", SMI + "; ls /dev/nvidia-caps"])
    manifest["spec"]["containers"][0]["resources"] = {"limits": {f"{D}/mig-1g.10gb": "1"}}
    res = run_pod(core, manifest)
    assert res.phase == "Succeeded", res.logs
    migs = [m.groups() for m in map(MIG_LINE.match, res.logs.splitlines()) if m]
    assert len(migs) == 1 and migs[0][:2] == ("1g.10gb", "0"), res.logs
    given = next(d for d in layout[0].devices if d.uuid == migs[0][2])
    assert f"nvidia-cap{given.gi_cap_minor}" in res.logs and f"nvidia-cap{given.ci_cap_minor}" in res.logs


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Any, list[mig_state.GpuMig]]]:
    yield from cluster_with(tmp_path_factory.mktemp("mig-single"), SINGLE, "single")


def test_single_strategy(single: tuple[Cluster, Any, list[mig_state.GpuMig]]) -> None:
    _, core, layout = single
    assert allocatable(core) == {f"{D}/gpu": "4"}
    got = labels(core)
    expected = {
        "mig.strategy": "single",
        "gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
        "gpu.count": "4",
        "gpu.replicas": "1",
        "gpu.memory": "40448",
        "gpu.multiprocessors": "60",
        "gpu.slices.gi": "3",
        "gpu.slices.ci": "3",
        "gpu.engines.copy": "3",
        "gpu.engines.decoder": "3",
        "gpu.engines.jpeg": "3",
    }
    assert {k: got.get(f"{D}/{k}") for k in expected} == expected
    res = run_pod(core, pod_manifest("mig-single", ["sh", "-c", SMI], gpus=1))
    assert res.phase == "Succeeded", res.logs
    migs = [m.groups() for m in map(MIG_LINE.match, res.logs.splitlines()) if m]
    assert len(migs) == 1 and migs[0][:2] == ("3g.40gb", "0"), res.logs
    assert migs[0][2] in {d.uuid for g in layout for d in g.devices}


def test_profile_is_a_valid_profile() -> None:
    for data in (MIXED, SINGLE):
        assert profile.Profile.model_validate(data).gpu_count == 2
