"""The NRI decision on a node with MIG: GPUs with MIG on are handed out as their MIG devices, by
the same names CDI uses, whichever way a container asks; and the plugin end to end on a real
containerd, a container annotated with one MIG device seeing just that one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from mig_fixtures import mig_profile_data, write_profile
from test_mig_containers import LAYOUT, PROBE, listed

from cdi import spec as cdi_spec
from gpumodel import edits, mig_state, nodelayout, profile, state
from nri_mokka.decision import Config, Container, decide


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[nodelayout.NodeLayout, list[mig_state.GpuMig]]:
    tmp = tmp_path_factory.mktemp("nri-mig")
    data = mig_profile_data("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=LAYOUT)
    prof = profile.load(write_profile(tmp / "p.yaml", data))
    devices = prof.devices()
    layout = nodelayout.NodeLayout(
        root="/var/lib/mokka",
        profile=prof.name,
        driver_version="550.163.01",
        libdir="/var/lib/mokka/driver/usr/lib64",
        state="/var/lib/mokka/driver/usr/lib64/libnvidia-ml.so.550.163.01",
        dev_root="/var/lib/mokka/dev",
        gpu_major=195,
        uvm_major=510,
        gpus=tuple(nodelayout.GpuNode(d.index, d.uuid, d.bus_id, d.index) for d in devices),
        caps_major=509,
    )
    return layout, mig_state.read_region(state.compile_profile(prof))


def ctr(**kw: object) -> Container:
    base: dict[str, object] = {"name": "app", "pod_name": "pod", "pod_namespace": "default"}
    base.update(kw)
    return Container(**base)  # type: ignore[arg-type]


def test_all_means_mig_devices_and_gpus_without_mig(node: tuple[nodelayout.NodeLayout, list[mig_state.GpuMig]]) -> None:
    layout, mig = node
    d = decide(ctr(), layout, Config(), mig)
    slices = mig[0].devices
    assert [g.index for g in d.gpus] == [1] and d.mig_devices == slices
    assert d.edits is not None and d.edits == edits.container_edits(layout, [layout.gpus[1]], slices)
    # what CDI's "all" device carries
    spec = cdi_spec.render(layout, mig=mig)
    assert set(cdi_spec.resolve(spec, ["all"]).device_nodes) == set(d.edits.device_nodes)


@pytest.mark.parametrize("name", ["0:1", "uuid"])
def test_annotation_names_one_mig_device(node: tuple[nodelayout.NodeLayout, list[mig_state.GpuMig]], name: str) -> None:
    layout, mig = node
    want = mig[0].devices[1]
    key = want.uuid if name == "uuid" else name
    d = decide(ctr(pod_annotations={"mokka.io/gpus": key}), layout, Config(cdi_devices=True), mig)
    assert d.gpus == () and d.mig_devices == (want,) and d.error is None
    assert d.edits is not None
    assert d.edits.env_dict()["NVIDIA_VISIBLE_DEVICES"] == want.uuid
    nodes = [n.path for n in d.edits.device_nodes][:3]
    assert nodes == [
        "/dev/nvidia0",
        f"/dev/nvidia-caps/nvidia-cap{want.gi_cap_minor}",
        f"/dev/nvidia-caps/nvidia-cap{want.ci_cap_minor}",
    ]
    assert d.cdi_devices == ("nvidia.com/gpu=0:1",)
    assert "GPUs 0:1 " in d.summary(ctr())


def test_a_device_plugin_allocation_of_mig_uuids_is_honoured(
    node: tuple[nodelayout.NodeLayout, list[mig_state.GpuMig]],
) -> None:
    """NVIDIA's device plugin (envvar strategy) sets NVIDIA_VISIBLE_DEVICES=MIG-<uuid>: the
    container keeps it and gets the driver, not a refusal."""
    layout, mig = node
    want = mig[0].devices[3]
    d = decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": want.uuid}), layout, Config(), mig)
    assert d.error is None and d.mig_devices == (want,) and d.edits is not None
    assert d.edits.device_nodes == () and "NVIDIA_VISIBLE_DEVICES" not in d.edits.env_dict()


def test_unknown_mig_names_are_refused(node: tuple[nodelayout.NodeLayout, list[mig_state.GpuMig]]) -> None:
    layout, mig = node
    d = decide(ctr(pod_annotations={"mokka.io/gpus": "0:7"}), layout, Config(), mig)
    assert d.error is not None and "'0:7'" in d.error
    gone = "MIG-00000000-0000-5000-8000-000000000000"
    assert decide(ctr(env={"NVIDIA_VISIBLE_DEVICES": gone}), layout, Config(), mig).error is not None


# ---- end to end: the plugin on a real containerd ------------------------------------------------


@pytest.fixture(scope="module")
def mig_node_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root (private containerd, device nodes, mounts)")
    from fetch import nvidia_smi
    from hostsetup import node as hostnode

    tmp = tmp_path_factory.mktemp("nri-mig-node")
    data = mig_profile_data("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=LAYOUT)
    prof = profile.load(write_profile(tmp / "p.yaml", data))
    root = tmp / "root"
    hostnode.apply(hostnode.plan(prof, hostnode.Options(root=root, nvidia_smi=nvidia_smi.fetch("550"))))
    yield root
    hostnode.cleanup(root)


@pytest.mark.consumers
@pytest.mark.slow
@pytest.mark.root
def test_plugin_injects_one_mig_device(mig_node_root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from containers import cleanup, images, sandbox
    from containers.plugin_process import PluginProcess
    from fetch import nvidia_smi

    layout = nodelayout.NodeLayout.load(mig_node_root)
    want = mig_state.read(Path(layout.state))[0].devices[2]
    needs = [nvidia_smi.fetch("550"), Path(layout.library)]
    rootfs = images.make_rootfs(tmp_path_factory.mktemp("workload") / "rootfs", programs=needs)
    image = images.oci_archive(rootfs, tmp_path_factory.mktemp("images") / "w.tar", images.WORKLOAD_IMAGE)
    base = tmp_path_factory.mktemp("sb")
    shutil.rmtree(base)
    with sandbox.Sandbox(base, "2.1", nri=True) as box:
        box.import_image(image)
        plugin = PluginProcess(box.nri_socket, mig_node_root)
        try:
            plugin.wait_registered()
            pod = box.run_pod("mig-nri", annotations={"mokka.io/gpus": "0:2"})
            res = box.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], name="slice")
        finally:
            plugin.stop()
    assert res.exit_code == 0, res.logs
    assert listed(res.logs) == [
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {layout.gpus[0].uuid})",
        f"  MIG {want.profile:<12}Device  0: (UUID: {want.uuid})",
    ], res.logs
    assert cleanup.leftovers(base) == []


def test_the_plugin_reads_the_layout_through_nvml(stage_mig: object) -> None:
    """What the plugin process sees of the MIG layout (through the node's library, with no cffi)
    equals what the state holds, also right after a change made by another process."""
    from conftest import Staged

    from nri_mokka.mig_view import MigView

    assert callable(stage_mig)
    staged: Staged = stage_mig(
        "h100", 2, overrides={1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=LAYOUT
    )
    library = staged.root.libdir / f"libnvidia-ml.so.{staged.profile.driver.version}"
    view = MigView(library, library)
    try:
        assert view.current() == mig_state.read(library)
        staged.python(
            "import pynvml as N\nN.nvmlInit()\nh = N.nvmlDeviceGetHandleByIndex(0)\n"
            "gi = N.nvmlDeviceGetGpuInstanceById(h, 9)\n"
            "N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))\n"
        )
        after = view.current()
        assert after == mig_state.read(library) and len(after[0].devices) == 3
    finally:
        view.close()
