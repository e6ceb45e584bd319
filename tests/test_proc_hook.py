"""mokka-proc-hook, the OCI createContainer hook that shows a container the mock node's driver in
/proc: run as runc runs it (the OCI state on stdin, in the container's mount namespace before
pivot_root, its procfs and /dev mounted) on a bundle of busybox, then read from inside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fetch import busybox
from gpumodel.native import PROC_HOOK, NativeMissing, library_path

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def hook() -> Path:
    if os.geteuid() != 0:
        pytest.skip("mounts need root")
    try:
        return library_path(PROC_HOOK)
    except NativeMissing as exc:
        pytest.skip(str(exc))


def bundle(tmp_path: Path) -> Path:
    rootfs = tmp_path / "bundle" / "rootfs"
    for d in ("bin", "proc", "dev"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy2(busybox.fetch(), rootfs / "bin" / "busybox")
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"cwd": "/"}}
    (tmp_path / "bundle" / "config.json").write_text(json.dumps(config))
    return tmp_path / "bundle"


def staged(tmp_path: Path) -> Path:
    proc = tmp_path / "node" / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "driver" / "nvidia" / "version").write_text("NVRM version: mock\n")
    (proc / "driver" / "nvidia-caps").mkdir()
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text("config 1\nmonitor 2\n")
    (proc / "modules").write_text("nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\n")
    (proc / "devices").write_text("Character devices:\n195 nvidia\n\nBlock devices:\n")
    return proc


def run(hook: Path, b: Path, args: list[str], inside: str, before: str = "true") -> subprocess.CompletedProcess[str]:
    """The hook in a new mount and pid namespace (procfs and a /dev tmpfs mounted as runc does,
    then ``before``, the spec's own mounts), then ``inside`` (no single quotes) in the container's
    root; the state names the bundle."""
    state = json.dumps({"ociVersion": "1.0.2", "id": "c", "status": "creating", "pid": 1, "bundle": str(b)})
    root = b / "rootfs"
    script = (
        f"mount -t proc proc {root}/proc && mount -t tmpfs dev {root}/dev && {before} && "
        f"echo '{state}' | {hook} {' '.join(args)} && "
        f"chroot {root} /bin/busybox sh -c 'export PATH=/bin; {inside}'"
    )
    argv = ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_the_driver_view_keeps_procfs_and_adds_the_staged_driver(hook: Path, tmp_path: Path) -> None:
    proc = staged(tmp_path)
    inside = (
        "busybox cat /proc/driver/nvidia/version /proc/driver/nvidia-caps/mig-minors; "
        "busybox head -1 /proc/self/status; busybox ls /proc | busybox grep -c ^[0-9]; "
        "busybox test -e /proc/modules && echo modules || echo no modules"
    )
    res = run(hook, bundle(tmp_path), ["--driver", str(proc / "driver")], inside)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[:3] == ["NVRM version: mock", "config 1", "monitor 2"], lines
    assert lines[3] == "Name:\tbusybox"
    assert int(lines[4]) >= 1  # the real procfs: process directories listed
    assert lines[5] == ("modules" if Path("/proc/modules").exists() else "no modules")


def test_files_given_replace_procs_own_and_it_stays_procfs_for_the_reader(hook: Path, tmp_path: Path) -> None:
    proc = staged(tmp_path)
    args = ["--driver", str(proc / "driver"), "--proc", f"modules={proc / 'modules'}"]
    args += ["--proc", f"devices={proc / 'devices'}"]
    inside = (
        'busybox grep "^nvidia " /proc/modules; busybox grep nvidia /proc/devices; '
        "busybox head -1 /proc/self/status; busybox cat /proc/driver/nvidia/version; "
        'busybox head -1 /proc/mounts | busybox cut -d" " -f1; busybox ls -a /dev | busybox grep -c mokka; '
        "echo x > /proc/new 2>/dev/null && echo writable || echo read-only"
    )
    res = run(hook, bundle(tmp_path), args, inside)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "nvidia 2 1 nvidia_uvm, Live 0x0",
        "195 nvidia",
        "Name:\tbusybox",  # /proc/self still the reader's own
        "NVRM version: mock",
        "proc",  # /proc/mounts: the real procfs's, through self
        "0",  # nothing left in /dev
        "read-only",
    ], res.stdout


def test_binds_and_links_are_made_inside_the_root_even_through_the_images_links(hook: Path, tmp_path: Path) -> None:
    """--bind and --link stand in for the spec's mounts of the staged trees and the libraries'
    second names: the directory read-only at its path (its directories made), the link replacing
    what the image had; a link of the image's own (``run`` -> an absolute path) is followed
    inside the root, never to the host's path of the same name."""
    proc = staged(tmp_path)
    b = bundle(tmp_path)
    rootfs = b / "rootfs"
    outside = tmp_path / "outside"  # the image's `run` points at this absolute path: the host's must stay untouched
    (rootfs / "run").symlink_to(outside)
    libdir = rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "libnvidia-ml.so.1").write_text("the image's own stub\n")
    (libdir / "libnvidia-ml.so.570.1").write_text("the driver's library\n")
    trees = tmp_path / "node" / "sys"
    (trees / "bus" / "pci").mkdir(parents=True)
    (trees / "bus" / "pci" / "marker").write_text("staged sysfs\n")
    args = ["--driver", str(proc / "driver"), "--bind", f"{trees}=/run/mokka/root/sys"]
    args += ["--link", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1=libnvidia-ml.so.570.1"]
    args += ["--link", "/usr/lib/x86_64-linux-gnu/libcuda.so.1=libcuda.so.570.1"]
    args += ["--link", "/usr/lib/x86_64-linux-gnu/libdcgm.so.4=libdcgm.so.4.1"]  # a mount of the spec's there: it stays
    (libdir / "libdcgm.so.4").write_text("")
    (tmp_path / "theirs").write_text("the container's own mount\n")
    before = f"mount --bind {tmp_path / 'theirs'} {libdir / 'libdcgm.so.4'}"
    inside = (
        "busybox cat /run/mokka/root/sys/bus/pci/marker; "
        "echo x > /run/mokka/root/sys/new 2>/dev/null && echo writable || echo read-only; "
        "busybox readlink /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1; "
        "busybox cat /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1; "
        "busybox readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
        "busybox cat /usr/lib/x86_64-linux-gnu/libdcgm.so.4"
    )
    res = run(hook, b, args, inside, before)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "staged sysfs",
        "read-only",
        "libnvidia-ml.so.570.1",
        "the driver's library",
        "libcuda.so.570.1",  # a link where the image had nothing (its target arrives with its own mount)
        "the container's own mount",
    ], res.stdout
    assert not outside.exists()  # resolved inside the root: made at rootfs/<outside>
    assert (rootfs / str(outside).lstrip("/") / "mokka" / "root" / "sys").is_dir()
    assert not list(trees.parent.glob("sys/new"))


def test_bad_use_is_one_line_and_changes_nothing(hook: Path, tmp_path: Path) -> None:
    res = subprocess.run([str(hook)], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2 and res.stderr.startswith("usage: mokka-proc-hook --driver DIR"), res.stderr
    res = subprocess.run(
        [str(hook), "--driver", str(tmp_path)], input="{}", capture_output=True, text=True, timeout=30, check=False
    )
    assert res.returncode == 1
    assert res.stderr == "mokka-proc-hook: the OCI state on stdin names no bundle\n", res.stderr
    for bad in (["--bind", "relative=dir"], ["--bind", "/host/dir=relative"], ["--link", "/no-target"]):
        res = subprocess.run([str(hook), "--driver", str(tmp_path), *bad], capture_output=True, text=True, timeout=30)
        assert res.returncode == 2 and res.stderr.startswith("usage: mokka-proc-hook --driver DIR"), (bad, res.stderr)
