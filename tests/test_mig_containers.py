"""MIG devices in containers: CDI specs from `mokka cdi generate` (named as NVIDIA's
nvidia-ctk names them) through a real containerd, and NVIDIA_VISIBLE_DEVICES' MIG forms.

Host setup stages two H100s, GPU 0 with MIG on (3g.40gb, a 2g.20gb split into two 1c compute
instances, 1g.10gb), GPU 1 without, and Debian's nvidia-smi 550. A container given one MIG
device sees its parent GPU with that MIG device alone, numbered 0."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mig_fixtures import mig_profile_data, write_profile
from test_e2e_cdi import device_nodes, sections

import cdi
from containers import cleanup, images, sandbox
from fetch import nvidia_smi
from gpumodel import mig_state, nodelayout, profile
from hostsetup import node

pytestmark = [pytest.mark.consumers, pytest.mark.slow, pytest.mark.root]

PROBE = "echo '--- smi'; nvidia-smi -L; echo \"exit $?\"; echo '--- dev'; ls -l /dev /dev/nvidia-caps"
LAYOUT = [
    {"profile": "3g.40gb"},
    {"profile": "2g.20gb", "compute": ["1c.2g.20gb", "1c.2g.20gb"]},
    {"profile": "1g.10gb"},
]


@pytest.fixture(scope="module")
def mig_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nodelayout.NodeLayout]:
    if os.geteuid() != 0:
        pytest.skip("needs root (private containerd, device nodes, mounts)")
    tmp = tmp_path_factory.mktemp("mig-node")
    data = mig_profile_data("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=LAYOUT)
    prof = profile.load(write_profile(tmp / "profile.yaml", data))
    root = tmp / "root"
    node.apply(node.plan(prof, node.Options(root=root, nvidia_smi=nvidia_smi.fetch("550"))))
    yield nodelayout.NodeLayout.load(root)
    node.cleanup(root)


@pytest.fixture(scope="module")
def devices(mig_node: nodelayout.NodeLayout) -> list[mig_state.MigDevice]:
    return [d for g in mig_state.read(Path(mig_node.state)) for d in g.devices]


@pytest.fixture(scope="module")
def spec(mig_node: nodelayout.NodeLayout) -> dict[str, object]:
    return cdi.render(mig_node, mig=mig_state.read(Path(mig_node.state)))


def test_spec_names_mig_devices_as_nvidia_ctk_does(
    spec: dict[str, object], devices: list[mig_state.MigDevice], mig_node: nodelayout.NodeLayout
) -> None:
    names = [d["name"] for d in spec["devices"]]  # type: ignore[attr-defined]
    gpu1 = mig_node.gpus[1]
    assert names == ["0:0", "0:1", "0:2", "0:3", "1", *(d.uuid for d in devices), gpu1.uuid, "all"]
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}  # type: ignore[attr-defined]
    second = devices[1]  # 1c.2g.20gb, GI 3 CI 0
    assert [n["path"] for n in by_name["0:1"]] == [
        "/dev/nvidia0",
        f"/dev/nvidia-caps/nvidia-cap{second.gi_cap_minor}",
        f"/dev/nvidia-caps/nvidia-cap{second.ci_cap_minor}",
    ]
    assert by_name[second.uuid] == by_name["0:1"]
    assert {n["path"] for n in by_name["all"]} >= {"/dev/nvidia0", "/dev/nvidia1"}


def test_the_cli_follows_the_layout_as_it_stands(tmp_path: Path) -> None:
    """`mokka cdi generate` reads the live layout: MIG devices created or destroyed through NVML
    appear in, or leave, the next spec."""
    data = mig_profile_data("h100", 1, mode=True, instances=LAYOUT)
    root = tmp_path / "root"
    node.apply(node.plan(profile.load(write_profile(tmp_path / "p.yaml", data)), node.Options(root=root)))
    try:
        layout = nodelayout.NodeLayout.load(root)
        out = tmp_path / "cdi"
        generate = [sys.executable, "-m", "mokka.cli", "cdi", "generate", "--root", str(root), "--output", str(out)]

        def names() -> list[str]:
            res = subprocess.run(generate, capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
            return [d["name"] for d in json.loads((out / "nvidia.com-gpu.json").read_text())["devices"]]

        assert names()[:5] == ["0:0", "0:1", "0:2", "0:3", devices_of(layout)[0]]
        destroy = """
import pynvml as N
N.nvmlInit()
gi = N.nvmlDeviceGetGpuInstanceById(N.nvmlDeviceGetHandleByIndex(0), 3)
for ci in (0, 1):
    N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, ci))
