"""The cluster's long-running processes: started in the cluster's mount namespace, each in its
own session with its log under ``DIR/logs``, recorded by pid *and* start time (so a later
``down`` from another process never signals a recycled pid), stopped by signal."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NSENTER = "nsenter"


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    start: int  # field 22 of /proc/<pid>/stat: start time in clock ticks since boot
    log: str

    def alive(self) -> bool:
        _reap(self.pid)
        return start_time(self.pid) == self.start and not zombie(self.pid)

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; True when it had to be killed."""
        self.signal(signal.SIGTERM)
        if wait_gone([self], timeout):
            return False
        self.signal(signal.SIGKILL)
        wait_gone([self], timeout)
        return True


def start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def reap(pids: Sequence[int]) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children and have
    ended: a process that started a cluster and takes it down (a test session) keeps no zombies."""
    for pid in pids:
        _reap(pid)


def wait_gone(procs: Sequence[Proc], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(p.alive() for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def in_namespace(holder: int | None, argv: Sequence[str], net: int | None = None) -> list[str]:
    """``argv`` run inside the mount namespace held by process ``holder`` and the network namespace
    held by process ``net`` (each as is when None)."""
    joins = ([f"--net=/proc/{net}/ns/net"] if net is not None else []) + (
        [f"--mount=/proc/{holder}/ns/mnt"] if holder is not None else []
    )
    return [NSENTER, *joins, "--", *argv] if joins else list(argv)


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    holder: int | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    net: int | None = None,
) -> Proc:
    """Start ``argv`` (in the namespaces of ``holder`` and ``net``) in a new session; output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with log.open("ab") as out:
        popen = subprocess.Popen(
            in_namespace(holder, argv, net),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=full_env,
            cwd=cwd,
        )
    # nsenter joins the namespace and execs the program: the pid stays the program's.
    popen.returncode = 0  # never waited on through Popen: Proc.alive() reaps it
    started = start_time(popen.pid)
    return Proc(name, popen.pid, started if started is not None else -1, str(log))


def in_mount_namespace(inode: int) -> list[int]:
    """Live processes whose mount namespace is ``inode``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "mnt").st_ino == inode and not zombie(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def kill_mount_namespace(inode: int, timeout: float = 15.0) -> list[str]:
    """SIGKILL every process in mount namespace ``inode``, again and again, until two scans in a
    row find none (a dying shim may still fork); returns the survivors, described."""
    deadline = time.monotonic() + timeout
    empty_scans = 0
    while empty_scans < 2 and time.monotonic() < deadline:
        pids = in_mount_namespace(inode)
        empty_scans = 0 if pids else empty_scans + 1
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return [f"process {pid} survived in the namespace: {cmdline(pid)}" for pid in in_mount_namespace(inode)]


def kill_naming(marker: str, timeout: float = 10.0) -> list[str]:
    """SIGKILL live processes whose command line contains ``marker``; returns the survivors."""

    def naming() -> list[int]:
        return [pid for pid in all_pids() if pid != os.getpid() and marker in cmdline(pid) and not zombie(pid)]

    deadline = time.monotonic() + timeout
    while (pids := naming()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return [f"process {pid} survived: {cmdline(pid)}" for pid in naming()]


def all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]
