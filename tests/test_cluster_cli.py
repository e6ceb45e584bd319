"""`mokka cluster up|status|down` as a user runs them: a second cluster beside the session's (free
ports, own namespace, cgroups and bridge), `down` leaving nothing behind, and bad input refused
with one line and nothing changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import parallel
import pytest
from cluster_fixtures import ensure_binaries, host_sysctls, pod_manifest, require_root, run_pod

from localcluster.cluster import Cluster, leftovers

pytestmark = [pytest.mark.root]


def mokka(*args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mokka.cli", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def one_error_line(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mokka: error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def iptables_rules() -> str:
    res = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False)
    return "".join(ln for ln in res.stdout.splitlines(keepends=True) if not ln.startswith(("#", ":")))


@pytest.mark.slow
def test_up_status_down_beside_another_cluster(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A second cluster (allocator none: the NRI plugin gives every container all GPUs) while the
    session's runs; `down` leaves no process, mount, cgroup, interface, file or iptables rule."""
    base = tmp_path_factory.mktemp("kube") / "second"
    sysctls, rules = host_sysctls(), iptables_rules()
    with parallel.inotify_room(parallel.local_cluster_inotify(1), "a second cluster"):
        res = mokka("cluster", "up", "--dir", str(base), "--profile", "a100", "--gpus", "2", "--allocator", "none")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"export KUBECONFIG={base}/kubeconfig/admin.conf"
    steps = res.stderr.strip().splitlines()
    assert 6 <= len(steps) <= 12, res.stderr  # one line per step
    try:
        second = Cluster.load(base)
        assert second.ports.apiserver != kube_cluster.ports.apiserver
        status = mokka("cluster", "status", "--dir", str(base))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "nodes       1 of 1 Ready" in status.stdout
        assert [ln.split()[-1] for ln in status.stdout.splitlines() if ln.startswith("localhost ")] == ["Ready"]
        from kubernetes import client

        core: Any = client.CoreV1Api(second.api())
        out = run_pod(core, pod_manifest("all-gpus", ["nvidia-smi", "-L"]))
        assert out.phase == "Succeeded", out.logs
        assert out.logs.count("NVIDIA A100") == 2, out.logs
        assert kube_cluster.node_ready()  # the other cluster is unaffected
    finally:
        down = mokka("cluster", "down", "--dir", str(base))
    assert down.returncode == 0, down.stderr
    assert leftovers(base) == []
    assert host_sysctls() == sysctls
    assert iptables_rules() == rules
    one_error_line(mokka("cluster", "down", "--dir", str(base)), "no cluster there", str(base))


def test_down_without_a_cluster(tmp_path: Path) -> None:
    require_root()
    one_error_line(mokka("cluster", "down", "--dir", str(tmp_path)), "no cluster there", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_status_of_a_corrupt_state_file(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{not json")
    one_error_line(mokka("cluster", "status", "--dir", str(tmp_path)), "cluster.json", str(tmp_path))
    assert (tmp_path / "cluster.json").read_text() == "{not json"


def test_up_refuses_a_directory_in_use(tmp_path: Path) -> None:
    require_root()
    ensure_binaries()
    (tmp_path / "something").write_text("mine")
    one_error_line(mokka("cluster", "up", "--dir", str(tmp_path)), "in use", str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["something"]
    assert (tmp_path / "something").read_text() == "mine"


def test_up_refuses_an_unknown_profile(tmp_path: Path) -> None:
    one_error_line(mokka("cluster", "up", "--dir", str(tmp_path / "c"), "--profile", "v100"), "v100")
    assert not (tmp_path / "c").exists()


def test_up_refuses_karpenter_without_a_pool_it_can_provision(tmp_path: Path) -> None:
    base = str(tmp_path / "c")
    one_error_line(mokka("cluster", "up", "--dir", base, "--karpenter"), "--karpenter: no --virtual pool")
    dra = mokka("cluster", "up", "--dir", base, "--karpenter", "--virtual", "h100=0", "--allocator", "dra")
    one_error_line(dra, "--allocator dra")
    assert not (tmp_path / "c").exists()


def test_up_needs_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    base = tmp_path / "c"
    tmp_path.chmod(0o777)
    one_error_line(mokka("cluster", "up", "--dir", str(base), user=65534), "needs root", str(base))
    assert not base.exists()


def test_down_needs_root(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    state = tmp_path / "cluster.json"
    state.write_text(json.dumps({"options": {}, "ports": {}}))
    # pytest's directories are root's alone: unreadable state is one line too
    one_error_line(mokka("cluster", "down", "--dir", str(tmp_path), user=65534), "cannot read", str(tmp_path))
    with tempfile.TemporaryDirectory(prefix="mokka-cluster-") as readable:
        Path(readable).chmod(0o755)
        shutil.copy(state, readable)
        (Path(readable) / "cluster.json").chmod(0o644)
        one_error_line(mokka("cluster", "down", "--dir", readable, user=65534), "needs root", readable)
        assert (Path(readable) / "cluster.json").exists()


@pytest.mark.slow
def test_bench_cluster_prints_every_figure_with_its_target() -> None:
    require_root()
    ensure_binaries()
    res = mokka("bench", "cluster", "--ups", "1", "--pods", "1")
    assert res.returncode == 0, res.stderr
    for figure in ("-> node Ready", "GPUs allocatable + GFD", "cluster down", "pod with 2 GPUs", "pod without GPUs"):
        assert figure in res.stdout, res.stdout
    assert "<= 30 s" in res.stdout and "<= 1.2" in res.stdout
    assert "ratio (2 GPUs / none)" in res.stdout


def test_bench_cluster_fleet_prints_every_figure_with_its_target() -> None:
    require_root()
    ensure_binaries()
    res = mokka("bench", "cluster", "--ups", "1", "--node", "h100:1", "--node", "t4:1")
    assert res.returncode == 0, res.stderr
    for size in (1, 2, 3, 4):
        assert f"{size} node(s): cluster up (warm) -> all Ready" in res.stdout, res.stdout
    assert "<= 45 s" in res.stdout and "RSS per node" in res.stdout and "<= 400 MiB" in res.stdout
    assert "RSS of the control plane" in res.stdout


def test_bench_cluster_refuses_zero_runs() -> None:
    res = mokka("bench", "cluster", "--ups", "0")
    assert res.returncode == 2 and "--ups" in res.stderr and "Traceback" not in res.stderr
