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


def test_rerun_with_fewer_gpus_removes_what_the_surplus_had(tmp_path: Path) -> None:
    root = tmp_path / "root"
    node.apply(node.plan(profile.load("h100"), node.Options(root=root)))
    assert (root / "dev/nvidia7").exists()
    undone = node.apply(node.plan(profile.load("h100").with_count(2), node.Options(root=root)))
    assert f"removed {root}/dev/nvidia7" in undone
    rerun = snapshot(root)
    node.cleanup(root)
    node.apply(node.plan(profile.load("h100").with_count(2), node.Options(root=root)))
    journal = str(root / ".mokka/journal.jsonl")
    assert {k: v for k, v in snapshot(root).items() if k != journal} == {k: v for k, v in rerun.items() if k != journal}
    assert sorted(p.name for p in (root / "dev").iterdir() if p.name[6:].isdigit()) == ["nvidia0", "nvidia1"]


def test_rerun_without_an_option_undoes_what_it_staged(tmp_path: Path, smi_binary: Path) -> None:
    root, run = tmp_path / "root", tmp_path / "run/nvidia"
    run.mkdir(parents=True)
    os.symlink("/opt/old-driver", run / "driver")
    with_all = node.Options(root=root, nvidia_smi=smi_binary, run_nvidia=run, toolkit_ready=True)
    node.apply(node.plan(profile.load("t4"), with_all))
    assert (root / "driver/usr/bin/nvidia-smi").exists() and os.readlink(run / "driver") == str(root / "driver")
    node.apply(node.plan(profile.load("t4"), node.Options(root=root)))
    # usr/bin keeps only what every node has: the mock IMEX tools
    assert sorted(p.name for p in (root / "driver/usr/bin").iterdir()) == ["nvidia-imex", "nvidia-imex-ctl"]
    assert os.readlink(run / "driver") == "/opt/old-driver" and not (run / "validations").exists()
    assert nodelayout.NodeLayout.load(root).nvidia_smi is None


def test_uvm_major_is_the_one_the_kernel_would_hand_out(tmp_path: Path) -> None:
    from hostsetup import majors

    devices = tmp_path / "devices"
    lines = ["Character devices:", "  1 mem", "195 nvidia-frontend-elsewhere"]
    devices.write_text("\n".join([*lines, "", "Block devices:", "254 virtblk", ""]))
    # block majors do not count; nvidia-caps (MIG) takes the next dynamic major after nvidia-uvm's,
    # nvidia-caps-imex-channels the one after that
    assert majors.choose("real", devices) == majors.Majors(195, 254, "real", 253, 252)
    taken = [f"{m} drv{m}" for m in range(245, 255)] + ["509 late"]  # 509 % 255 = 254: that slot too
    devices.write_text("\n".join(["Character devices:", *taken, ""]))
    assert majors.choose("real", devices).uvm == 244
    devices.write_text("\n".join(["Character devices:", *[f"{m} d" for m in range(234, 255)], ""]))
    assert majors.choose("real", devices).uvm == 511
    devices.write_text("Character devices:\n195 nvidia\n510 nvidia-uvm\n")
    assert majors.choose("auto", devices) == majors.Majors(120, 121, "safe", 122, 123)  # a real driver is loaded
    plan = node.plan(profile.load("t4"), node.Options(root=tmp_path / "root", majors="real", proc_devices=devices))
    assert (plan.layout.gpu_major, plan.layout.uvm_major) == (195, 254)


def test_machine_picks_the_library_directory_in_containers(tmp_path: Path) -> None:
    import platform

    from gpumodel import edits

    plan = node.plan(profile.load("gb200"), node.Options(root=tmp_path / "a", machine="aarch64"))
    mounts = [m.container_path for m in edits.common_edits(plan.layout).mounts]
    assert "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1" in mounts
    assert not [m for m in mounts if "x86_64" in m]
    default = node.plan(profile.load("t4"), node.Options(root=tmp_path / "b")).layout
    assert default.machine == platform.machine()
    assert nodelayout.NodeLayout.from_json(plan.layout.to_json()).machine == "aarch64"
    with pytest.raises(node.SetupError, match="riscv64"):
        node.plan(profile.load("t4"), node.Options(root=tmp_path / "c", machine="riscv64"))


