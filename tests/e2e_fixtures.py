"""Fixtures shared by the end-to-end tests: a staged mock node and a workload image."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from containers import images
from fetch import nvidia_smi
from gpumodel import nodelayout, profile
from hostsetup import node

PROFILE = "h100"


@pytest.fixture(scope="module")
def smi550() -> Path:
    try:
        return nvidia_smi.fetch("550")
    except Exception as exc:
        pytest.fail(f"cannot get Debian's nvidia-smi 550: {exc}")


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory, smi550: Path) -> Iterator[nodelayout.NodeLayout]:
    """Host setup of the h100 profile under a temporary root, undone afterwards."""
    root = tmp_path_factory.mktemp("node")
    node.apply(node.plan(profile.load(PROFILE), node.Options(root=root, nvidia_smi=smi550)))
    yield nodelayout.NodeLayout.load(root)
    node.cleanup(root)
    assert not root.exists() or not any(root.iterdir())


@pytest.fixture(scope="module")
def workload_rootfs(tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, smi550: Path) -> Path:
    """busybox plus the glibc libraries nvidia-smi and the mock need; nothing NVIDIA inside."""
    needs = [smi550, Path(layout.library)] + ([Path(layout.sysfs_shim)] if layout.sysfs_shim else [])
    rootfs = images.make_rootfs(tmp_path_factory.mktemp("workload") / "rootfs", programs=needs)
    assert not [p for p in rootfs.rglob("*") if "nvidia" in p.name.lower()]
    return rootfs


@pytest.fixture(scope="module")
def workload_image(tmp_path_factory: pytest.TempPathFactory, workload_rootfs: Path) -> Path:
    return images.oci_archive(
        workload_rootfs, tmp_path_factory.mktemp("images") / "workload.tar", images.WORKLOAD_IMAGE
    )
