"""A go-nvml program (the binding NVIDIA's device plugin, GFD and toolkit use) against the mock.

go-nvml binds every NVML name at load time: a single missing symbol kills the program
before main() with `symbol lookup error`. The probe also checks what the device plugin
and GFD rely on: MIG enumeration says NOT_FOUND, handles by UUID, topology, events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from fetch import prepare, versions

pytestmark = pytest.mark.consumers


@pytest.fixture(scope="session")
def probe() -> Path:
    """tests/go-nvml, built by `.ci/setup --tests` (fetch.prepare; rebuilt when its source changes)."""
    try:
        return prepare.go_binary(versions.GO_NVML_PROBE)
    except prepare.NotPrepared as exc:
        pytest.fail(str(exc))


@pytest.mark.parametrize("name", ["h100", "b200", "l40s", "t4"])
def test_go_nvml_program(stage: Callable[..., Staged], probe: Path, name: str) -> None:
    staged = stage(name)
    res = staged.run([str(probe)], check=False)
    assert "symbol lookup error" not in res.stderr
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["driver"] == staged.profile.driver.version
    assert got["cuda"] == staged.profile.driver.cuda_int
    devices = staged.profile.devices()
    assert [g["uuid"] for g in got["gpus"]] == [d.uuid for d in devices]
    for g, d in zip(got["gpus"], devices, strict=True):
        assert g["name"] == d.spec.name
        assert g["minor"] == d.index
        assert g["bus_id"] == d.bus_id
        assert [g["cc_major"], g["cc_minor"]] == [int(x) for x in d.spec.compute_capability.split(".")]
        assert g["mig_handle"] == "Not Found"
        assert g["by_uuid"] is True
    assert got["event_wait"] == "Timeout"
    if len(devices) > 1:
        assert got["topology"] in (20, 30, 40, 50)
