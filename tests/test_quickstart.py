"""The Quick start (docs/quickstart.md) as written: each ``sh`` block of its steps 1 to 3 is taken
from the page and run by bash, as root, in an empty directory with the checkout's ``.venv`` first on
the PATH (what the page tells a reader to do), and what the step says it shows is there. Steps 4 and
5 start clusters: test_cluster_cli.py (`mokka cluster up`, `down`) and test_kind_cluster.py (the
chart's `helm install` with default values) run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fetch import nvidia_smi
from mokka import demo

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "quickstart.md"


def steps() -> list[str]:
    """The page's ``sh`` blocks after "The first five minutes" (indented under their list item), dedented."""
    text = PAGE.read_text().split("## The first five minutes", 1)[1]
    return [textwrap.dedent(body) for _, body in re.findall(r"^( *)```sh\n(.*?)^\1```", text, re.M | re.S)]


def run(script: str, cwd: Path, path: str = "") -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{path}{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_page_has_a_block_for_steps_1_to_3() -> None:
    first = [block.split()[:2] for block in steps()]
    assert first == [["mokka", "demo"], ["mokka", "exec"], ["mokka", "driver-root"]]


def test_step1_a_container_sees_four_b200s(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mokka demo needs root")
    assert not demo.DEFAULT_BASE.exists(), f"{demo.DEFAULT_BASE} exists before the test"
    res = run(steps()[0], tmp_path)
    assert res.returncode == 0, res.stderr
    table = [line for line in res.stdout.splitlines() if line.startswith("|") and "NVIDIA B200" in line]
    assert len(table) == 4, res.stdout
    assert re.search(r"^b200\b", res.stdout, re.M) and re.search(r"^h100\b", res.stdout, re.M), res.stdout
    assert not demo.DEFAULT_BASE.exists()


def test_step2_nvidia_smi_on_a_throw_away_node(tmp_path: Path) -> None:
    res = run(steps()[1], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("NVIDIA H100 80GB HBM3") == 8, res.stdout[:2000]


def test_step3_a_gpu_falls_off_the_bus_and_a_scenario_replays(tmp_path: Path) -> None:
    res = run(steps()[2], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "GPU 3: Xid 79; lost: NVML answers GPU_IS_LOST" in res.stdout  # the fault
    assert "lost (fell off the bus)" in res.stdout  # fault list
    assert "GPU 3: cleared" in res.stdout  # fault clear
    assert "GPU 0: xid code=79" in res.stdout  # the scenario's last step
    # "With an nvidia-smi on the PATH, `...` shows GPU 0 lost, where the scenario left it"
    (line,) = re.findall(r"`(LD_LIBRARY_PATH=node/usr/lib64 nvidia-smi)` shows GPU 0 lost", PAGE.read_text())
    smi = run(f"{line} -L", tmp_path, path=f"{nvidia_smi.fetch('550').parent}:")
    assert "GPU is lost" in smi.stdout + smi.stderr, smi.stdout + smi.stderr
    assert smi.stdout.count("NVIDIA H100 80GB HBM3") == 7, smi.stdout
