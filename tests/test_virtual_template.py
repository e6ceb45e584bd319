"""virtualfleet.template: a pool's facts from NVIDIA's GFD run once on the profile staged as a mock
node (in a mount namespace showing the staged sysfs at /sys), and from NVML; nothing left behind.
Root and the GFD build of the local cluster's binaries (``.ci/setup --tests``) are needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fetch.kube import binaries
from gpumodel import profile
from k8snode import deviceplugin
from virtualfleet import template

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (device nodes, a mount namespace)"),
]


@pytest.fixture(scope="module")
def gfd() -> Path:
    bins = binaries.cached()
    if bins is None:
        pytest.skip("no GFD build (python -m fetch.kube.binaries)")
    return bins["gpu-feature-discovery"]


def test_gfd_labels_the_staged_profile_as_its_real_node(gfd: Path, tmp_path: Path) -> None:
    prof = profile.load("h100").with_count(4)
    made = template.compute(prof, "h100-4", gfd, tmp_path / "work", "none")
    labels = made.labels
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == prof.gpu.name.replace(" ", "-")
    # Read by GFD from /sys (raw system calls): only the namespace's view gives them.
    assert labels["nvidia.com/gpu.machine"] == f"Mokka-4x-{prof.gpu.name.replace(' ', '-')}"
    assert labels["nvidia.com/gpu.mode"] == "compute"
    assert not made.racked and "nvidia.com/gpu.clique" not in labels
    assert made.per_gpu == deviceplugin.allocatable_by_gpu(prof, "none")
    assert [d["name"] for d in made.devices] == [f"gpu-{i}" for i in range(4)]
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["gfd.log"]  # the staged node is gone


def test_a_racked_board_gets_a_clique_and_nfd_labels_when_asked(gfd: Path, tmp_path: Path) -> None:
    made = template.compute(profile.load("gb200"), "gb200", gfd, tmp_path, "none", with_nfd=True)
    assert made.racked
    assert made.labels["nvidia.com/gpu.clique"].count(".") == 1
    assert any(k.startswith("feature.node.kubernetes.io/pci-10de") for k in made.labels)


def test_a_gfd_that_fails_is_named_in_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "gpu-feature-discovery"
    broken.write_text("#!/bin/sh\necho 'cannot label' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(template.TemplateError) as err:
        template.compute(profile.load("t4"), "t4", broken, tmp_path / "work", "none")
    assert str(err.value) == "pool t4: gpu-feature-discovery exited 3: cannot label"
    assert not (tmp_path / "work" / "node").exists()
