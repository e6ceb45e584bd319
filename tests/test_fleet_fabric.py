"""A node's NVLink domain through the real NVML consumers: racks (gpumodel.fleet.in_rack) and the
fabric manager's delay (with_fabric_delay), read by nvidia-ml-py and nvidia-smi 550 as the
device plugin, GFD and NVIDIA's DRA driver read them (nvmlDeviceGetGpuFabricInfo / ...InfoV)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import Staged

from fetch import nvidia_smi
from gpumodel import driver_root, fleet, profile

READ = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(h, pynvml.byref(info))
    uuid = bytes(info.clusterUuid).hex()
    out.append([info.state, info.status, info.cliqueId, uuid])
print(json.dumps(out))
"""


def fabric(staged: Staged) -> list[list[object]]:
    return json.loads(staged.python(READ).stdout)  # type: ignore[no-any-return]


def staged(prof: profile.Profile, out: Path) -> Staged:
    return Staged(driver_root.stage(prof, out), prof)


def test_nodes_of_one_rack_report_one_domain(tmp_path: Path) -> None:
    base = profile.load("h100").with_count(2)
    a = staged(fleet.in_rack(fleet.as_node(base, "a"), "r1"), tmp_path / "a")
    b = staged(fleet.in_rack(fleet.as_node(base, "b"), "r1"), tmp_path / "b")
    c = staged(fleet.in_rack(fleet.as_node(base, "c"), "r2"), tmp_path / "c")
    r1 = fleet.rack_cluster_uuid("r1").replace("-", "")
    completed = [3, 0, 1, r1]  # NVML_GPU_FABRIC_STATE_COMPLETED, NVML_SUCCESS, clique 1
    assert fabric(a) == fabric(b) == [completed, completed]
    assert {tuple(g[3:]) for g in fabric(c)} == {(fleet.rack_cluster_uuid("r2").replace("-", ""),)}


def test_the_fabric_manager_delay_reads_in_progress_then_completed(tmp_path: Path) -> None:
    prof = fleet.with_fabric_delay(fleet.in_rack(profile.load("h100").with_count(1), "r1"), 2)
    node = staged(prof, tmp_path / "n")
    assert fabric(node) == [[2, 27, 1, fleet.rack_cluster_uuid("r1").replace("-", "")]]  # IN_PROGRESS, NOT_READY
    smi = nvidia_smi.fetch("550")
    xml = node.run([str(smi), "-q", "-x"]).stdout
    assert "<state>In Progress</state>" in xml
    deadline = time.monotonic() + 10
    while fabric(node)[0][0] != 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fabric(node)[0][:3] == [3, 0, 1]
    assert "<state>Completed</state>" in node.run([str(smi), "-q", "-x"]).stdout


def test_host_setup_refuses_a_rack_for_a_board_without_fabric(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "mokka.cli", "host", "setup", "--profile", "t4", "--root", str(tmp_path / "r")]
    res = subprocess.run([*argv, "--rack", "r1", "--no-nvidia-smi"], capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "mokka: error: profile t4: Tesla T4 has no NVLink fabric (fabric state Not Supported), "
        "so it cannot be in rack 'r1', --rack/--fabric-delay"
    ]
    assert not (tmp_path / "r").exists()
