"""`pip install` of the package alone, as a user would: a wheel built from a clean clone, installed
into a fresh venv outside the checkout, gives a `mokka` whose driver root, demo and cluster work
as they do from .ci/setup (the native libraries and data files are in the wheel; what is
generated on first use is generated with the package's own dependencies)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fetch import nvidia_smi, protoc

REPO = Path(__file__).resolve().parent.parent
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root")}
if "MOKKA_CACHE" in os.environ:
    ENV["MOKKA_CACHE"] = os.environ["MOKKA_CACHE"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a clean clone of this checkout's HEAD (with the working tree's changes)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    subprocess.run(["git", "clone", "-q", str(REPO), str(src)], check=True)
    changed = subprocess.run(
        ["git", "ls-files", "--modified", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    for name in changed:  # a developer's uncommitted work is what is being tested
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((REPO / name).read_bytes())
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(src)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (found,) = (tmp / "dist").glob("mokka-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Iterator[Path]:
    """A fresh venv outside the checkout with the wheel and its dependencies installed."""
    venv = Path(tempfile.mkdtemp(prefix="mokka-wheel-venv-"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    res = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def mokka(
    venv: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed command, run from a directory that is not the checkout, with a minimal environment
    (and ``env``)."""
    with tempfile.TemporaryDirectory(prefix="mokka-cwd-") as cwd:
        return subprocess.run(
            [str(venv / "bin/mokka"), *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**ENV, **(env or {})},
            timeout=timeout,
        )


@pytest.mark.slow
def test_the_wheel_carries_the_native_libraries_and_the_data_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    native = {"libnvidia-ml.so", "libcuda.so", "libmokka-state.so", "libmokka-sysfs.so", "mokka_state.h"}
    native |= {"mokka-proc-hook", "nvidia-imex", "nvidia-imex-ctl"}  # the programs host setup stages
    assert {f"gpumodel/_native/{n}" for n in native} <= names
    data = {
        "gpumodel/profiles/h100.yaml",
        "gpumodel/scenarios/ecc-storm.yaml",
        "nri_mokka/nri/proto/nri.proto",
        "fetch/kube/gosrc/kube.go",  # `mokka cluster`'s Kubernetes build
        # NVIDIA's DRA driver image: the controller's and plugin's templates, the plugins' start check
        "localcluster/addons/nvidia_dra/rootfs/templates/compute-domain-daemon.tmpl.yaml",
        "localcluster/addons/nvidia_dra/rootfs/templates/compute-domain-daemon-config.tmpl.cfg",
        "localcluster/addons/nvidia_dra/rootfs/usr/bin/kubelet-plugin-prestart.sh",
    }
    assert data <= names
    generated = sorted({n.split("/_pb/")[0] for n in names if "/_pb/" in n})
    assert generated == ["nri_mokka/nri"], "only the committed NRI bindings: the others are generated on first use"


@pytest.mark.slow
def test_driver_root_from_the_installed_package(venv: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    res = mokka(venv, "driver-root", "--profile", "t4", "--out", str(root))
    assert res.returncode == 0, res.stderr
    smi = nvidia_smi.fetch("550")
    out = subprocess.run(
        [str(smi), "-L"], env={"LD_LIBRARY_PATH": str(root / "usr/lib64")}, capture_output=True, text=True
    ).stdout
    assert out.startswith("GPU 0: Tesla T4 (UUID: GPU-")


@pytest.mark.slow
@pytest.mark.root
def test_demo_from_the_installed_package(venv: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mokka demo needs root")
    res = mokka(venv, "demo", "--gpus", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len([ln for ln in res.stdout.splitlines() if "NVIDIA H100 80GB HBM3" in ln]) == 2, res.stdout
    assert "[7/7] teardown: ok" in res.stderr


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("allocator", ["device-plugin", "dra", "nvidia-dra"])
def test_cluster_from_the_installed_package(venv: Path, allocator: str) -> None:
    """``nvidia-dra``: NVIDIA's chart and the image built from its binaries, brought as a user
    brings them (``$MOKKA_NVIDIA_DRA_DIR``: an installed package has no checkout beside it)."""
    if os.geteuid() != 0:
        pytest.skip("a local cluster needs root")
    env = {}
    if allocator == "nvidia-dra":
        from localcluster.addons import nvidia_dra

        if (brought := nvidia_dra.source_dir()) is None:
            pytest.skip(f"no NVIDIA DRA driver (${nvidia_dra.ENV_DIR})")
        env[nvidia_dra.ENV_DIR] = str(brought)
    base = Path(tempfile.mkdtemp(prefix="mk-", dir="/tmp")) / "c"  # short: containerd's socket paths
    try:
        args = ("cluster", "up", "--dir", str(base), "--gpus", "2", "--allocator", allocator)
        res = mokka(venv, *args, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.startswith(f"export KUBECONFIG={base}/")
        status = mokka(venv, "cluster", "status", "--dir", str(base))
        assert status.returncode == 0, status.stdout + status.stderr
        gpus = "2 nvidia.com/gpu allocatable" if allocator == "device-plugin" else "2 in ResourceSlices"
        assert gpus in status.stdout
    finally:
        down = mokka(venv, "cluster", "down", "--dir", str(base))
        with contextlib.suppress(OSError):
            base.parent.rmdir()
    assert down.returncode == 0, down.stderr


def test_a_missing_proto_compiler_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "grpc_tools", None)  # as in an install that lacks grpcio-tools
    with pytest.raises(protoc.ProtocError, match=r"^grpcio-tools \(protoc\) is not installed: it is a dependency"):
        protoc.compile_protos(tmp_path, ["api.proto"], tmp_path)
