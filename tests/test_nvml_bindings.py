"""NVML bindings from PyPI (nvidia-ml-py), nvitop and gpustat against the mock."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged, tool
from test_profile import BUILTINS

from gpumodel import state

pytestmark = pytest.mark.consumers

PROBE = r"""
import json, pynvml as N
N.nvmlInit()
out = {"driver": N.nvmlSystemGetDriverVersion(), "cuda": N.nvmlSystemGetCudaDriverVersion_v2(),
       "nvml": N.nvmlSystemGetNVMLVersion(), "count": N.nvmlDeviceGetCount(), "gpus": []}
def maybe(f, *a):
    try:
        return f(*a)
    except N.NVMLError as e:
        return "ERR:" + str(e)
for i in range(out["count"]):
    h = N.nvmlDeviceGetHandleByIndex(i)
    pci = N.nvmlDeviceGetPciInfo_v3(h)
    mem = N.nvmlDeviceGetMemoryInfo(h)
    mem2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    bar1 = N.nvmlDeviceGetBAR1MemoryInfo(h)
    out["gpus"].append({
        "name": N.nvmlDeviceGetName(h), "uuid": N.nvmlDeviceGetUUID(h), "serial": N.nvmlDeviceGetSerial(h),
        "index": N.nvmlDeviceGetIndex(h), "minor": N.nvmlDeviceGetMinorNumber(h),
        "brand": N.nvmlDeviceGetBrand(h), "arch": N.nvmlDeviceGetArchitecture(h),
        "cc": list(N.nvmlDeviceGetCudaComputeCapability(h)),

        "bus_id": pci.busId, "bus_id_legacy": pci.busIdLegacy,
        "pci_device_id": pci.pciDeviceId,
        "pci_subsystem_id": pci.pciSubSystemId,
        "mem_total": mem.total, "mem_used_v1": mem.used, "mem2_reserved": mem2.reserved, "mem2_used": mem2.used,
        "bar1_total": bar1.bar1Total,
        "power": N.nvmlDeviceGetPowerUsage(h), "limit": N.nvmlDeviceGetPowerManagementLimit(h),
        "constraints": list(N.nvmlDeviceGetPowerManagementLimitConstraints(h)),
        "temp": N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
        "slowdown": maybe(N.nvmlDeviceGetTemperatureThreshold, h, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "max_sm": N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM),
        "mem_clocks": N.nvmlDeviceGetSupportedMemoryClocks(h),
        "ecc": maybe(N.nvmlDeviceGetEccMode, h),
        "mig": maybe(N.nvmlDeviceGetMigMode, h),
        "mig_handle": maybe(N.nvmlDeviceGetMigDeviceHandleByIndex, h, 0),
        "persistence": N.nvmlDeviceGetPersistenceMode(h),
        "compute_mode": N.nvmlDeviceGetComputeMode(h),
        "util": [N.nvmlDeviceGetUtilizationRates(h).gpu, N.nvmlDeviceGetUtilizationRates(h).memory],
        "nvlinks": sum(1 for l in range(18) if maybe(N.nvmlDeviceGetNvLinkState, h, l) == 1),
        "procs": N.nvmlDeviceGetComputeRunningProcesses(h),
        "link_count": N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal,
        "numa": maybe(N.nvmlDeviceGetNumaNodeId, h),
    })
s = N.nvmlEventSetCreate()
N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, s)
out["event_wait"] = maybe(N.nvmlEventSetWait, s, 50)
N.nvmlEventSetFree(s)
if out["count"] > 1:
    first, second = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
    out["topology"] = N.nvmlDeviceGetTopologyCommonAncestor(first, second)
