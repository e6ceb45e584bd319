"""The images NVIDIA's GPU Operator runs, built without Docker under the names the shipped values
give them (:func:`~. reference`): each is the programs built from the Go module proxy or brought by
the user, with what NVIDIA's own image carries beside them that the operator's pods use, on busybox
and the host's glibc where a program links it. Nothing of NVIDIA's images is copied.

- the operator: ``gpu-operator``; its assets at ``/opt/gpu-operator``, the NVIDIADriver manifests
  at ``/opt/gpu-operator/manifests`` and the CRDs the chart's upgrade hook applies, beside them;
- the validator: ``nvidia-validator``, bash (its commands), glibc (it runs the driver root's
  nvidia-smi), the workload manifests at ``/var/nvidia/manifests``;
- NVIDIA's device plugin and GFD (one image, as NVIDIA's): both programs and bash (the operator's
  entrypoint scripts);
- dcgm-exporter (:func:`localcluster.addons.dcgm.build_image`), its counters where the operator's
  DaemonSet points the exporter;
- the MIG manager: ``nvidia-mig-manager``, ``nvidia-mig-parted`` and ``reconfigure-mig.sh`` (the
  user's, :data:`~. MIG_PARTED_ENV`), bash, kubectl and nvidia-ctk (the script's; nvidia-ctk the
  toolkit's build, as NVIDIA's image has v1.17.8), glibc (mig-parted resets GPUs whose MIG mode
  change pends with the driver root's nvidia-smi);
- NFD: master, worker and garbage collector built with NFD's ``/host-`` prefix;
- the container toolkit: its installer ``nvidia-toolkit`` at ``/work`` (the name the operator's
  entrypoint runs) and what it installs from ``/usr/bin`` (nvidia-ctk, the CDI hook, the runtimes),
  bash and glibc (nvidia-ctk loads the driver's NVML). NVIDIA's image also carries
  libnvidia-container and nvidia-container-cli (C, the legacy runtime's), which no source here
  builds: ``nvidia-toolkit`` runs the installer with its ``--ignore-errors``, so that their absence
  is logged and the rest (CDI mode) installs.

The environment each image sets is what NVIDIA's sets for the runtime (``NVIDIA_VISIBLE_DEVICES``:
which of its pods get the GPUs, the driver's library and nvidia-smi)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from containers import images as oci
from fetch.kube.gpu_operator import TOOLKIT_INSTALLED

from .. import dcgm

__all__ = ["ImageError", "Inputs", "build_all", "build_device_plugin"]

BASH = Path("/bin/bash")
NVIDIA_RUNTIME_ENV = ("NVIDIA_DISABLE_REQUIRE=true",)


class ImageError(RuntimeError):
    """An image cannot be built; the message names what is missing."""


@dataclass(frozen=True)
class Inputs:
    """Where each image's programs are: the operator's build (``operator``), NFD's image build
    (``nfd``), the device plugin and GFD at the chart's version (``device_plugin``), ``kubectl``,
    ``nvidia_smi`` (whose libraries the validator needs), the user's MIG manager (``mig_manager``:
    program name -> path), the cache (dcgm-exporter's) and NVIDIA's container toolkit's build
    (``toolkit``)."""

    operator: Path
    nfd: Path
    device_plugin: Path
    kubectl: Path
    nvidia_smi: Path
    mig_manager: dict[str, Path]
    cache: Path
    toolkit: Path

    @classmethod
    def cached(cls, cache: Path) -> Inputs:
        """Every input from the cache, as ``mokka cluster up --gpu-operator`` (or ``.ci/setup
        --tests``) built it, and the user's MIG manager."""
        from fetch import nvidia_smi
        from fetch.kube import binaries
        from fetch.kube import gpu_operator as build

        from . import mig_manager, operator

        bins, built = binaries.cached(cache), build.cached(cache)
        if bins is None or built is None:
            raise ImageError(
                f"the GPU Operator's builds are not in {cache}: `mokka cluster up --gpu-operator` makes them"
            )
        built = operator(built, cache)  # the user's own, where MOKKA_GPU_OPERATOR_DIR names it
        smi = nvidia_smi.fetch("550", cache)
        return cls(
            built.operator, built.nfd, built.device_plugin, bins["kubectl"], smi, mig_manager(cache), cache,
            built.toolkit,
        )  # fmt: skip


def _copy(src: Path, root: Path, dest: str, mode: int = 0o755) -> None:
    target = root / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)  # busybox's applet link, if any
    shutil.copyfile(src, target)
    target.chmod(mode)


