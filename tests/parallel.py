"""How the suite shares two pytest-xdist workers when asked to (``-n 2``; CI runs it in one process).

Most of the suite's wall time is waiting: on a local cluster's API server, a kind cluster's nodes,
podman. Tests that share a machine-wide thing run as one unit, in file order, on one worker:

* ``cluster``: every module that starts a Kubernetes cluster, local or kind, and so every test
  that uses the session one (``kube_cluster`` is made once per worker: all its users must be on
  the same worker). Never two clusters at once: root's inotify instances are capped at 128
  (``fs.inotify.max_user_instances``; a kubelet takes 6 or 7, kind's four nodes 74 in all), and a
  kubelet that finds none left exits (``inotify_init: too many open files``). Raising the cap is
  the host's call, not the suite's.
* ``image``: the image built from the Dockerfile, beside the clusters (kind's module builds the
  same image: the builds take turns on the image cache's lock, ``kind.dockerfile_image``).
* ``demo``: ``mokka demo`` at its default directory (its own tests and the installed package's).

Everything else is spread test by test over the other worker. The unit with the most tests goes
first (xdist's scope scheduling), so the cluster lane starts at once and the unit tests fill in
beside it. Without ``-n`` (or with ``-p no:xdist``) the suite runs in one process, in file order.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

GROUPS = {
    "cluster": ("test_cluster_", "test_e2e_dra.py", "test_kind_cluster.py"),
    "image": ("test_dockerfile_image.py",),
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
