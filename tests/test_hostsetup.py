"""`mokka host setup` / `cleanup`: staged node contents, idempotence, byte-for-byte undo."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpumodel import nodelayout, profile, state
from hostsetup import node


def snapshot(top: Path) -> dict[str, str]:
    """Every path under ``top`` with its type, mode and content hash (or link target)."""
    out: dict[str, str] = {}
    if not top.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[str(p)] = f"link {os.readlink(p)}"
            elif stat.S_ISDIR(st.st_mode):
                out[str(p)] = f"dir {oct(st.st_mode)}"
            elif stat.S_ISCHR(st.st_mode):
                out[str(p)] = f"chr {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            else:
                out[str(p)] = f"file {oct(st.st_mode)} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    return out


def mokka(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True)


@pytest.fixture
def smi_binary(tmp_path: Path) -> Path:
    f = tmp_path / "nvidia-smi-input"
    f.write_bytes(b"\x7fELF not really\n")
    return f


def test_setup_stages_everything(tmp_path: Path, smi_binary: Path) -> None:
    root = tmp_path / "root"
    prof = profile.load("h100")
    plan = node.plan(prof, node.Options(root=root, nvidia_smi=smi_binary, majors="real"))
    node.apply(plan)
    layout = nodelayout.NodeLayout.load(root)
    assert layout.gpu_major == 195 and len(layout.gpus) == 8
    lib = root / "driver/usr/lib64" / f"libnvidia-ml.so.{prof.driver.version}"
    assert lib.is_file() and os.readlink(root / "driver/usr/lib64/libnvidia-ml.so.1") == lib.name
    assert state.check(state.read(lib))[2] == 8  # the library carries the state
    cuda = root / "driver/usr/lib64" / f"libcuda.so.{prof.driver.version}"
    assert cuda.is_file() and os.readlink(root / "driver/usr/lib64/libcuda.so.1") == cuda.name
    assert layout.cuda_library == str(cuda) and layout.state == str(lib)
    assert (root / "driver/usr/bin/nvidia-smi").read_bytes() == smi_binary.read_bytes()
    for i in range(8):
        st = (root / f"dev/nvidia{i}").stat()
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, i)
    ctl = (root / "dev/nvidiactl").stat()
    assert (os.major(ctl.st_rdev), os.minor(ctl.st_rdev)) == (195, 255)
    assert (root / "proc/driver/nvidia/version").read_text().count(prof.driver.version) >= 1
    for dev in prof.devices():
        pci = root / "sys/bus/pci/devices" / dev.bus_id[4:].lower()
        assert (pci / "vendor").read_text().strip() == "0x10de"
        assert (pci / "device").read_text().strip() == f"0x{dev.spec.pci.device_id:04x}"


def test_setup_is_idempotent_and_keeps_the_state_inode(tmp_path: Path) -> None:
    root = tmp_path / "root"
    plan = node.plan(profile.load("t4"), node.Options(root=root))
    node.apply(plan)
    state_file = root / "driver/usr/lib64" / f"libnvidia-ml.so.{profile.load('t4').driver.version}"
    inode = state_file.stat().st_ino
    first = snapshot(root)
    node.apply(node.plan(profile.load("t4"), node.Options(root=root)))
    assert snapshot(root) == first
    assert state_file.stat().st_ino == inode


def test_cleanup_restores_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "var/lib/mokka"
    run = tmp_path / "run/nvidia"
    # A pre-existing node: an unrelated file in the root and an old /run/nvidia/driver link.
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("keep me\n")
    run.mkdir(parents=True)
    os.symlink("/opt/old-driver", run / "driver")
    before = snapshot(tmp_path)
    opts = node.Options(root=root, run_nvidia=run, toolkit_ready=True)
    node.apply(node.plan(profile.load("a100"), opts))
    assert os.readlink(run / "driver") == str(root / "driver")
    assert (run / "validations/toolkit-ready").exists()
    node.cleanup(root)
    assert snapshot(tmp_path) == before


def test_bad_root_changes_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(node.SetupError):
        node.plan(profile.load("h100"), node.Options(root=blocker / "root"))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.geteuid() != 0:
            with pytest.raises(node.SetupError):
                node.plan(profile.load("h100"), node.Options(root=ro / "root"))
    finally:
        ro.chmod(0o700)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "ro"]


def test_failure_midway_rolls_back(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "dev/nvidia3").write_text("someone else's file")  # not a device node: setup must refuse
    before = snapshot(tmp_path)
    with pytest.raises(node.SetupError, match="nvidia3"):
        node.apply(node.plan(profile.load("h100"), node.Options(root=root)))
    assert snapshot(tmp_path) == before


def test_cli_dry_run_and_bad_profile(tmp_path: Path) -> None:
    root = tmp_path / "root"
    res = mokka("host", "setup", "--profile", "h100", "--gpus", "2", "--root", str(root), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "nvidia0..1" in res.stdout and "dry run" in res.stdout
    assert not root.exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    res = mokka("host", "setup", "--profile", str(bad), "--root", str(root))
    assert res.returncode == 1 and "bad.yaml" in res.stderr
    assert not root.exists()


def test_cli_setup_then_cleanup(tmp_path: Path) -> None:
    root = tmp_path / "root"
    res = mokka("host", "setup", "--profile", "h100", "--gpus", "64", "--root", str(root))
    assert res.returncode == 0, res.stderr
    assert len(nodelayout.NodeLayout.load(root).gpus) == 64
    res = mokka("host", "cleanup", "--root", str(root))
    assert res.returncode == 0, res.stderr
    assert not root.exists()
