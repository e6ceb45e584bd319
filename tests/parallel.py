"""How the suite shares two pytest-xdist workers (``-n 2 --dist load``, the project's default).

Most of the suite's wall time is waiting: on the session cluster's API server, a kind cluster's
nodes, podman. Tests that share a machine-wide thing run as one unit, in file order, on one worker:

* ``cluster``: every module that starts a local cluster, and so every test that uses the session
  one (``kube_cluster`` is made once per worker: all its users must be on the same worker);
* ``podman``: kind's clusters and the image built from the Dockerfile (one podman storage, one
  image cache);
* ``demo``: ``mokka demo`` at its default directory (its own tests and the installed package's).

Everything else is spread test by test over both workers. The unit with the most tests goes
first (xdist's scope scheduling), so the cluster's modules start at once beside kind's, and the
unit tests fill in behind. ``-n 0`` runs everything in one process, in file order (handy for a
single test).
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
