"""How the suite shares two pytest-xdist workers (``-n 2 --dist loadgroup``, the project's default).

Most of the suite's wall time is waiting: on the session cluster's API server, a kind cluster's
nodes, podman. Tests that share a machine-wide thing run in one group, in order, on one worker:

* ``cluster``: every module that starts a local cluster, and every test that uses the session one
  (``kube_cluster`` is made once per worker, so all its users must be on the same worker);
* ``podman``: kind's clusters and the image built from the Dockerfile (one podman storage, one
  image cache);
* ``demo``: ``mokka demo`` at its default directory (its own tests and the installed package's).

Everything else is spread test by test over both workers. xdist sends the group with the most tests
first, so the cluster's modules start at once beside kind's, and the unit tests fill in behind.
``-n 0`` runs everything in one process, in file order (handy for a single test).
"""

from __future__ import annotations

import pytest

GROUPS = {
    "cluster": ("test_cluster_", "test_e2e_dra.py"),
    "podman": ("test_kind_cluster.py", "test_dockerfile_image.py"),
    "demo": ("test_demo.py", "test_packaging.py"),
}


def group_of(item: pytest.Item) -> str | None:
    if "kube_cluster" in getattr(item, "fixturenames", ()):
        return "cluster"
    name = item.path.name
    return next((group for group, prefixes in GROUPS.items() if name.startswith(prefixes)), None)


@pytest.hookimpl(tryfirst=True)  # before xdist names each test after its group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
