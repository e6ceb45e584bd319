"""NVML events from injected faults, received by nvidia-ml-py event sets in another process.

Each Xid is delivered once, in the order raised, with its code as eventData; events raised
before nvmlDeviceRegisterEvents are not; a set gets only the types it registered. The
consumer waits with a long timeout and nothing asserts on time: a wait that returned an
event (not a timeout) while the test applied it proves the sleeper was woken.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from fault_fixtures import FaultNode

from gpumodel import faults
from gpumodel import faultspec as fs

pytestmark = pytest.mark.consumers

CONSUMER = r"""
import sys, pynvml as N
N.nvmlInit()
types = int(sys.argv[1]); count = int(sys.argv[2]); timeout = int(sys.argv[3])
s = N.nvmlEventSetCreate()
for i in range(N.nvmlDeviceGetCount()):
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(i), types, s)
print("ready", flush=True)
for _ in range(count):
    try:
        e = N.nvmlEventSetWait(s, timeout)
    except N.NVMLError_Timeout:
        print("timeout", flush=True)
        continue
    print(N.nvmlDeviceGetIndex(e.device), e.eventType, e.eventData, N.nvmlDeviceGetUUID(e.device), flush=True)
"""


class Consumer:
    def __init__(self, node: FaultNode, types: int, count: int, timeout_ms: int = 60_000) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, str(types), str(count), str(timeout_ms)],
            env=node.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready", self.proc.stderr.read() if self.proc.stderr else ""

    def lines(self) -> list[list[str]]:
        # Read through the same buffered reader as "ready": lines printed right after it may be
        # in its buffer already, where communicate() (reading the pipe itself) would miss them.
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out = self.proc.stdout.read()
        err = self.proc.stderr.read()
        self.proc.wait(timeout=180)
        assert self.proc.returncode == 0, err
        return [line.split() for line in out.splitlines()]


def test_an_xid_reaches_an_event_set_with_its_code(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 4)
    consumer = Consumer(node, 0x8, 1)
    node.fault("xid", "48", "--gpu", "1")
    [(index, event_type, data, uuid)] = consumer.lines()
    gpu1 = faults.gpus(node.target)[1]
    assert (index, event_type, data, uuid) == ("1", "8", "48", gpu1.uuid)


def test_quick_successive_xids_are_each_delivered_in_order(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 4)
    consumer = Consumer(node, 0x8, 12)
    available = faults.gpus(node.target)
    codes = [13, 31, 43, 45, 68, 109, 119, 120, 62, 92, 94, 95]
    for i, code in enumerate(codes):  # twelve updates in a row, across GPUs, no pause
        faults.apply(node.target, [([available[i % 4]], fs.Xid(code=code))])
    got = consumer.lines()
    assert [(int(i), int(d)) for i, _t, d, _u in got] == [(i % 4, c) for i, c in enumerate(codes)]


def test_one_update_with_several_xids_delivers_them_all(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    consumer = Consumer(node, 0x8, 3)
    gpus = faults.gpus(node.target)
    faults.apply(node.target, [(gpus, fs.Xid(code=13)), ([gpus[1]], fs.Xid(code=31))])
    assert [(int(i), int(d)) for i, _t, d, _u in consumer.lines()] == [(0, 13), (1, 13), (1, 31)]


def test_events_before_registration_are_not_delivered(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    node.fault("xid", "13", "--gpu", "0")
    consumer = Consumer(node, 0x8, 2, timeout_ms=0)  # the first wait returns at once
    node.fault("xid", "31", "--gpu", "0")
    lines = consumer.lines()
    assert lines[0] == ["timeout"] or [int(x) for x in lines[0][:3]] == [0, 8, 31]
    assert ["0", "8", "13"] not in [line[:3] for line in lines]


def test_a_set_gets_only_the_types_it_registered(fault_node: Callable[..., FaultNode]) -> None:
    """The device plugin's mask (Xid | DBE | SBE); ECC faults raise the ECC events."""
    node = fault_node("h100", 2)
    dbe_only = Consumer(node, 0x2, 1)
    everything = Consumer(node, 0xB, 5)
    node.fault("xid", "13", "--gpu", "1")
    node.fault("ecc", "--corrected", "3", "--uncorrected", "1", "--gpu", "1")
    assert [line[:3] for line in dbe_only.lines()] == [["1", "2", "0"]]
    # corrected: SBE; uncorrected in DRAM: DBE, then Xid 48 and (row remap pending) Xid 63
    assert [line[:3] for line in everything.lines()] == [
        ["1", "8", "13"],
        ["1", "1", "0"],
        ["1", "2", "0"],
        ["1", "8", "48"],
        ["1", "8", "63"],
    ]


def test_aggregate_only_ecc_raises_no_event(fault_node: Callable[..., FaultNode]) -> None:
    """Errors counted only in the aggregate counters happened before this driver load."""
    node = fault_node("h100", 1)
    consumer = Consumer(node, 0xB, 2, timeout_ms=0)
    node.fault("ecc", "--aggregate", "--uncorrected", "2")
    node.fault("xid", "13")
    lines = consumer.lines()
    assert all(line == ["timeout"] or line[:3] == ["0", "8", "13"] for line in lines), lines


def test_the_lost_gpu_xid_arrives_with_a_handle_that_still_names_it(fault_node: Callable[..., FaultNode]) -> None:
    """What the device plugin does with an Xid: nvmlDeviceGetUUID on the event's device."""
    node = fault_node("h100", 4)
    consumer = Consumer(node, 0xB, 2, timeout_ms=2_000)
    node.fault("xid", "79", "--gpu", "3")
    lines = consumer.lines()
    assert lines[0] == ["3", "8", "79", faults.gpus(node.target)[3].uuid]
    assert lines[1] == ["timeout"], "no GPU_IS_LOST from the wait: the other GPUs are fine"


def test_a_state_compiled_afresh_keeps_delivering(fault_node: Callable[..., FaultNode]) -> None:
    """A host setup re-run refreshes the state in place (its event counts start over): a set
    that had consumed events before still gets the new ones."""
    from gpumodel import driver_root

    node = fault_node("h100", 2)
    consumer = Consumer(node, 0x8, 3)
    for code in (13, 31):
        node.fault("xid", str(code), "--gpu", "0")
    driver_root.stage(node.profile, node.root.root)  # refreshed in place: the same inode
    node.fault("xid", "43", "--gpu", "0")  # GPU 0's count starts over below what the set consumed
    assert [(int(i), int(d)) for i, _t, d, _u in consumer.lines()] == [(0, 13), (0, 31), (0, 43)]
