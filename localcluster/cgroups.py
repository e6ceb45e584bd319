"""The kubelet's cgroup root (``cgroupRoot``): made in every hierarchy before kubelet starts
(cpuset's cpus and mems copied from the parent, as a v1 cpuset needs), removed at teardown
after every task in it is killed."""

from __future__ import annotations

import contextlib
import errno
import time
from pathlib import Path

from containers.cleanup import cgroup_dirs, cgroup_hierarchies, kill_cgroup_members


def create(name: str) -> list[Path]:
    """``/<name>`` in every hierarchy; returns the directories made."""
    made: list[Path] = []
    for root in cgroup_hierarchies():
        d = root / name.strip("/")
        if d.is_dir():
            continue
        d.mkdir()
        made.append(d)
        for key in ("cpuset.cpus", "cpuset.mems"):
            if (d / key).exists():
                (d / key).write_text((root / key).read_text())
    return made


def existing(name: str) -> list[Path]:
    """Every directory of cgroup ``name`` in every hierarchy, children first."""
    return cgroup_dirs(name)


def tasks(name: str) -> set[int]:
    pids: set[int] = set()
    for d in existing(name):
        for procs in ("cgroup.procs", "tasks"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in (d / procs).read_text().split())
    return pids


def remove(name: str, timeout: float = 15.0) -> list[str]:
    """Kill every task under ``name`` (thawing frozen cgroups first) and remove its directories;
    returns the problems left."""
    deadline = time.monotonic() + timeout
    while tasks(name) and time.monotonic() < deadline:
        kill_cgroup_members(name)  # thaws first: a frozen task ignores SIGKILL
        time.sleep(0.05)
    problems = [f"process {pid} survived SIGKILL in cgroup {name}" for pid in tasks(name)]
    for d in existing(name):
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    problems.append(f"cannot remove cgroup {d}: {exc.strerror}")
                    break
                time.sleep(0.05)
    return problems
