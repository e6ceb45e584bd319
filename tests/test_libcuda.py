"""The mock libcuda (driver API): staged beside libnvidia-ml, answering from the same state.

Through ctypes (every entry point the mock implements, errors included) and through NVIDIA's
own binding, cuda-bindings (``cuda.bindings.driver``), which finds every function through
cuGetProcAddress_v2 as CUDA 12 software does.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from gpumodel import state

pytestmark = pytest.mark.consumers

CTYPES_PROBE = r"""
import ctypes, json, sys
cu = ctypes.CDLL("libcuda.so.1")
out = {"before_init": cu.cuDeviceGetCount(ctypes.byref(ctypes.c_int()))}
out["init"] = cu.cuInit(0)
v = ctypes.c_int(); cu.cuDriverGetVersion(ctypes.byref(v)); out["version"] = v.value
n = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(n)); out["count"] = n.value
attrs = {"cc_major": 75, "cc_minor": 76, "sms": 16, "bus": 33, "device": 34, "domain": 50, "warp": 10, "clock_khz": 13}
out["gpus"] = []
for i in range(n.value):
    dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), i) == 0
    g = {}
    name = ctypes.create_string_buffer(256); cu.cuDeviceGetName(name, 256, dev); g["name"] = name.value.decode()
    short = ctypes.create_string_buffer(8); cu.cuDeviceGetName(short, 8, dev); g["short"] = short.value.decode()
    uuid = ctypes.create_string_buffer(16); cu.cuDeviceGetUuid_v2(uuid, dev); g["uuid"] = uuid.raw.hex()
    mem = ctypes.c_size_t(); cu.cuDeviceTotalMem_v2(ctypes.byref(mem), dev); g["mem"] = mem.value
    mem32 = ctypes.c_uint(); cu.cuDeviceTotalMem(ctypes.byref(mem32), dev); g["mem32"] = mem32.value
    for key, attr in attrs.items():
        val = ctypes.c_int(); g[key] = (cu.cuDeviceGetAttribute(ctypes.byref(val), attr, dev), val.value)
    g["bad_attr"] = cu.cuDeviceGetAttribute(ctypes.byref(ctypes.c_int()), 100000, dev)
    bus = ctypes.create_string_buffer(32); cu.cuDeviceGetPCIBusId(bus, 32, dev); g["bus_id"] = bus.value.decode()
    back = ctypes.c_int(); g["by_bus"] = (cu.cuDeviceGetByPCIBusId(ctypes.byref(back), bus), back.value)
    out["gpus"].append(g)