def _with_bash(root: Path) -> None:
    if not BASH.is_file():
        raise ImageError(f"{BASH} is missing (apt-get install bash): the operator's pods run their scripts with bash")
    _copy(BASH, root, "/usr/bin/bash")


def _env(*extra: str) -> list[str]:
    return [oci.PATH_ENV, *extra]


def operator(inp: Inputs, root: Path) -> dict[str, Any]:
    oci.make_rootfs(root, cache=inp.cache)
    _copy(inp.operator / "gpu-operator", root, "/usr/bin/gpu-operator")
    opt = root / "opt/gpu-operator"
    shutil.copytree(inp.operator / "assets", opt, dirs_exist_ok=True)
    shutil.copytree(inp.operator / "manifests", opt / "manifests", dirs_exist_ok=True)
    chart = inp.operator / "chart"
    for crd in (
        *sorted((chart / "crds").glob("*.yaml")),
        chart / "charts/node-feature-discovery/crds/nfd-api-crds.yaml",
    ):
        _copy(crd, root, f"/opt/gpu-operator/{crd.name}", 0o644)
    _copy(inp.kubectl, root, "/usr/local/bin/kubectl")  # the chart's CRD upgrade hook runs it
    return {"entrypoint": ["/usr/bin/gpu-operator"], "env": _env("NVIDIA_VISIBLE_DEVICES=void")}


def validator(inp: Inputs, root: Path) -> dict[str, Any]:
    # glibc for the driver root's nvidia-smi, which the driver check runs with LD_PRELOAD
    oci.make_rootfs(root, programs=[BASH, inp.nvidia_smi], cache=inp.cache)
    _with_bash(root)
    _copy(inp.operator / "validator", root, "/usr/bin/nvidia-validator")
    for manifest in ("cuda-workload-validation.yaml", "plugin-workload-validation.yaml"):
        _copy(inp.operator / manifest, root, f"/var/nvidia/manifests/{manifest}", 0o644)
    env = _env("NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=utility,compute", *NVIDIA_RUNTIME_ENV)
    return {"cmd": ["/bin/bash"], "env": env}


def device_plugin(inp: Inputs, root: Path) -> dict[str, Any]:
    return _device_plugin(inp.device_plugin, root, inp.cache)


def _device_plugin(build: Path, root: Path, cache: Path) -> dict[str, Any]:
    """NVIDIA's device plugin and GFD of ``build``."""
    programs = [build / p for p in ("nvidia-device-plugin", "gpu-feature-discovery")]
    oci.make_rootfs(root, programs=[BASH, *programs], cache=cache)
    _with_bash(root)
    for program in programs:
        _copy(program, root, f"/usr/bin/{program.name}")
    env = _env("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility", *NVIDIA_RUNTIME_ENV)
    return {"cmd": ["/usr/bin/nvidia-device-plugin"], "env": env}


def mig_manager(inp: Inputs, root: Path) -> dict[str, Any]:
    ctk = inp.toolkit / "nvidia-ctk"  # with CDI the script makes the management spec with it
    programs = [inp.mig_manager["nvidia-mig-manager"], inp.mig_manager["nvidia-mig-parted"], ctk]
    # glibc for the driver's nvidia-smi too: mig-parted runs `nvidia-smi -r` when a mode change pends
    oci.make_rootfs(root, programs=[BASH, inp.nvidia_smi, *programs], cache=inp.cache)
    _with_bash(root)
    for name, path in inp.mig_manager.items():
        _copy(path, root, f"/usr/bin/{name}")
    _copy(inp.kubectl, root, "/usr/bin/kubectl")
    _copy(ctk, root, "/usr/bin/nvidia-ctk")
    env = _env(
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_MIG_CONFIG_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=utility",
        *NVIDIA_RUNTIME_ENV,
    )
    return {"entrypoint": ["/usr/bin/nvidia-mig-manager"], "env": env}


