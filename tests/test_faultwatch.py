"""The cluster's fault watcher on a node: its ConfigMap entry becomes the node's faults through
the path `mokka fault` takes; the same entry is applied once (a restarted watcher does not
raise its Xids again), a changed one replaces it, a removed one restores the profile, a bad
one changes nothing. (The watch itself, on a real API server, is in the cluster tests.)"""

from __future__ import annotations

import re
from collections.abc import Callable

from fault_fixtures import FaultNode

from gpumodel import faults
from k8snode.faultwatch import FaultWatcher, tag_of

ENTRY = "steps:\n  - {gpu: 1, xid: 79}\n  - {gpu: 0, temperature: 91}\n"


def watcher(node: FaultNode, lines: list[str]) -> FaultWatcher:
    return FaultWatcher(node.target, "ConfigMap mokka/mokka-faults key node-a", report=lines.append)


def xids(node: FaultNode) -> list[str]:
    return [line for line in node.kernel_log.splitlines() if "NVRM: Xid" in line]


def test_an_entry_becomes_the_nodes_faults_once(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    lines: list[str] = []
    w = watcher(node, lines)
    w.reconcile(ENTRY)
    w.wait()
    assert faults.active(node.target)[0] == ["temperature 91 C"]
    assert faults.active(node.target)[1][0] == "lost (fell off the bus)"
    assert faults.applied_tag(node.target) == tag_of(ENTRY)
    assert len(xids(node)) == 1
    assert lines[0] == "ConfigMap mokka/mokka-faults key node-a: 2 fault(s) to apply"
    # the watch repeats the entry (relist, a restarted watcher): nothing is raised again
    again: list[str] = []
    restarted = watcher(node, again)
    restarted.reconcile(ENTRY)
    restarted.wait()
    assert again == [] and len(xids(node)) == 1


def test_a_changed_entry_replaces_the_faults(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    w = watcher(node, [])
    w.reconcile(ENTRY)
    w.wait()
    w.reconcile("steps: [{gpu: 0, power: 650}]\n")
    w.wait()
    assert faults.active(node.target) == {0: ["power 650 W"], 1: ["events raised: 1 (latest: Xid 79)"]}
    w.reconcile(None)  # the key was removed
    assert faults.applied_tag(node.target) == 0
    assert faults.active(node.target) == {1: ["events raised: 1 (latest: Xid 79)"]}


def test_a_bad_entry_changes_nothing_and_is_reported_once(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("l40s", 1)
    w = watcher(node, lines := [])
    w.reconcile("steps: [{xid: 79}]")
    w.wait()
    before = node.state_bytes
    for bad in ("steps: [{nvlink: {link: 0, state: down}}]", "steps: [{xid: 1000}]"):
        w.reconcile(bad)
        w.reconcile(bad)
    assert node.state_bytes == before
    source = "error: ConfigMap mokka/mokka-faults key node-a"
    assert [line for line in lines if line.startswith("error:")] == [
        f"{source}: steps.0: GPU 0 has no NVLink: no link 0, nvlink (nothing changed)",
        f"{source}: steps.0.xid.code: Input should be less than or equal to 999 (nothing changed)",
    ]


def test_a_newer_entry_cancels_a_running_timeline(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 1)
    w = watcher(node, [])
    w.reconcile("steps:\n  - {xid: 13}\n  - {at: 1h, xid: 31}\n")
    w.reconcile("steps: [{xid: 43}]")
    w.wait()
    assert [re.search(r": (\d+), pid=", line).group(1) for line in xids(node)] == ["13", "43"]  # type: ignore[union-attr]