def test_cli_stages_debians_nvidia_smi_by_default(tmp_path: Path, smi_binary: Path) -> None:
    from fetch import nvidia_smi

    root = tmp_path / "root"
    res = mokka("host", "setup", "--profile", "t4", "--root", str(root))
    assert res.returncode == 0, res.stderr
    staged = root / "driver/usr/bin/nvidia-smi"
    assert staged.read_bytes() == nvidia_smi.fetch("550").read_bytes()
    res = mokka("host", "setup", "--profile", "t4", "--root", str(root), "--no-nvidia-smi")
    assert res.returncode == 0, res.stderr
    assert not staged.exists() and nodelayout.NodeLayout.load(root).nvidia_smi is None
    before = snapshot(tmp_path)
    both = ("--no-nvidia-smi", "--nvidia-smi", str(smi_binary))
    res = mokka("host", "setup", "--profile", "t4", "--root", str(root), *both)
    assert res.returncode == 1 and res.stderr == "mokka: error: --nvidia-smi and --no-nvidia-smi exclude each other\n"
    assert snapshot(tmp_path) == before


def test_cli_prints_one_line_per_step(tmp_path: Path) -> None:
    root = tmp_path / "root"
    args = ["host", "setup", "--profile", "t4", "--root", str(root), "--no-nvidia-smi"]
    res = mokka(*args)
    assert res.returncode == 0, res.stderr
    steps = len(node.plan(profile.load("t4"), node.Options(root=root)).steps)
    progress = res.stderr.splitlines()
    assert len(progress) == steps and all(line.startswith(f"[{i + 1}/{steps}] ") for i, line in enumerate(progress))
    assert len(res.stdout.splitlines()) == 1 and "mokka host cleanup" in res.stdout
    res = mokka(*args, "-v")
    assert res.stdout.startswith("host setup: 4x Tesla T4") and len(res.stdout.splitlines()) == steps + 2
    res = mokka("host", "cleanup", "--root", str(root))
    assert res.stdout.count("\n") == 1 and "restored" in res.stdout
    res = mokka("host", "cleanup", "--root", str(root))
    assert res.stdout == f"{root}: nothing to clean up\n"


def test_cli_corrupt_journal_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / ".mokka").mkdir(parents=True)
    (root / ".mokka/journal.jsonl").write_text('{"mokka-journal": 1, "home": []}\n{"done": 7}\n')
    before = snapshot(tmp_path)
    for args in (("setup", "--profile", "t4", "--no-nvidia-smi"), ("cleanup",)):
        res = mokka("host", *args, "--root", str(root))
        assert res.returncode == 1 and res.stdout == ""
        assert res.stderr.startswith(f"mokka: error: {root}/.mokka/journal.jsonl: corrupt journal (line 2: ")
        assert res.stderr.count("\n") == 1
        assert snapshot(tmp_path) == before


@pytest.mark.parametrize("text", [b"{not json", b'{"root": "/x"}\n', b"\xff\xfe binary"])
def test_cdi_generate_with_a_corrupt_node_json_is_one_line(tmp_path: Path, text: bytes) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "node.json").write_bytes(text)
    out = tmp_path / "cdi"
    res = mokka("cdi", "generate", "--root", str(root), "--output", str(out), "--no-validate")
    assert res.returncode == 1 and res.stdout == "" and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"mokka: error: {root}/node.json: not a node layout")
    assert not out.exists()


def test_an_older_mokkas_journal_is_named(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / ".mokka").mkdir(parents=True)
    (root / ".mokka/journal.json").write_text('{"entries": []}')
    before = snapshot(tmp_path)
    res = mokka("host", "cleanup", "--root", str(root))
    assert res.returncode == 1 and "staged by an older Mokka" in res.stderr and res.stderr.count("\n") == 1
    with pytest.raises(node.SetupError, match="older Mokka"):
        node.apply(node.plan(profile.load("t4"), node.Options(root=root)))
    assert snapshot(tmp_path) == before
