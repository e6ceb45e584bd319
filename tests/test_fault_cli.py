"""`mokka fault`: bad input is one line and changes nothing; `list`; the kernel log lines;
faults outlive their consumers and leave with `host cleanup`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_fixtures import FaultNode

from gpumodel import faults, profile
from gpumodel import faultspec as fs
from hostsetup import node as hostnode

BAD = [
    (["xid", "79", "--gpu", "9"], "no GPU '9' on this node (indices 0-3, or a GPU UUID), --gpu"),
    (["xid", "0"], "xid: Input should be greater than or equal to 1, CODE"),
    (["xid", "13", "--message", "two\nlines"], "xid: must be a single line, --message"),
    (["temperature", "500"], "temperature: Input should be less than or equal to 200, CELSIUS"),
    (["temperature", "90", "--over", "soon"], "'soon' is not a duration (e.g. 30s, 500ms, 2m, 1h30m, 90), --over"),
    (["ecc"], "ecc: give --corrected N and/or --uncorrected N (at least one above 0), ecc"),
    (["ecc", "--uncorrected", "-1"], "ecc: Input should be greater than or equal to 0, --uncorrected"),
    (["power-limit", "5000", "--gpu", "0"], "5000 W is outside GPU 0's limits 200-700 W, power-limit"),
    (["nvlink", "18", "down"], "nvlink: Input should be less than or equal to 17, LINK"),
    (
        ["nvlink", "1", "errors"],
        "nvlink-errors: give --crc, --replay and/or --recovery N (at least one above 0), nvlink-errors",
    ),
    (
        ["nvlink", "1", "up", "--crc", "2"],
        "--crc, --replay and --recovery go with `nvlink LINK errors`, not `up`, nvlink",
    ),
    (["remap", "--uncorrectable", "1"], None),  # fine on an H100: checked separately on a T4
    (["retire", "--dbe", "1"], "GPU 0: this board does not retire pages (it remaps rows), retire"),
    (["clocks", "99999"], "SM clock 99999 MHz is above GPU 0's maximum 1980 MHz, clocks"),
    (
        ["temperature", "80", "--memory", "70", "--gpu", "0,7"],
        "no GPU '7' on this node (indices 0-3, or a GPU UUID), --gpu",
    ),
]


@pytest.mark.parametrize(
    "args,message", [b for b in BAD if b[1] is not None], ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_bad_input_is_one_line_and_changes_nothing(
    fault_node: Callable[..., FaultNode], args: list[str], message: str
) -> None:
    node = fault_node("h100", 4)
    node.fault("xid", "13", "--gpu", "1")  # some state and log to keep
    before, log = node.state_bytes, node.kernel_log
    res = node.fault(*args, check=False)
    assert res.returncode != 0
    assert res.stderr == f"mokka: error: {message}\n"
    assert res.stdout == ""
    assert node.state_bytes == before and node.kernel_log == log


def test_where_the_node_is_bad_input_too(fault_node: Callable[..., FaultNode], tmp_path: Path) -> None:
    node = fault_node("h100", 1)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mokka.cli", "fault", *args], capture_output=True, text=True)

    cases = [
        (["xid", "13", "--root", str(tmp_path / "none")], f"{tmp_path / 'none'}: no staged node here"),
        (["xid", "13", "--driver-root", str(tmp_path)], f"{tmp_path}: no libnvidia-ml.so.<version> under usr/lib64"),
        (["xid", "13", "--state", str(tmp_path / "x")], f"{tmp_path / 'x'}: no such file, --state"),
        (
            ["list", "--root", "/r", "--driver-root", str(node.root.root)],
            "give one of --root, --driver-root, --state and --node",
        ),
    ]
    truncated = tmp_path / "truncated"
    truncated.write_bytes(node.state_bytes[:5000])
    cases.append((["xid", "13", "--state", str(truncated)], f"{truncated}: "))
    for args, start in cases:
        res = run(*args)
        assert res.returncode != 0 and res.stderr.startswith(f"mokka: error: {start}"), res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_remap_on_a_board_that_retires_pages(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("t4", 1)
    before = node.state_bytes
    res = node.fault("remap", "--uncorrectable", "1", check=False)
    assert res.stderr == "mokka: error: GPU 0: this board does not remap rows (retire pages instead), remap\n"
    assert node.state_bytes == before


def test_list_shows_what_is_in_effect(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    assert node.fault("list").stdout == "no faults in effect\n"
    node.fault("temperature", "70", "--from", "40", "--over", "2m", "--gpu", "0")
    node.fault("power-limit", "500", "--gpu", "0")
    node.fault("ecc", "--uncorrected", "1", "--gpu", "1")
    out = node.fault("list").stdout
    assert out.splitlines() == [
        "GPU 0:",
        "  temperature 40 -> 70 C over 120 s",
        "  power limit 500 W",
        "GPU 1:",
        "  ECC uncorrected volatile dram +1",
        "  ECC uncorrected aggregate dram +1",
        "  remapped rows +0 correctable +1 uncorrectable",
        "  row remap pending",
        "  events raised: 3 (latest: double-bit ECC, Xid 48, Xid 63)",
    ]


SYSLOG = r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: \[ *\d+\.\d{6}\] "


def test_the_kernel_log_has_the_drivers_lines(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    gpus = faults.gpus(node.target)
    pci = [re.sub(r"^0000(....):(..):(..)\.\d$", r"\1:\2:\3", g.bus_id).lower() for g in gpus]
    node.fault("xid", "13", "--gpu", "0")
    node.fault("xid", "31", "--gpu", "0", "--pid", "4242", "--process", "python3", "--message", "Ch 0000000a")
    node.fault("lost", "--gpu", "1")
    lines = node.kernel_log.splitlines()
    assert all(re.match(SYSLOG, line) for line in lines), lines
    messages = [re.sub(SYSLOG, "", line) for line in lines]
    assert messages == [
        f"NVRM: GPU at PCI:{pci[0]}: {gpus[0].uuid}",
        f"NVRM: GPU Board Serial Number: {gpus[0].serial}",
        f"NVRM: Xid (PCI:{pci[0]}): 13, pid='<unknown>', name=<unknown>, "
        "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter",
        f"NVRM: Xid (PCI:{pci[0]}): 31, pid=4242, name=python3, Ch 0000000a",
        f"NVRM: GPU at PCI:{pci[1]}: {gpus[1].uuid}",
        f"NVRM: GPU Board Serial Number: {gpus[1].serial}",
        f"NVRM: Xid (PCI:{pci[1]}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        f"NVRM: GPU {pci[1]}.0: GPU has fallen off the bus.",
        f"NVRM: GPU {pci[1]}.0: GPU serial number is {gpus[1].serial}.",
    ]
    # gpud's pattern for Xid lines
    assert [int(m) for m in re.findall(r"NVRM: Xid.*?: (\d+),", node.kernel_log)] == [13, 31, 79]


def test_faults_outlive_the_consumers(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    faults.apply(node.target, [(faults.gpus(node.target)[:1], fs.Temperature(celsius=77))])
    code = "import pynvml as N; N.nvmlInit(); print(N.nvmlDeviceGetTemperature(N.nvmlDeviceGetHandleByIndex(0), 0))"
    assert [node.python(code).stdout for _ in range(2)] == ["77\n", "77\n"]


def test_host_cleanup_removes_faults_and_their_log(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("host setup makes device nodes: needs root")
    root = tmp_path / "root"
    hostnode.apply(hostnode.plan(profile.load("h100").with_count(2), hostnode.Options(root=root)))
    target = faults.for_root(root)
    assert target.kernel_log == root / "driver/var/log/kern.log" and target.kernel_log.read_text() == ""
    res = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "fault", "xid", "79", "--gpu", "1", "--root", str(root)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert res.stdout.startswith("GPU 1: Xid 79")
    assert "Xid" in target.kernel_log.read_text()
    hostnode.apply(hostnode.plan(profile.load("h100").with_count(2), hostnode.Options(root=root)))
    assert "Xid" in target.kernel_log.read_text(), "a re-run keeps the log"
    hostnode.cleanup(root)
    assert not root.exists() or not any(root.iterdir())


def test_containers_get_the_kernel_log(tmp_path: Path) -> None:
    """The edits model (NRI and CDI alike) mounts the staged kernel log read-only at /var/log/kern.log."""
    from gpumodel import edits, nodelayout

    if os.geteuid() != 0:
        pytest.skip("host setup makes device nodes: needs root")
    root = tmp_path / "root"
    hostnode.apply(hostnode.plan(profile.load("h100").with_count(1), hostnode.Options(root=root)))
    layout = nodelayout.NodeLayout.load(root)
    mounts = {m.container_path: m for m in edits.container_edits(layout, layout.gpus).mounts}
    log = mounts["/var/log/kern.log"]
    assert log.host_path == str(root / "driver/var/log/kern.log") and "ro" in log.options
    hostnode.cleanup(root)
