"""Teardown of a cgroup whose tasks are frozen: runc freezes a container's cgroup while it updates
or signals it, and a runc killed in that window (containerd and its shims are killed at teardown)
leaves the cgroup frozen. A frozen task ignores SIGKILL until thawed, so both teardown paths — the
local cluster's kubelet cgroup root (:mod:`localcluster.cgroups`) and the private containerd's
cgroup parent (:func:`containers.cleanup.kill_cgroup_members`) — must thaw before they kill."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from containers import cleanup
from localcluster import cgroups

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root")


def freezer_of(d: Path) -> tuple[str, str] | None:
    """The knob that freezes cgroup directory ``d`` and its frozen value, if ``d`` has one."""
    if (d / "freezer.state").exists():
        return "freezer.state", "FROZEN"
    if (d / "cgroup.freeze").exists():
        return "cgroup.freeze", "1"
    return None


@pytest.fixture
def frozen() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A cgroup made in every hierarchy, holding one ``sleep`` that is frozen."""
    name = f"/mokka-test-frozen-{uuid.uuid4().hex[:8]}"
    made = cgroups.create(name)
    proc = subprocess.Popen(["sleep", "600"])
    knobs = [(d, k) for d in made if (k := freezer_of(d))]
    try:
        if not knobs:
            pytest.skip("no freezer in any cgroup hierarchy here")
        for d in made:
            (d / "cgroup.procs").write_text(str(proc.pid))
        for d, (knob, value) in knobs:
            (d / knob).write_text(value)
        os.kill(proc.pid, 9)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)  # the premise: frozen, SIGKILL does not end it
        yield name, proc
    finally:  # thawed here, not by the code under test, so a failing test cannot hang
        for d, (knob, _frozen) in knobs:
            if d.is_dir():
                (d / knob).write_text("THAWED" if knob == "freezer.state" else "0")
        proc.kill()
        proc.wait()
        for d in made:
            if d.is_dir():
                d.rmdir()


def test_the_kubelet_cgroup_root_is_removed_with_frozen_tasks(frozen: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, proc = frozen
    assert cgroups.remove(name, timeout=5) == []
    assert proc.wait(5) == -9
    assert cgroups.existing(name) == []


def test_the_sandbox_cgroup_parent_kills_frozen_tasks(frozen: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, proc = frozen
    cleanup.kill_cgroup_members(name)  # the pids it lists may miss ours: thawed, it takes the pending SIGKILL
    assert proc.wait(5) == -9
