"""Injected faults as the real nvidia-smi (550 and 535) and nvidia-ml-py see them: a lost GPU,
ECC counts, remapped rows and retired pages, temperatures and the clock-event reasons that
follow, power, utilization, NVLink state and error counters; `clear` and `clear --all`."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_fixtures import FaultNode

from gpumodel import faults

pytestmark = pytest.mark.consumers

LOST_LINE = "Unable to determine the device handle for GPU{bus}: GPU is lost.  Reboot the system to recover this GPU"


def field(text: str, label: str, after: str | None = None) -> str:
    """The value of the first `label : value` line (after the line containing `after`)."""
    if after is not None:
        text = text[text.index(after) :]
    match = re.search(rf"^\s*{re.escape(label)}\s*:\s*(.*?)\s*$", text, re.M)
    assert match, f"no {label!r} in\n{text}"
    return match.group(1)


def legacy_bus(bus_id: str) -> str:
    dom, rest = bus_id.split(":", 1)
    return f"{int(dom, 16):04X}:{rest}"


def test_a_lost_gpu_as_nvidia_smi_reports_it(fault_node: Callable[..., FaultNode], smi: tuple[str, Path]) -> None:
    node = fault_node("h100", 4)
    _, exe = smi
    node.fault("xid", "79", "--gpu", "3")
    bus = legacy_bus(faults.gpus(node.target)[3].bus_id)
    plain = node.smi(exe, check=False)
    assert plain.returncode == 15
    assert plain.stdout.splitlines()[0] == LOST_LINE.format(bus=bus)
    listing = node.smi(exe, "-L", check=False)
    assert listing.returncode == 15
    assert listing.stdout.count("(UUID: GPU-") == 3
    assert f"for gpu {bus}: GPU is lost." in listing.stdout
    query = node.smi(exe, "--query-gpu=index,temperature.gpu", "--format=csv", check=False)
    assert query.returncode == 15 and "GPU is lost" in query.stdout and "index" not in query.stdout
    assert "NVIDIA H100" in node.smi(exe, "-i", "0").stdout  # the others answer
    node.fault("clear", "--gpu", "3")
    assert node.smi(exe).returncode == 0


def test_a_lost_gpu_through_nvidia_ml_py(fault_node: Callable[..., FaultNode]) -> None:
    """A handle taken before the loss still names its GPU; everything else is GPU_IS_LOST."""
    node = fault_node("h100", 4)
    code = r"""
import sys, pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(3)
uuid = N.nvmlDeviceGetUUID(h)
print("held", flush=True)
sys.stdin.readline()
def outcome(f):
    try:
        return repr(f())
    except N.NVMLError as e:
        return type(e).__name__
