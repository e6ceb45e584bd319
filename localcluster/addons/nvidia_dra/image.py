"""NVIDIA's DRA driver image, built without Docker from the user's binaries, under the name NVIDIA's
chart gives it (``<image.repository>:v<appVersion>`` of the chart beside the binaries): the
controller, both kubelet plugins and the compute-domain daemon on the PATH, ``nvidia-cdi-hook``
at ``/usr/bin`` (where the GPU plugin takes it from), bash for the chart's commands, glibc, and
Mokka's own files for what NVIDIA's image carries beside its programs (``rootfs/``): the
controller's and the compute-domain plugin's ``/templates`` and the plugins' start check
``/usr/bin/kubelet-plugin-prestart.sh``. The same image runs the chart's pods and the
ComputeDomain daemons the controller creates."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from containers import images as oci

ROOTFS = Path(__file__).resolve().parent / "rootfs"
BASH = Path("/bin/bash")
PROGRAMS = ("gpu-kubelet-plugin", "compute-domain-kubelet-plugin", "compute-domain-controller", "compute-domain-daemon")


class ImageError(RuntimeError):
    """The image cannot be built; the message says what is missing."""


def name(chart: Path) -> str:
    """The image NVIDIA's chart at ``chart`` runs by default (its values' repository and tag, the
    tag defaulting to ``v<appVersion>``)."""
    try:
        values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
        meta = yaml.safe_load((chart / "Chart.yaml").read_text()) or {}
        image = values["image"]
        return f"{image['repository']}:{image.get('tag') or 'v' + str(meta['appVersion'])}"
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ImageError(f"{chart}: cannot read the image name from NVIDIA's chart ({exc})") from None


def build(out: Path, programs: dict[str, Path], hook: Path, chart: Path, cache: Path) -> Path:
    """The image's OCI archive ``out/nvidia-dra-driver.tar``; ``programs``: NVIDIA's binaries by
    name (every one of :data:`PROGRAMS`), ``hook``: nvidia-cdi-hook."""
    missing = [p for p in PROGRAMS if p not in programs]
    if missing:
        raise ImageError(f"NVIDIA's {', '.join(missing)} not given")
    if not BASH.is_file():
        raise ImageError(f"{BASH} is missing (apt-get install bash): NVIDIA's chart runs its plugins with bash")
    root = out / "nvidia-dra-driver-rootfs"
    shutil.rmtree(root, ignore_errors=True)
    oci.make_rootfs(root, programs=[*programs.values(), hook, BASH], cache=cache)
    for prog, path in programs.items():
        shutil.copy2(path, root / "usr/bin" / prog)
    shutil.copy2(hook, root / "usr/bin/nvidia-cdi-hook")
    (root / "usr/bin/bash").unlink(missing_ok=True)  # busybox's applet link, if any: the real bash instead
    shutil.copy2(BASH, root / "usr/bin/bash")
    shutil.copytree(ROOTFS, root, dirs_exist_ok=True)
    archive = oci.oci_archive(root, out / "nvidia-dra-driver.tar", name(chart), cmd=["/bin/bash"])
    shutil.rmtree(root)
    return archive