ctx = ctypes.c_void_p(1)
out["ctx_create"] = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0)
out["primary_retain"] = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
out["ctx_current"] = (cu.cuCtxGetCurrent(ctypes.byref(ctx)), ctx.value)
out["ctx_sync"] = cu.cuCtxSynchronize()
out["mem_info"] = cu.cuMemGetInfo_v2(ctypes.byref(ctypes.c_size_t()), ctypes.byref(ctypes.c_size_t()))
out["bad_device"] = cu.cuDeviceGet(ctypes.byref(ctypes.c_int()), n.value)
fn = ctypes.c_void_p()
out["proc_address"] = cu.cuGetProcAddress_v2(b"cuDeviceTotalMem", ctypes.byref(fn), 12000, 0, None)
out["proc_is_v2"] = fn.value == ctypes.cast(cu.cuDeviceTotalMem_v2, ctypes.c_void_p).value
out["proc_unknown"] = cu.cuGetProcAddress_v2(b"cuLaunchKernel", ctypes.byref(fn), 12000, 0, None)
text = ctypes.c_char_p(); cu.cuGetErrorName(801, ctypes.byref(text)); out["err_801"] = text.value.decode()
print(json.dumps(out))
"""

CUDA_SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NO_DEVICE, INVALID_DEVICE = 0, 3, 1, 100, 101
INVALID_CONTEXT, NOT_FOUND, NOT_SUPPORTED = 201, 500, 801


def probe(staged: Staged, **env: str) -> dict:  # type: ignore[type-arg]
    return json.loads(staged.python(CTYPES_PROBE, **env).stdout)


def test_driver_api_answers_from_the_state(stage: Callable[..., Staged]) -> None:
    staged = stage("h100", 4)
    got = probe(staged)
    assert (got["before_init"], got["init"], got["count"]) == (NOT_INITIALIZED, CUDA_SUCCESS, 4)
    assert got["version"] == staged.profile.driver.cuda_int
    for g, dev in zip(got["gpus"], staged.profile.devices(), strict=True):
        s = dev.spec
        assert g["name"] == s.name and g["short"] == s.name[:7]
        assert g["uuid"] == dev.uuid.removeprefix("GPU-").replace("-", "")
        assert g["mem"] == round(s.memory.total_mib * 1024 * 1024) and g["mem32"] == 0xFFFFFFFF
        major, minor = (int(x) for x in s.compute_capability.split("."))
        dom, bus, device = (int(x, 16) for x in dev.bus_id.replace(".", ":").split(":")[:3])
        assert (g["cc_major"], g["cc_minor"]) == ([0, major], [0, minor])
        assert g["sms"] == [0, 132]  # H100 SXM5: 16896 CUDA cores, 128 per SM
        assert (g["bus"], g["device"], g["domain"], g["warp"]) == ([0, bus], [0, device], [0, dom], [0, 32])
        assert g["clock_khz"] == [0, s.clocks.max.sm * 1000]  # type: ignore[union-attr]
        assert g["bad_attr"] == INVALID_VALUE
        assert g["bus_id"] == f"{dom:04X}:{bus:02X}:{device:02X}.0"
        assert g["by_bus"] == [0, got["gpus"].index(g)]
    assert (got["ctx_create"], got["primary_retain"]) == (NOT_SUPPORTED, NOT_SUPPORTED)
    assert got["ctx_current"] == [CUDA_SUCCESS, None]  # no context is current
    assert (got["ctx_sync"], got["mem_info"]) == (INVALID_CONTEXT, INVALID_CONTEXT)
    assert got["bad_device"] == INVALID_DEVICE
    assert (got["proc_address"], got["proc_is_v2"], got["proc_unknown"]) == (CUDA_SUCCESS, True, NOT_FOUND)
    assert got["err_801"] == "CUDA_ERROR_NOT_SUPPORTED"


def test_visibility_rules_match_the_nvml_mock(stage: Callable[..., Staged]) -> None:
    staged = stage("h100", 4)
    uuids = [d.uuid.removeprefix("GPU-").replace("-", "") for d in staged.profile.devices()]
    picked = probe(staged, NVIDIA_VISIBLE_DEVICES="1,3")
    assert [g["uuid"] for g in picked["gpus"]] == [uuids[1], uuids[3]]
    # CUDA_VISIBLE_DEVICES then picks among those, by ordinal or UUID, in the order given.
    both = probe(staged, NVIDIA_VISIBLE_DEVICES="1,3", CUDA_VISIBLE_DEVICES=f"GPU-{uuids[3][:8]},0")
    assert [g["uuid"] for g in both["gpus"]] == [uuids[3], uuids[1]]
    none = staged.python(CTYPES_PROBE.split('out["init"]')[0] + "print(cu.cuInit(0))", NVIDIA_VISIBLE_DEVICES="none")
    assert none.stdout.strip() == str(NO_DEVICE)


def test_without_a_state_cuinit_says_no_device(stage: Callable[..., Staged], tmp_path: Path) -> None:
    staged = stage("h100", 1)
    res = staged.python(
        "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))", MOKKA_STATE=str(tmp_path / "absent")
    )
    assert res.stdout.strip() == str(NO_DEVICE)
    assert "absent" in res.stderr


def test_live_changes_reach_libcuda(stage: Callable[..., Staged], tmp_path: Path) -> None:
    """libcuda reads the state libnvidia-ml carries: a live update shows in both."""
    staged = stage("h100", 1)
    libdir = tmp_path / "lib"
    shutil.copytree(staged.libdir, libdir, symlinks=True)
    lib = libdir / staged.root.library.name

    def shrink(node: object, gpus: object) -> None:
        gpus[0].mem_total = 40 << 30  # type: ignore[index]

    state.update(lib, shrink)
    code = (
        "import ctypes; cu = ctypes.CDLL('libcuda.so.1'); cu.cuInit(0); m = ctypes.c_size_t()\n"
        "cu.cuDeviceTotalMem_v2(ctypes.byref(m), 0); print(m.value)"
    )
    res = staged.run([sys.executable, "-c", code], LD_LIBRARY_PATH=str(libdir))
    assert res.stdout.strip() == str(40 << 30)


BINDINGS_PROBE = r"""
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == d.CUresult.CUDA_SUCCESS
err, n = d.cuDeviceGetCount()
rows = []
for i in range(n):
    _, dev = d.cuDeviceGet(i)
    _, name = d.cuDeviceGetName(128, dev)
    _, uuid = d.cuDeviceGetUuid(dev)
    _, mem = d.cuDeviceTotalMem(dev)
    A = d.CUdevice_attribute
    _, major = d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    _, sms = d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
    _, bus = d.cuDeviceGetPCIBusId(32, dev)
    ctx_err, _ = d.cuCtxCreate(0, dev)
    rows.append([name.split(b"\0")[0].decode(), bytes(uuid.bytes).hex(), mem, f"{major}.{minor}", sms,
                 bus.split(b"\0")[0].decode(), ctx_err.name])
print(d.cuDriverGetVersion()[1], n)
for r in rows:
    print(*r, sep="|")
"""


def test_cuda_bindings_device_query(stage: Callable[..., Staged]) -> None:
    """NVIDIA's cuda-python driver binding: a device query as CUDA software writes it."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is a test dependency (pip install -e .[test])")
    staged = stage("a100", 2)
    res = staged.python(BINDINGS_PROBE)
    head, *rows = res.stdout.strip().splitlines()
    assert head == f"{staged.profile.driver.cuda_int} 2"
    for row, dev in zip(rows, staged.profile.devices(), strict=True):
        name, uuid, mem, cc, sms, bus, ctx = row.split("|")
        assert (name, cc, sms) == (dev.spec.name, dev.spec.compute_capability, "108")  # A100: 108 SMs
        assert uuid == dev.uuid.removeprefix("GPU-").replace("-", "")
        assert int(mem) == round(dev.spec.memory.total_mib * 1024 * 1024)
        assert bus.lower() == dev.bus_id[4:].lower()
        assert ctx == "CUDA_ERROR_NOT_SUPPORTED"
