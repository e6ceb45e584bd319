"""Mokka's node image (what the repository's Dockerfile builds) assembled without Docker, as an OCI
archive for ``ctr images import``: Debian's Python 3 of this machine (interpreter, standard library,
the shared libraries both need), Mokka's packages from this checkout with their native libraries,
the runtime dependencies' installed files (the closure of Mokka's requirements, read from the
installed distributions' metadata), busybox for ``/bin/sh``, nvidia-smi at the path the chart
expects, NVIDIA's GFD and KWOK where the chart's fleet finds them, and the repository's ``nvmlmock/`` at
``/scripts`` (run:ai fake-gpu-operator's mock backend runs the image as its nvml-mock DaemonSet)."""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement

from containers import images as oci
from gpumodel import native

NODE_IMAGE = "localhost/mokka/node:1"
PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
STDLIB = Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")
SITE = Path(f"usr/local/lib/python{sys.version_info.major}.{sys.version_info.minor}/dist-packages")
PACKAGES = (
    "gpumodel", "cdi", "hostsetup", "nri_mokka", "k8snode", "virtualfleet", "fetch", "containers", "localcluster",
    "bench", "mokka",
)  # fmt: skip
STDLIB_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "pydoc_data", "__pycache__", "config-3.11"}
SMI_PATH = Path("usr/local/lib/mokka/nvidia-smi")
GFD_PATH = Path("usr/local/bin/gpu-feature-discovery")  # the fleet controller's (`mokka fleet-controller`)
KWOK_PATH = Path("usr/local/bin/kwok")  # the chart's KWOK for the fleet's nodes
KWOK_STAGES = Path("usr/local/share/mokka/kwok")  # KWOK's stages from its module, as the Dockerfile puts them
SCRIPTS = Path("scripts")  # the repository's nvmlmock/, as the Dockerfile copies it
ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
)


class ImageError(RuntimeError):
    pass


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", requirement).lower()


def runtime_distributions(root: str = "mokka") -> list[md.Distribution]:
    """The installed distributions Mokka needs at run time (requirements and their extras, markers
    evaluated for this interpreter; test extras left out)."""
    seen: dict[str, md.Distribution] = {}
    pending: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while pending:
        name, extras = pending.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise ImageError(f"{name} is not installed in {sys.prefix}") from None
        key = _name(dist.metadata["Name"])
        if key in seen and not extras:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in sorted(extras)] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                pending.append((req.name, frozenset(req.extras)))
    seen.pop(_name(root), None)
    return list(seen.values())


def _copy_tree(src: Path, dst: Path, skipped: set[str]) -> None:
    shutil.copytree(src, dst, ignore=lambda _d, names: [n for n in names if n in skipped or n.endswith(".pyc")])


def build(
    out: Path, nvidia_smi: Path | None, cache: Path | None = None, gfd: Path | None = None, kwok: Path | None = None
) -> Path:
    """The node image's OCI archive under ``out``; with ``gfd``, NVIDIA's gpu-feature-discovery on its
    PATH (the fleet controller runs it for every pool's template); with ``kwok`` (KWOK's build
    directory: the binary and its module's stages) KWOK as the chart's fleet runs it."""
    if not PYTHON.exists() or not STDLIB.is_dir():
        raise ImageError(f"Debian's {PYTHON.name} is not installed (apt-get install python3)")
    rootfs = out / "node-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    (rootfs / "usr" / "bin").mkdir(parents=True)
    site = rootfs / SITE
    site.mkdir(parents=True)
    _copy_tree(STDLIB, rootfs / STDLIB.relative_to("/"), STDLIB_SKIPPED)
    for dist in runtime_distributions():
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            src = base / file
            if file.parts[0] == ".." or "__pycache__" in file.parts or not src.is_file():
                continue
            (site / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, site / file)
    repo = Path(native.__file__).resolve().parent.parent
    for package in PACKAGES:
        _copy_tree(repo / package, site / package, {"__pycache__", "_native"})
    # What a wheel carries in gpumodel/_native (the checkout keeps it in native/ and native/build/).
    bundled = site / "gpumodel" / "_native"
    bundled.mkdir()
    shutil.copy2(native.header_path(), bundled)
    for lib in native.library_path().parent.glob("*.so"):
        shutil.copy2(lib, bundled)
    for tool in (*native.IMEX_TOOLS, native.PROC_HOOK):
        shutil.copy2(native.library_path(tool), bundled)
    shutil.copy2(PYTHON, rootfs / PYTHON.relative_to("/"))
    (rootfs / "usr" / "bin" / "python3").symlink_to(PYTHON.name)
    scripts = rootfs / "usr" / "local" / "bin"
    scripts.mkdir(parents=True)
    (scripts / "mokka").write_text("#!/usr/bin/python3\nimport sys\nfrom mokka.cli import main\nsys.exit(main())\n")
    (scripts / "mokka").chmod(0o755)
    # FGO's mock-backend contract (its nvml-mock DaemonSet runs /scripts/entrypoint.sh, /scripts/cleanup.sh).
    shutil.copytree(
        repo / "nvmlmock", rootfs / SCRIPTS, ignore=lambda _d, names: [n for n in names if n == "__pycache__"]
    )
    if nvidia_smi is not None:
        (rootfs / SMI_PATH).parent.mkdir(parents=True)
        shutil.copy2(nvidia_smi, rootfs / SMI_PATH)
    if gfd is not None:
        shutil.copy2(gfd, rootfs / GFD_PATH)
    if kwok is not None:
        shutil.copy2(kwok / "kwok", rootfs / KWOK_PATH)
        (rootfs / KWOK_STAGES).mkdir(parents=True)
        for stage in sorted(kwok.glob("*.yaml")):
            shutil.copy2(stage, rootfs / KWOK_STAGES / stage.name)
    extensions = [p for p in rootfs.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    programs = [PYTHON, *extensions] + [p for p in (nvidia_smi, gfd) if p is not None]
    oci.make_rootfs(rootfs, programs=programs, cache=cache)
    with (rootfs / "etc" / "passwd").open("a") as fh:
        fh.write("mokka:x:10001:10001::/nonexistent:/usr/sbin/nologin\n")
    archive = oci.oci_archive(rootfs, out / "node.tar", NODE_IMAGE, cmd=["mokka", "--help"], env=ENV)
    shutil.rmtree(rootfs)
    return archive
