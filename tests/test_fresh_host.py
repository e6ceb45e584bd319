"""A fresh machine has none of the host paths a GPU node's software keeps (kubelet's, containerd's,
CDI's, NRI's, /run/nvidia: :data:`containers.mounts.FRESH_PATHS`), so the code and the tests must
create whatever they mount over, write into or bind — and leave the host as it was.

Shown here the way it would fail on a fresh machine: the parts of the suite that use those paths
run again in a private mount namespace where every one of them is absent (``python -m
containers.mounts --fresh``), and the host's own copies of them (where this machine has any) are the
same afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from containers import mounts

REPO = Path(__file__).resolve().parent.parent
FRESH = [sys.executable, "-m", "containers.mounts", "--fresh", "--"]

# The tests that use the fixed host paths, each for the paths it uses.
AFFECTED = (
    "tests/test_fault_device_plugin.py",  # NVIDIA's device plugin: /var/lib/kubelet/device-plugins
    "tests/test_e2e_cdi.py::test_podman_device",  # podman 4.3 reads /etc/cdi and /var/run/cdi only
    "tests/test_demo.py::test_demo_prints_the_gpu_table[2.1]",  # containerd's /run/containerd/s
    # kubelet, containerd, CNI, CDI and NRI paths of whole nodes
    "tests/test_cluster_cli.py::test_up_status_down_beside_another_cluster",
)

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace: needs root")


def snapshot() -> dict[str, list[str] | None]:
    """What the host has at each fresh path: the names below it, or None when it is absent."""
    seen: dict[str, list[str] | None] = {}
    for path in mounts.FRESH_PATHS:
        p = Path(path)
        seen[path] = sorted(str(q.relative_to(p)) for q in p.rglob("*")) if p.is_dir() else None
    return seen


def test_fresh_view_hides_every_node_path_and_keeps_the_host() -> None:
    before = snapshot()
    probe = (
        "import os, sys\n"
        f"paths = {list(mounts.FRESH_PATHS)!r}\n"
        "present = [p for p in paths if os.path.lexists(p)]\n"
        "assert not present, present\n"
        "for p in paths:\n"
        "    os.makedirs(os.path.join(p, 'made-by-the-test'))\n"
        "assert os.path.isdir('/var/lib/dpkg') and os.path.isfile('/etc/os-release')  # the rest is the host's\n"
        "print('ok')\n"
    )
    res = subprocess.run([*FRESH, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "ok\n", res.stderr
    assert snapshot() == before


def test_bad_arguments_are_one_line() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "containers.mounts", "--bind", "/nonexistent-source:/x", "--", "true"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "/nonexistent-source: no such file or directory" in res.stderr
    assert "Traceback" not in res.stderr
    res = subprocess.run([*FRESH, "/nonexistent-program"], capture_output=True, text=True)
    assert res.returncode == 127 and res.stderr.strip().splitlines() == [
        "mounts: error: /nonexistent-program: No such file or directory"
    ]


@pytest.mark.slow
def test_the_tests_that_use_node_paths_pass_without_them() -> None:
    before = snapshot()
    argv = [*FRESH, sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", *AFFECTED]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=1500, stdin=subprocess.DEVNULL)
    summary = res.stdout.strip().splitlines()[-1:] or [""]
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert " passed" in summary[0] and "skipped" not in summary[0], summary
    assert snapshot() == before
