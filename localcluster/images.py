"""The cluster's images, built without a registry or Docker and imported with ``ctr``: the pause
image (static busybox sleeping) and the workload image (busybox plus the glibc libraries
nvidia-smi needs — nothing NVIDIA inside: the GPU stack injects that)."""

from __future__ import annotations

import shutil
from pathlib import Path

from containers import images as oci
from gpumodel.native import library_path

from .config import PAUSE_IMAGE

WORKLOAD_IMAGE = "localhost/mokka/workload:1"


def build(out: Path, nvidia_smi: Path, cache: Path | None = None) -> list[Path]:
    """Write the pause and workload OCI archives under ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    pause_root = oci.make_rootfs(out / "pause-rootfs", cache=cache)
    pause = oci.oci_archive(pause_root, out / "pause.tar", PAUSE_IMAGE, cmd=["sleep", "2147483647"])
    workload_root = oci.make_rootfs(out / "workload-rootfs", programs=[nvidia_smi, library_path()], cache=cache)
    workload = oci.oci_archive(workload_root, out / "workload.tar", WORKLOAD_IMAGE)
    shutil.rmtree(pause_root)
    shutil.rmtree(workload_root)
    return [pause, workload]
