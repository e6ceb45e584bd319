"""How the suite shares pytest-xdist workers when asked to (``-n 3``, as CI runs it).

Most of the suite's wall time is waiting: on a local cluster's API server, a kind cluster's nodes,
podman. Tests that share a machine-wide thing run as one unit, in file order, on one worker:

* two cluster lanes, ``cluster`` and ``kind``: every module that starts a Kubernetes cluster,
  local or kind, runs in one of them, so clusters never pile up beyond two lanes' worth. ``cluster``
  holds every test of the session cluster (``kube_cluster`` is made once per worker: all its users
  must be on the same worker); ``kind`` holds kind's module, and ``mokka demo`` at its default
  directory (its own tests, the Quick start's, the installed package's, the fresh host's), and
  enough local cluster modules to end about when ``cluster`` does.
* ``image``: the image built from the Dockerfile (kind's module builds the same image: the builds
  take turns on the image cache's lock, ``kind.dockerfile_image``).

Root's inotify instances are capped at 128 (``fs.inotify.max_user_instances``; a kubelet and its
containerd take 8 or 9, kind's four nodes 74 in all), and a kubelet that finds none left exits
(``inotify_init: too many open files``). The lanes keep the two largest clusters together under it
(kind's and a four-node local one), and :func:`inotify_room` holds a cluster's start back while
another worker's would leave it too few. Raising the cap is the host's call, not the suite's.

Everything else is spread test by test over the workers. The unit with the most tests goes first
(xdist's scope scheduling), so the two cluster lanes start at once, each on a worker of its own,
and the unit tests fill in beside them at a lower CPU priority (nice 10): the clusters' tests wait
on timings (a toolkit's restart, Karpenter's consolidation) that a compiler beside them must not
stretch. Without ``-n`` (or with ``-p no:xdist``) the suite runs in one process, in file order.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

# Module files by prefix; measured module wall times (one process, warm) in the comments.
GROUPS = {
    "kind": (
        "test_kind_cluster.py",  # 500 s
        "test_cluster_fgo_guide.py",  # 170 s
        "test_cluster_fleet.py",  # 100 s
        "test_cluster_karpenter.py",  # 70 s
        "test_packaging.py",  # 80 s, two one-node clusters
        "test_demo.py",  # 20 s
        "test_quickstart.py",  # 10 s: the Quick start's steps as written, `mokka demo` among them
        "test_fresh_host.py",  # 35 s: two clusters of test_cluster_cli.py, the demo, on a fresh host's paths
    ),
    "cluster": ("test_cluster_", "test_e2e_dra.py"),  # 1000 s
    "image": ("test_dockerfile_image.py",),
}
CLUSTER_LANES = ("cluster", "kind")
NICE = 10  # the unit tests' CPU priority beside the cluster lanes

INOTIFY_CAP = Path("/proc/sys/fs/inotify/max_user_instances")
KIND_INOTIFY = 74  # kind's four nodes (systemd, kubelet, containerd, the control plane)


def group_of(path: str) -> str | None:
    """The group of the tests in file ``path``, or None (spread test by test)."""
    name = PurePosixPath(path).name
    return next((group for group, prefixes in GROUPS.items() if name.startswith(prefixes)), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kube_cluster" in getattr(item, "fixturenames", ()) and group_of(str(item.path)) != "cluster":
            raise pytest.UsageError(f"{item.nodeid} uses the session cluster: add its module to tests/parallel.py")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "PYTEST_XDIST_WORKER" in os.environ:  # a worker: CPU priority by lane (the root may lower it again)
        os.setpriority(os.PRIO_PROCESS, 0, 0 if group_of(str(item.path)) in CLUSTER_LANES else NICE)


def local_cluster_inotify(nodes: int) -> int:
    """Inotify instances a local cluster of ``nodes`` real nodes takes: a kubelet (6 or 7) and a
    containerd (2) per node, the control plane's 8."""
    return 8 + 9 * nodes


def inotify_in_use() -> int:
    """Root's inotify instances open now, over every process."""
    count = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != 0:
                continue
            count += sum(1 for fd in (proc / "fd").iterdir() if os.readlink(fd) == "anon_inode:inotify")
        except OSError:  # gone meanwhile, or a descriptor closed
            continue
    return count


@contextlib.contextmanager
def inotify_room(need: int, what: str, timeout: float = 1800) -> Iterator[None]:
    """Start ``what`` (a cluster taking ``need`` instances) only while root has that many inotify
    instances to spare; starts take turns (a lock file), so two never count the same room. Alone
    (no xdist) it only starts."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        yield
        return
    cap = int(INOTIFY_CAP.read_text())
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "run")
    with open(f"/tmp/mokka-tests-{run}-inotify.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deadline, said = time.monotonic() + timeout, False
        while (used := inotify_in_use()) + need > cap:
            room = f"{need} inotify instances ({used} of {cap} in use)"
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not {room} within {timeout:g}s")
            if not said:
                print(f"[{worker}] {what} waits for {room}", file=sys.__stderr__, flush=True)
                said = True
            time.sleep(2)
        yield


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":
        return None  # xdist's own (--dist each, loadfile, ...)
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        """Scope scheduling whose scope is a test's group, or the test itself."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::", 1)[0]) or nodeid

    return Groups(config, log)