N.nvmlShutdown()
print(json.dumps(out))
"""


@pytest.mark.parametrize("name", BUILTINS)
def test_nvidia_ml_py(stage: Callable[..., Staged], name: str) -> None:
    staged = stage(name)
    got = json.loads(staged.python(PROBE).stdout)
    prof = staged.profile
    assert got["driver"] == prof.driver.version
    assert got["cuda"] == prof.driver.cuda_int
    assert got["count"] == prof.gpu_count
    for g, dev in zip(got["gpus"], prof.devices(), strict=True):
        s = dev.spec
        assert g["name"] == s.name
        assert g["uuid"] == dev.uuid
        assert g["index"] == g["minor"] == dev.index
        assert g["bus_id"] == dev.bus_id
        assert g["bus_id_legacy"] == dev.bus_id[4:]
        assert g["pci_device_id"] == (s.pci.device_id << 16) | 0x10DE
        assert g["cc"] == [int(x) for x in s.compute_capability.split(".")]
        assert g["mem_total"] == s.memory.total_mib << 20
        reserved = round(s.memory.reserved_mib * 2**20)
        assert g["mem2_reserved"] == reserved
        assert g["mem_used_v1"] == reserved + (s.memory.used_mib << 20)
        assert g["bar1_total"] == s.memory.bar1_total_mib << 20
        assert g["limit"] == round(s.power.limit_w * 1000)
        assert g["constraints"] == [round(s.power.min_limit_w * 1000), round(s.power.max_limit_w * 1000)]
        assert g["temp"] == s.temperature.gpu
        assert g["slowdown"] == (s.temperature.slowdown if s.temperature.slowdown is not None else "ERR:Not Supported")
        assert g["max_sm"] == s.clocks.max.sm
        assert g["mem_clocks"] == [c.memory for c in s.clocks.supported]
        assert g["mig"] == ("ERR:Not Supported" if s.modes.mig is None else [int(s.modes.mig)] * 2)
        # The device plugin crash-loops unless MIG enumeration on a non-MIG GPU says NOT_FOUND.
        assert g["mig_handle"] == "ERR:Not Found"
        assert g["nvlinks"] == s.nvlink.links
        assert g["link_count"] == (s.nvlink.links if s.nvlink.links else 0)
        assert g["procs"] == []
        assert g["numa"] == (dev.numa_node if s.modes.c2c else "ERR:Not Supported")
    assert got["event_wait"] == "ERR:Timeout"
    if prof.gpu_count > 1:
        assert got["topology"] in (20, 30, 40, 50)


def test_no_state_fails_cleanly(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    staged = stage("h100")
    res = staged.python("import pynvml as N; N.nvmlInit()", check=False, MOKKA_STATE=str(tmp_path / "absent.bin"))
    assert res.returncode != 0
    assert "absent.bin" in res.stderr and "Driver Not Loaded" in res.stderr


@pytest.mark.parametrize(
    "content,why",
    [(b"", "truncated"), (b"\0" * 200, "bad magic"), (b"garbage" * 100, "bad magic")],
)
def test_bad_state_fails_cleanly(tmp_path: Path, stage: Callable[..., Staged], content: bytes, why: str) -> None:
    bad = tmp_path / "state.bin"
    bad.write_bytes(content)
    res = stage("h100").python("import pynvml as N; N.nvmlInit()", check=False, MOKKA_STATE=str(bad))
    assert res.returncode != 0
    assert why in res.stderr
    assert "Segmentation" not in res.stderr


def test_truncated_records_fail_cleanly(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    staged = stage("h100")
    data = state.read(staged.root.state)
    bad = tmp_path / "state.bin"
    bad.write_bytes(data[: len(data) // 2])
    res = staged.python("import pynvml as N; N.nvmlInit()", check=False, MOKKA_STATE=str(bad))
    assert res.returncode != 0 and "truncated" in res.stderr


def test_foreign_layout_version_fails_cleanly(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    staged = stage("h100")
    data = bytearray(state.read(staged.root.state))
    data[8] ^= 0x7F  # the layout version field
    bad = tmp_path / "state.bin"
    bad.write_bytes(bytes(data))
    res = staged.python("import pynvml as N; N.nvmlInit()", check=False, MOKKA_STATE=str(bad))
    assert res.returncode != 0 and "layout version" in res.stderr


def test_nvitop_once(stage: Callable[..., Staged]) -> None:
    staged = stage("h100", 4)
    exe = tool("nvitop") or pytest.fail("nvitop is not installed (pip install -e '.[test]')")
    res = staged.run([exe, "--once", "--only", "0", "1", "2", "3"], check=False, TERM="xterm", COLUMNS="160")
    assert res.returncode == 0, res.stdout + res.stderr
    assert staged.profile.gpu.name.removeprefix("NVIDIA ") in res.stdout  # nvitop drops the brand
    assert "79.65GiB" in res.stdout  # 81559 MiB
    for dev in staged.profile.devices()[:4]:
        assert dev.bus_id in res.stdout


def test_gpustat_json(stage: Callable[..., Staged]) -> None:
    staged = stage("h100", 2)
    res = staged.run([sys.executable, "-m", "gpustat", "--json"], check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    gpus = data["gpus"]
    devices = staged.profile.devices()
    assert [g["uuid"] for g in gpus] == [d.uuid for d in devices[:2]]
    assert gpus[0]["name"] == devices[0].spec.name
    assert gpus[0]["memory.total"] == devices[0].spec.memory.total_mib
    assert gpus[0]["enforced.power.limit"] == 700


THREADS = r"""
import threading, pynvml as N
N.nvmlInit()
errors = []
def work(k):
    try:
        N.nvmlInit()  # init is reference-counted, as in the real library
        for i in range(2000):
            h = N.nvmlDeviceGetHandleByIndex((i + k) % N.nvmlDeviceGetCount())
            assert N.nvmlDeviceGetName(h).startswith("NVIDIA")
            N.nvmlDeviceGetMemoryInfo(h); N.nvmlDeviceGetPowerUsage(h); N.nvmlDeviceGetPciInfo(h)
        N.nvmlShutdown()
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
print(N.nvmlDeviceGetCount(), len(errors), errors[:3])
N.nvmlShutdown()
try:
    N.nvmlDeviceGetCount(); print("still initialized")
except N.NVMLError_Uninitialized:
    print("uninitialized")
"""


def test_threads_and_refcounted_init(stage: Callable[..., Staged]) -> None:
    out = stage("h100").python(THREADS).stdout.splitlines()
    assert out == ["8 0 []", "uninitialized"]
