"""The benchmark commands run and print their figures (they are never timed by tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fetch import dcgm_exporter, thirdparty

pytestmark = [pytest.mark.slow, pytest.mark.consumers]


def bench(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "bench", *args], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_bench_nvml_prints_every_figure(tmp_path: Path) -> None:
    out = bench("nvml", "--calls", "10000", "--svg", str(tmp_path))
    for figure in (
        "nvmlDeviceGetPowerUsage (ns/call)",
        "nvmlInit_v2 in a fresh process",
        "library size",
        "nvidia-smi -q -x",
        "nvidia-smi -L",
        "peak RSS (MiB)",
        "nvmlDeviceGetMigDeviceHandleByIndex (ns/call)",
        "nvmlDeviceGetMemoryInfo, MIG device (ns/call)",
        "create + destroy a GI and its CI (us)",
    ):
        assert figure in out
    # Every figure that has a target says whether it met it.
    judged = [ln for ln in out.splitlines() if ln.endswith((" ok", " MISSED"))]
    assert len(judged) == 9, out  # 3 call costs (one with the counter stuck), 2 MIG getters, init, size, 2x RSS
    assert sorted(p.name for p in tmp_path.glob("*.svg")) == ["nvidia-smi.svg", "nvml-calls.svg", "nvml-init.svg"]
    assert "GetMigDevice-" in (tmp_path / "nvml-calls.svg").read_text()
    assert "no library" in (tmp_path / "nvidia-smi.svg").read_text()


def test_bench_host_setup() -> None:
    out = bench("host-setup", "--rounds", "1")
    assert "h100 x8" in out and "h100 x64" in out
    assert all(ln.endswith((" ok", " MISSED")) for ln in out.splitlines() if ln.startswith("h100 x"))


def test_bench_nri(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("starts a private containerd: needs root")
    peer = thirdparty.directory("MOKKA_NRI_PEER_DIR", "nvml-mock-nri")  # upstream's Go plugin, where it is
    out = bench(
        "nri", "--containerd", "2.1", "--rounds", "1", "--creates", "3", "--restarts", "1", "--kills", "1",
        "--sync-containers", "3", "--background-pods", "2", "--chaos", "--chaos-creates", "5",
        *(["--peer", str(peer)] if peer else []),
        "--svg", str(tmp_path),
    )  # fmt: skip
    plots = sorted(p.name for p in tmp_path.glob("*.svg"))
    assert plots == ["nri-added-latency.svg", "nri-containerd-cpu.svg", "nri-plugin-cpu.svg", "nri-plugin-rss.svg"]
    assert "containerd 2.1" in (tmp_path / "nri-plugin-cpu.svg").read_text()
    if peer:
        for figure in ("added by the Go peer, device opt-in", "Go peer CPU per container", "Go peer RSS"):
            assert figure in out, out
    for figure in (
        "containerd's own CPU per container",
        "CreateContainer median, no plugin",
        "CreateContainer median, CDI edits, no plugin",
        "added by the plugin, median",
        "plugin CPU per container",
        "plugin handling p99",
        "plugin process RSS",
        "start -> registered",
        "SIGKILL -> replacement registered",
        "SIGSTOP -> replacement registered",
        "Synchronize with 3 containers, answering",
        "re-register after containerd restart",
        "failed creates",
        "not injected",
    ):
        assert figure in out, out


def test_bench_fault() -> None:
    out = bench("fault", "--gpus", "2", "--cli-rounds", "2", "--rounds", "5", "--calls", "10000")
    for figure in (
        "`mokka fault` returned -> a read sees it",
        "faults.apply() returned -> a read sees it",
        "reader process spinning meanwhile",
        "Xid: apply() returned -> EventSetWait returns",
        "stale reads after a return: 0 in 7 rounds",
        "nvmlDeviceGetPowerUsage (sine pattern)",
        "nvmlDeviceGetMemoryInfo (walk pattern)",
    ):
        assert figure in out


@pytest.mark.skipif(dcgm_exporter.default_counters() is None, reason="no dcgm-exporter (MOKKA_DCGM_DIR)")
def test_bench_dcgm(tmp_path: Path) -> None:
    out = bench("dcgm", "--rounds", "3", "--svg", str(tmp_path))
    for figure in (
        "/metrics scrape, 8 GPUs",
        "of it libdcgm, 8 GPUs",
        "exporter start, 8 GPUs",
        "/metrics scrape, 64 GPUs",
        "exporter start, 64 GPUs",
    ):
        assert figure in out, out
    assert "64 GPUs" in (tmp_path / "dcgm-scrape.svg").read_text()


def test_kind_bench_refuses_bad_counts_in_one_line() -> None:
    """``python -m kind.bench`` (mokka cluster up beside kind create cluster; run by hand, minutes)."""
    for bad in (["--nodes", "0"], ["--rounds", "0"]):
        res = subprocess.run([sys.executable, "-m", "kind.bench", *bad], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and res.stderr == "kind.bench: error: --nodes and --rounds must be at least 1\n"
