"""``podman run`` of Debian's podman with all of its state private, cleaned up after each run.

Debian bookworm's podman (4.3) on this kind of host needs: bookworm's runc (crun 1.8 refuses
hybrid cgroups), explicit low ``--ulimit nofile/nproc`` (podman asks for limits above what its
conmon has and root lacks CAP_SYS_RESOURCE to raise them), ``--network=none`` (no CNI set up),
cgroupfs, file locks and no events (nothing in /dev/shm or the journal).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from containers import cleanup, mounts
from containers.command import CALL_TIMEOUT, SandboxError, run
from fetch import containerd_dist

__all__ = ["PODMAN_CDI_DIRS", "podman_run"]

log = logging.getLogger(__name__)

PODMAN_CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))  # podman 4.3 reads only these (no --cdi-spec-dir)
WAIT_TIMEOUT = 15.0


def podman_run(
    base: Path,
    rootfs: Path,
    command: Sequence[str],
    *,
    devices: Sequence[str] = (),
    cdi_spec: Path | None = None,
    runtime: Path | None = None,
    timeout: float = CALL_TIMEOUT,
    cache: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``podman run --rm --rootfs ROOTFS --device D... COMMAND`` with all of podman's state under ``base``.

    Podman 4.3 has no ``--cdi-spec-dir``: with ``cdi_spec`` podman runs in a private mount
    namespace (:mod:`containers.mounts`) whose /etc/cdi holds that spec alone and whose /var/run/cdi
    is empty, so the host's CDI directories are neither read nor written (nor needed). ``base`` is
    removed at the end, with the cgroups, processes and mounts of the run. The rootfs gets the
    mount targets the runtime creates: pass a copy.
    """
    base = base.absolute()
    if base.exists() and any(base.iterdir()):
        raise SandboxError(f"{base} exists and is not empty")
    parent = cleanup.cgroup_parent(base, "podman")
    argv: list[str | Path] = ["podman"]
    try:
        base.mkdir(parents=True, exist_ok=True)
        (base / "containers.conf").write_text(
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\nevents_logger = "none"\nlock_type = "file"\n'
            f'tmp_dir = "{base}/tmp"\nstatic_dir = "{base}/root/libpod"\nvolume_path = "{base}/root/volumes"\n'
            f'[network]\nnetwork_config_dir = "{base}/net"\n'
        )
        (base / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{base}/root"\nrunroot = "{base}/run"\n'
        )
        env = {**os.environ, "CONTAINERS_CONF": str(base / "containers.conf")}
        env["CONTAINERS_STORAGE_CONF"] = str(base / "storage.conf")
        runtime = runtime or containerd_dist.runc(cache)
        argv += ["--runtime", runtime, "--runtime-flag", f"root={base}/runtime"]
        if cdi_spec is not None:
            spec_dir, empty = base / "cdi", base / "cdi-none"
            spec_dir.mkdir()
            empty.mkdir()
            shutil.copy(cdi_spec, spec_dir / cdi_spec.name)
            view = [f"--bind={spec_dir}:{PODMAN_CDI_DIRS[0]}", f"--bind={empty}:{PODMAN_CDI_DIRS[1]}"]
            argv = [sys.executable, "-m", mounts.__name__, *view, "--", *argv]
        argv += ["run", "--rm", "--network=none", f"--cgroup-parent={parent}"]
        argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
        for device in devices:
            argv += ["--device", device]
        argv += ["--rootfs", rootfs.absolute(), *command]
        log.info("podman run %s (devices: %s)", " ".join(command), ", ".join(devices) or "none")
        return run(argv, timeout=timeout, check=False, env=env)
    finally:
        _podman_cleanup(base, parent)


def _podman_cleanup(base: Path, parent: str) -> None:
    """Wait for podman's exit command and conmon, then remove cgroups, mounts and ``base``."""
    marks = [str(base / "root"), str(base / "tmp"), f"--root={base}/runtime"]
    if left := cleanup.wait_gone(cleanup.processes(marks), WAIT_TIMEOUT):
        for pid in left:
            cleanup.kill(pid)
        cleanup.wait_gone(left, WAIT_TIMEOUT)
    problems: list[str] = []
    cleanup.kill_cgroup_members(parent)
    for d in cleanup.cgroup_dirs(parent):
        cleanup.rmdir_cgroup(d, problems)
    for mount in cleanup.mounts_under(base):
        try:
            cleanup.unmount(mount)
        except SandboxError as exc:
            problems.append(str(exc))
    if base.exists() and not cleanup.mounts_under(base):
        cleanup.remove_tree(base, problems)
    if problems:
        raise SandboxError("podman clean-up incomplete: " + "; ".join(problems))