"""
        env = {"LD_LIBRARY_PATH": layout.libdir, "PATH": os.environ["PATH"]}
        subprocess.run([sys.executable, "-c", destroy], env=env, check=True)
        assert names() == ["0:0", "0:1", *devices_of(layout), "all"]
    finally:
        node.cleanup(root)


def devices_of(layout: nodelayout.NodeLayout) -> list[str]:
    return [d.uuid for g in mig_state.read(Path(layout.state)) for d in g.devices]


@pytest.fixture(params=["1.7", "2.1"], ids=["containerd-1.7", "containerd-2.1"])
def containerd(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    spec: dict[str, object],
    mig_node: nodelayout.NodeLayout,
) -> Iterator[sandbox.Sandbox]:
    spec_path = cdi.write(spec, tmp_path_factory.mktemp("cdi"))
    needs = [nvidia_smi.fetch("550"), Path(mig_node.library)]
    rootfs = images.make_rootfs(tmp_path_factory.mktemp("workload") / "rootfs", programs=needs)
    image = images.oci_archive(rootfs, tmp_path_factory.mktemp("images") / "workload.tar", images.WORKLOAD_IMAGE)
    base = tmp_path_factory.mktemp("sb")
    shutil.rmtree(base)
    box = sandbox.Sandbox(base, request.param, cdi_dirs=[spec_path.parent])
    with box:
        box.import_image(image)
        yield box
    assert cleanup.leftovers(base) == []


def listed(output: str) -> list[str]:
    return [ln for ln in sections(output)["smi"] if ln.startswith(("GPU ", "  MIG "))]


def test_a_container_sees_only_its_slice(
    containerd: sandbox.Sandbox, mig_node: nodelayout.NodeLayout, devices: list[mig_state.MigDevice]
) -> None:
    parent = mig_node.gpus[0]
    gpu_line = f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {parent.uuid})"
    pod = containerd.run_pod("mig-slices")
    for k, name in enumerate(["0:1", devices[3].uuid]):
        want = devices[1] if name == "0:1" else devices[3]
        res = containerd.run_container(
            pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], name=f"slice{k}", cdi_devices=[f"nvidia.com/gpu={name}"]
        )
        assert res.exit_code == 0, res.logs
        assert listed(res.logs) == [gpu_line, f"  MIG {want.profile:<12}Device  0: (UUID: {want.uuid})"], res.logs
        nodes = device_nodes(sections(res.logs)["dev"])
        caps = sorted(n for n in nodes if n.startswith("nvidia-cap"))
        assert caps == sorted([f"nvidia-cap{want.gi_cap_minor}", f"nvidia-cap{want.ci_cap_minor}"]), res.logs
        assert nodes[caps[0]][0] == mig_node.caps_major
        assert sorted(n for n in nodes if re.fullmatch(r"nvidia\d+", n)) == ["nvidia0"]


def test_visible_devices_forms_inside_a_container(
    containerd: sandbox.Sandbox, mig_node: nodelayout.NodeLayout, devices: list[mig_state.MigDevice]
) -> None:
    """Given every device (`all`), NVIDIA_VISIBLE_DEVICES=MIG-<uuid> or <gpu>:<mig> narrows the
    view to that MIG device, as a runtime's variable does on a real node."""
    pod = containerd.run_pod("mig-env")
    everything = containerd.run_container(
        pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], name="all", cdi_devices=["nvidia.com/gpu=all"]
    )
    assert len([ln for ln in listed(everything.logs) if ln.startswith("  MIG")]) == 4, everything.logs
    assert len([ln for ln in listed(everything.logs) if ln.startswith("GPU")]) == 2, everything.logs
    for k, value in enumerate([devices[2].uuid, "0:2"]):
        res = containerd.run_container(
            pod,
            images.WORKLOAD_IMAGE,
            ["sh", "-c", PROBE],
            name=f"env{k}",
            cdi_devices=["nvidia.com/gpu=all"],
            env={"NVIDIA_VISIBLE_DEVICES": value},
        )
        assert res.exit_code == 0, res.logs
        assert listed(res.logs) == [
            f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {mig_node.gpus[0].uuid})",
            f"  MIG {devices[2].profile:<12}Device  0: (UUID: {devices[2].uuid})",
        ], res.logs


def test_cdi_generate_without_a_readable_layout_is_one_line(tmp_path: Path) -> None:
    """A MIG-capable node whose library (the layout's carrier) is gone: one error line, no spec."""
    data = mig_profile_data("h100", 1, mode=True, instances=LAYOUT)
    root = tmp_path / "root"
    node.apply(node.plan(profile.load(write_profile(tmp_path / "p.yaml", data)), node.Options(root=root)))
    try:
        layout = nodelayout.NodeLayout.load(root)
        Path(layout.state).rename(tmp_path / "moved")
        out = tmp_path / "cdi"
        res = subprocess.run(
            [sys.executable, "-m", "mokka.cli", "cdi", "generate", "--root", str(root), "--output", str(out)],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 1 and not out.exists()
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
        assert res.stderr.startswith(f"mokka: error: cannot read the MIG layout from {layout.state}: ")
        (tmp_path / "moved").rename(layout.state)
    finally:
        node.cleanup(root)


def test_names_and_nodes_equal_nvidia_ctks(mig_node: nodelayout.NodeLayout, spec: dict[str, object]) -> None:
    """NVIDIA's own `nvidia-ctk cdi generate` (v1.18.0, the toolkit the device plugin pins) on the
    same staged node, reading NVML and mig-minors as on a real one: the same device names, and
    for each the same device nodes."""
    from fetch.kube import binaries

    found = binaries.cached() or binaries.ensure()
    root = Path(mig_node.root)
    script = (
        "mount -t tmpfs none /proc/driver && mkdir /proc/driver/nvidia-caps && "
        f"mount --bind {root}/proc/driver/nvidia-caps /proc/driver/nvidia-caps && "
        f'exec "{found["nvidia-ctk"]}" cdi generate --mode=nvml --driver-root={root}/driver --dev-root={root} '
        "--nvidia-cdi-hook-path=/usr/bin/nvidia-cdi-hook --format=json"
    )
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": mig_node.libdir}
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-2000:]
    theirs = {
        d["name"]: sorted(n["path"] for n in d["containerEdits"]["deviceNodes"])
        for d in json.loads(res.stdout)["devices"]
    }
    ours = {
        d["name"]: sorted(n["path"] for n in d["containerEdits"]["deviceNodes"])  # type: ignore[index]
        for d in spec["devices"]  # type: ignore[attr-defined]
    }
    assert ours == theirs
