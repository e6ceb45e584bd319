"""How the suite shares pytest-xdist workers when asked to (``-n 2``; CI runs it in one process).

Most of the suite's wall time is waiting: on the session cluster's API server, a kind cluster's
nodes, podman. Tests that share a machine-wide thing run as one unit, in file order, on one worker:

* ``cluster``: every module that starts a local cluster, and so every test that uses the session
  one (``kube_cluster`` is made once per worker: all its users must be on the same worker);
* ``podman``: kind's clusters and the image built from the Dockerfile (one podman storage, one
  image cache);
* ``demo``: ``mokka demo`` at its default directory (its own tests and the installed package's).

Everything else is spread test by test. The unit with the most tests goes first (xdist's scope
scheduling), so the cluster's modules start at once beside kind's, and the unit tests fill in
behind: on two cores the whole suite took 23 minutes instead of 37. It is not CI's default: with
kind's cluster running beside them, local clusters fail to come up now and then — their kubelets
log ``inotify_init: too many open files`` and exit (root's inotify instances are capped at 128 by
``fs.inotify.max_user_instances``, and kind's four nodes and a four-node local cluster use them up;
raising it is the host's call, not the suite's) — and once the GPU Operator's toolkit operand did
not restart containerd within 300 s.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

GROUPS = {
    "cluster": ("test_cluster_", "test_e2e_dra.py"),
    "podman": ("test_kind_cluster.py", "test_dockerfile_image.py"),
    "demo": ("test_demo.py", "test_packaging.py"),
}


def group_of(path: str) -> str | None:
    """The group of the tests in file ``path``, or None (spread test by test)."""
    name = PurePosixPath(path).name
    return next((group for group, prefixes in GROUPS.items() if name.startswith(prefixes)), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kube_cluster" in getattr(item, "fixturenames", ()) and group_of(str(item.path)) != "cluster":
            raise pytest.UsageError(f"{item.nodeid} uses the session cluster: add its module to tests/parallel.py")


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
