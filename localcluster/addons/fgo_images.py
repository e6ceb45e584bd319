"""run:ai fake-gpu-operator's (FGO) images, built without Docker from the user's FGO binaries, under
the names FGO's Helm chart pulls (``ghcr.io/run-ai/fake-gpu-operator/<target>:<tag>``), so that its own
chart runs on the local cluster.

FGO's Dockerfile builds every target on ``ubuntu``; here each image is the small root
:func:`containers.images.make_rootfs` makes (Debian's static busybox plus the glibc libraries the
binaries link against) with the target's files at the paths FGO's Dockerfile puts them and the
binary as its entrypoint (FGO's chart gives most containers no command). The chart's one stock
image (``ubuntu:24.04``, the status exporter's ``hostpath-init`` init container, which runs
``/bin/bash /hostpath-init/init.sh``) is stood in for by the same busybox root with ``/bin/bash``
running busybox's ``sh``: the script is two POSIX commands (chmod, then chcon, whose failure it
tolerates)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from containers import images as oci
from fetch import thirdparty

__all__ = ["CHART_TAG", "IMAGES", "REPOSITORY", "UBUNTU", "FgoImage", "build", "name"]

REPOSITORY = "ghcr.io/run-ai/fake-gpu-operator"
CHART_TAG = "0.0.1"  # FGO 0.2.0's chart: appVersion, the default of every image.tag
UBUNTU = "docker.io/library/ubuntu:24.04"  # values ubuntu.image (hostpath-init)


@dataclass(frozen=True)
class FgoImage:
    """A Dockerfile target: ``files`` (binary name -> path in the image), ``entrypoint`` its first."""

    target: str
    files: tuple[tuple[str, str], ...]

    @property
    def entrypoint(self) -> str:
        return self.files[0][1]


# FGO's Dockerfile targets the chart deploys (SOURCE.md's image -> binary map), for the binaries the
# user brings.
IMAGES = (
    FgoImage(
        "device-plugin",
        (
            ("device-plugin", "/bin/device-plugin"),
            ("nvidia-smi", "/bin/nvidia-smi"),
            ("preloader.so", "/shared/memory/preloader.so"),
            ("preloader.so", "/shared/pid/preloader.so"),
        ),
    ),
    FgoImage("status-updater", (("status-updater", "/bin/status-updater"),)),
    FgoImage("topology-server", (("topology-server", "/bin/topology-server"),)),
    FgoImage(
        "status-exporter",
        (
            ("status-exporter", "/usr/local/bin/status-exporter"),
            ("status-exporter-kwok", "/usr/local/bin/status-exporter-kwok"),
        ),
    ),
    FgoImage("kwok-gpu-device-plugin", (("kwok-gpu-device-plugin", "/bin/kwok-gpu-device-plugin"),)),
    FgoImage("mig-faker", (("mig-faker", "/bin/mig-faker"),)),
)
BINARIES = tuple(sorted({b for image in IMAGES for b, _ in image.files}))


def name(target: str, tag: str = CHART_TAG) -> str:
    return f"{REPOSITORY}/{target}:{tag}"


def _put(rootfs: Path, path: str, src: Path) -> None:
    # make_rootfs's /bin, /lib are links into /usr: a file at /bin/x lands in /usr/bin/x.
    rel = Path(path).relative_to("/")
    if rel.parts[0] in ("bin", "sbin", "lib", "lib64"):
        rel = Path("usr", *rel.parts)
    (rootfs / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, rootfs / rel)


def build(src: Path, out: Path, cache: Path, tag: str = CHART_TAG) -> list[Path]:
    """Every image of :data:`IMAGES` and the ubuntu stand-in as OCI archives under ``out``, from FGO's
    binaries in ``src`` (plain or ``.xz``; unpacked into ``cache``/fgo once). A missing binary raises
    :class:`fetch.thirdparty.Missing` naming it."""
    binaries = thirdparty.unpacked(src, BINARIES, cache / "fgo")
    out.mkdir(parents=True, exist_ok=True)
    archives = []
    for image in IMAGES:
        rootfs = out / f"{image.target}-rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        programs = [binaries[b] for b, _ in image.files if not b.endswith(".so")]
        oci.make_rootfs(rootfs, programs=programs, cache=cache)
        for binary, path in image.files:
            _put(rootfs, path, binaries[binary])
        archives.append(
            oci.oci_archive(
                rootfs, out / f"{image.target}.tar", name(image.target, tag), entrypoint=[image.entrypoint], cmd=()
            )
        )
        shutil.rmtree(rootfs)
    rootfs = oci.make_rootfs(out / "ubuntu-rootfs", cache=cache)
    bash = rootfs / "usr" / "bin" / "bash"
    bash.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
    bash.chmod(0o755)
    archives.append(oci.oci_archive(rootfs, out / "ubuntu.tar", UBUNTU, cmd=["/bin/bash"]))
    shutil.rmtree(rootfs)
    return archives