def nfd(inp: Inputs, root: Path) -> dict[str, Any]:
    oci.make_rootfs(root, cache=inp.cache)
    for program in ("nfd-master", "nfd-worker", "nfd-gc"):
        _copy(inp.nfd / program, root, f"/usr/bin/{program}")
    # nobody, as NFD's image: its chart's pods ask runAsNonRoot
    return {"cmd": ["/usr/bin/nfd-worker"], "env": _env(), "user": "65534:65534"}


TOOLKIT_RUN = """#!/bin/sh
# NVIDIA's installer. libnvidia-container and nvidia-container-cli (the legacy runtime's) are not
# built here: --ignore-errors logs their absence and installs the rest (the CDI mode's).
exec /work/nvidia-toolkit.bin --ignore-errors "$@"
"""


def toolkit(inp: Inputs, root: Path) -> dict[str, Any]:
    installer = inp.toolkit / "nvidia-toolkit"
    installed = [inp.toolkit / p for p in TOOLKIT_INSTALLED]
    oci.make_rootfs(root, programs=[BASH, installer, *installed], cache=inp.cache)
    _with_bash(root)
    _copy(installer, root, "/work/nvidia-toolkit.bin")
    for program in installed:
        _copy(program, root, f"/usr/bin/{program.name}")
    run = root / "work/nvidia-toolkit"  # the name the operator's entrypoint runs
    run.write_text(TOOLKIT_RUN)
    run.chmod(0o755)
    path = "PATH=/work:" + oci.PATH_ENV.removeprefix("PATH=")  # NVIDIA's image: /work first
    env = [path, "NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=utility", *NVIDIA_RUNTIME_ENV]
    return {"entrypoint": ["/work/nvidia-toolkit"], "env": env}


# values key (as in the chart's values) -> how its image's root is made
BUILDERS: dict[str, Callable[[Inputs, Path], dict[str, Any]]] = {
    "operator": operator,
    "validator": validator,
    "devicePlugin": device_plugin,
    "migManager": mig_manager,
    "node-feature-discovery": nfd,
    "toolkit": toolkit,
}


def _archive(out: Path, stem: str, name: str, make: Callable[[Path], dict[str, Any]]) -> Path:
    """The OCI archive ``out/<stem>.tar`` named ``name`` of the root ``make`` fills (and configures)."""
    root = out / f"{stem}-rootfs"
    shutil.rmtree(root, ignore_errors=True)
    config = make(root)
    archive = oci.oci_archive(root, out / f"{stem}.tar", name, **config)
    shutil.rmtree(root)
    return archive


def build_device_plugin(build: Path, name: str, out: Path, cache: Path) -> Path:
    """The device plugin's and GFD's image of another build (an operand upgrade), named ``name``."""
    return _archive(out, "devicePlugin-upgrade", name, lambda root: _device_plugin(build, root, cache))


def build_all(inp: Inputs, names: dict[str, str], out: Path) -> Iterator[Path]:
    """Each image's OCI archive under ``out`` (yielded one at a time: the caller imports it and
    removes it); ``names``: values key -> image reference. ``gfd`` shares the device plugin's
    image, as NVIDIA's; ``dcgmExporter`` is dcgm-exporter's image."""
    for key, make in BUILDERS.items():
        yield _archive(out, key, names[key], partial(make, inp))
    try:
        yield dcgm.build_image(out, inp.cache, names["dcgmExporter"], collectors=dcgm.OPERATOR_COLLECTORS)
    except dcgm.ExporterUnavailable as exc:
        raise ImageError(f"dcgm-exporter: {exc}") from None