print(N.nvmlDeviceGetUUID(h) == uuid, N.nvmlDeviceGetIndex(h), N.nvmlDeviceGetPciInfo(h).busId)
print(outcome(lambda: N.nvmlDeviceGetTemperature(h, 0)))
print(outcome(lambda: N.nvmlDeviceGetHandleByIndex(3)))
print(outcome(lambda: N.nvmlDeviceGetHandleByUUID(uuid)))
print(outcome(lambda: N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(2))))
"""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=node.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "held\n"  # the handle is taken before the loss, not raced with it
    node.fault("lost", "--gpu", "3")
    out, _ = proc.communicate("\n", timeout=60)
    lines = out.splitlines()
    bus = faults.gpus(node.target)[3].bus_id
    assert lines[0].split() == ["True", "3", bus]
    assert lines[1:4] == ["NVMLError_GpuIsLost"] * 3
    assert lines[4] == repr("NVIDIA H100 80GB HBM3")


def test_ecc_counts_and_remapped_rows(fault_node: Callable[..., FaultNode], smi: tuple[str, Path]) -> None:
    node = fault_node("h100", 2)
    _, exe = smi
    node.fault("ecc", "--corrected", "5", "--gpu", "0")
    node.fault("ecc", "--uncorrected", "2", "--gpu", "0")
    node.fault("ecc", "--aggregate", "--uncorrected", "4", "--gpu", "0")
    q = node.smi(exe, "-q", "-i", "0", "-d", "ECC,ROW_REMAPPER").stdout
    assert field(q, "DRAM Correctable", after="Volatile") == "5"
    assert field(q, "DRAM Uncorrectable", after="Volatile") == "2"
    assert field(q, "DRAM Uncorrectable", after="Aggregate") == "6"
    assert field(q, "Uncorrectable Error", after="Remapped Rows") == "2"
    assert field(q, "Pending", after="Remapped Rows") == "Yes"
    assert field(q, "Remapping Failure Occurred") == "No"
    assert field(q, "High", after="Bank Remap Availability Histogram") == "2 bank(s)"
    table = node.smi(exe, "-i", "0").stdout
    assert re.search(r"\|\s+2 \|\n", table), table  # "Volatile Uncorr. ECC"
    node.fault("remap", "--failure", "--gpu", "0")
    q = node.smi(exe, "-q", "-i", "0", "-d", "ROW_REMAPPER").stdout
    assert field(q, "Remapping Failure Occurred") == "Yes"
    assert field(q, "None", after="Bank Remap Availability Histogram") == "1 bank(s)"

    node.fault("clear", "--gpu", "0")  # a reset: volatile counts and the pending remap go
    q = node.smi(exe, "-q", "-i", "0", "-d", "ECC,ROW_REMAPPER").stdout
    assert field(q, "DRAM Uncorrectable", after="Volatile") == "0"
    assert field(q, "DRAM Uncorrectable", after="Aggregate") == "6"
    assert field(q, "Pending", after="Remapped Rows") == "No"
    assert field(q, "Uncorrectable Error", after="Remapped Rows") == "2"
    assert field(q, "Remapping Failure Occurred") == "Yes"
    node.fault("clear", "--all", "--gpu", "0")
    q = node.smi(exe, "-q", "-i", "0", "-d", "ECC,ROW_REMAPPER").stdout
    assert field(q, "DRAM Uncorrectable", after="Aggregate") == "0"
    assert field(q, "Uncorrectable Error", after="Remapped Rows") == "0"
    assert field(q, "Remapping Failure Occurred") == "No"
    assert field(q, "Max", after="Bank Remap Availability Histogram") == "2560 bank(s)"


def test_retired_pages_on_a_board_that_retires_them(
    fault_node: Callable[..., FaultNode], smi: tuple[str, Path]
) -> None:
    node = fault_node("t4", 2)
    _, exe = smi
    node.fault("retire", "--dbe", "2", "--sbe", "1", "--gpu", "0")
    node.fault("ecc", "--uncorrected", "1", "--gpu", "0")  # a DBE in DRAM retires one more page
    q = node.smi(exe, "-q", "-i", "0", "-d", "PAGE_RETIREMENT").stdout
    assert field(q, "Single Bit ECC", after="Retired Pages") == "1"
    assert field(q, "Double Bit ECC", after="Retired Pages") == "3"
    assert field(q, "Pending Page Blacklist") == "Yes"
    pages = node.smi(exe, "--query-retired-pages=gpu_uuid,retired_pages.address,retired_pages.cause",
                     "--format=csv,noheader").stdout.splitlines()  # fmt: skip
    assert len(pages) == 4 and sum("Double Bit ECC" in p for p in pages) == 3
    assert "Dynamic Page Retirement: New retired page, reload the driver to activate." in node.kernel_log
    node.fault("clear", "--all")
    q = node.smi(exe, "-q", "-i", "0", "-d", "PAGE_RETIREMENT").stdout
    assert field(q, "Double Bit ECC", after="Retired Pages") == "0"
    assert field(q, "Pending Page Blacklist") == "No"


def test_temperature_power_and_the_reasons_that_follow(
    fault_node: Callable[..., FaultNode], smi: tuple[str, Path]
) -> None:
    node = fault_node("h100", 2)
    _, exe = smi
    sm = int(node.smi(exe, "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0").stdout)
    node.fault("temperature", "95", "--memory", "88", "--gpu", "0")
    q = node.smi(exe, "-q", "-i", "0", "-d", "TEMPERATURE,PERFORMANCE").stdout
    assert field(q, "GPU Current Temp") == "95 C"
    assert field(q, "Memory Current Temp") == "88 C"
    assert field(q, "HW Slowdown") == "Active"
    assert field(q, "HW Thermal Slowdown") == "Active"
    assert field(q, "SW Thermal Slowdown") == "Active"
    assert field(q, "SW Power Cap") == "Not Active"
    assert int(node.smi(exe, "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0").stdout) == sm // 2
    other = node.smi(exe, "-q", "-i", "1", "-d", "PERFORMANCE").stdout
    assert field(other, "HW Slowdown") == "Not Active"

    node.fault("power-limit", "400", "--gpu", "1")
    node.fault("power", "450", "--gpu", "1")
    node.fault("utilization", "80", "35", "--gpu", "1")
    query = "power.draw,power.limit,utilization.gpu,utilization.memory"
    out = node.smi(exe, f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "1").stdout
    assert out.split(", ") == ["450.00", "400.00", "80", "35\n"]
    q = node.smi(exe, "-q", "-i", "1", "-d", "PERFORMANCE").stdout
    assert field(q, "SW Power Cap") == "Active"
    assert field(q, "Idle") == "Not Active"
    node.fault("clear")
    q = node.smi(exe, "-q", "-d", "PERFORMANCE,TEMPERATURE").stdout
    assert "Active" not in q.replace("Not Active", "").replace("Idle                              : Active", "")
    assert field(q, "GPU Current Temp") != "95 C"


def test_clocks(fault_node: Callable[..., FaultNode], smi: tuple[str, Path]) -> None:
    node = fault_node("h100", 1)
    _, exe = smi
    node.fault("clocks", "1200", "2000")
    out = node.smi(exe, "--query-gpu=clocks.sm,clocks.gr,clocks.mem", "--format=csv,noheader,nounits").stdout
    assert out.split(", ") == ["1200", "1200", "2000\n"]
    res = node.fault("clocks", "9999", check=False)
    assert res.returncode != 0 and res.stderr.startswith("mokka: error: SM clock 9999 MHz is above")


def test_nvlink_down_and_error_counters(fault_node: Callable[..., FaultNode], smi: tuple[str, Path]) -> None:
    node = fault_node("h100", 2)
    _, exe = smi
    node.fault("nvlink", "2", "down", "--gpu", "0")
    node.fault("nvlink", "1", "errors", "--crc", "5", "--replay", "3", "--recovery", "1", "--gpu", "0")
    status = node.smi(exe, "nvlink", "-s", "-i", "0").stdout
    assert "Link 2: <inactive>" in status and "Link 1: 26.562 GB/s" in status
    errors = node.smi(exe, "nvlink", "-e", "-i", "0").stdout
    assert "Link 1: Replay Errors: 3" in errors
    assert "Link 1: Recovery Errors: 1" in errors
    assert "Link 1: CRC Errors: 5" in errors
    assert "Link 0: CRC Errors: 0" in errors
    assert "NVLink: fatal error detected on link 2(" in node.kernel_log
    node.fault("nvlink", "2", "up", "--gpu", "0")
    assert "<inactive>" not in node.smi(exe, "nvlink", "-s", "-i", "0").stdout
    node.fault("clear")
    assert "Link 1: CRC Errors: 0" in node.smi(exe, "nvlink", "-e", "-i", "0").stdout


def test_fabric_degraded_and_in_progress(fault_node: Callable[..., FaultNode], smi: tuple[str, Path]) -> None:
    """A GB200 tray's fabric: bandwidth degraded (probe still Completed, the clique kept), the probe
    In Progress (no clique), healthy again; every GPU, as a whole rack's fault reaches them."""
    node = fault_node("gb200", 4)
    version, exe = smi

    def fabrics() -> list[tuple[str, ...]]:
        """Each GPU's fabric probe state, clique and bandwidth (535 prints only the state and status;
        the health mask is 550's)."""
        out = node.smi(exe, "-q").stdout
        sections = out.split("    Fabric\n")[1:]
        if version == "535":
            return [(field(s, "State"), "2" if field(s, "State") == "Completed" else "N/A", "-") for s in sections]
        bandwidth = [field(s, "Bandwidth") if version == "550" else "-" for s in sections]
        return [(field(s, "State"), field(s, "CliqueId"), bw) for s, bw in zip(sections, bandwidth, strict=True)]

    full, degraded, na = ("Full", "Degraded", "N/A") if version == "550" else ("-", "-", "-")
    assert fabrics() == [("Completed", "2", full)] * 4
    node.fault("fabric", "degraded")
    assert fabrics() == [("Completed", "2", degraded)] * 4
    node.fault("fabric", "in-progress", "--gpu", "1")
    assert fabrics()[1] == ("In Progress", "N/A", na)
    listed = node.fault("list").stdout
    assert "GPU 1:\n  fabric probe In Progress\n" in listed and "GPU 0:\n  fabric bandwidth degraded\n" in listed
    node.fault("fabric", "healthy", "--gpu", "0")
    assert fabrics()[:2] == [("Completed", "2", full), ("In Progress", "N/A", na)]
    node.fault("clear")
    assert fabrics() == [("Completed", "2", full)] * 4


def test_fabric_faults_need_a_fabric_that_reports_them(fault_node: Callable[..., FaultNode]) -> None:
    t4 = fault_node("t4", 1)
    res = t4.fault("fabric", "in-progress", check=False)
    assert res.returncode != 0 and res.stderr.strip().splitlines() == [
        "mokka: error: GPU 0 has no NVLink fabric (fabric state Not Supported), fabric"
    ]
    h100 = fault_node("h100", 1)
    before = h100.state_bytes
    res = h100.fault("fabric", "degraded", check=False)
    assert res.stderr.strip().splitlines() == [
        "mokka: error: GPU 0 reports no fabric health (the profile's fabric has no degraded_bandwidth), fabric"
    ]
    assert h100.state_bytes == before
    h100.fault("fabric", "in-progress")  # its probe, though, can be In Progress
