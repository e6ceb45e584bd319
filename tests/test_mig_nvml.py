"""MIG through NVIDIA's own Python bindings (nvidia-ml-py) against the mock library: profiles,
instances created and destroyed at run time and seen by every other process, MIG device
handles, the errors real boards give, and who may change the layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from gpumodel import mig, mig_state, state

pytestmark = pytest.mark.consumers

PRELUDE = """
import json, pynvml as N
N.nvmlInit()
def err(call, *args):
    try:
        call(*args)
    except N.NVMLError as e:
        return e.value
    return 0
"""


def py(staged: Staged, code: str, **env: str) -> dict:  # type: ignore[type-arg]
    res = staged.python(PRELUDE + code, check=False, **env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


ROUND_TRIP = """
h = N.nvmlDeviceGetHandleByIndex(0)
out = {"mode0": list(N.nvmlDeviceGetMigMode(h)), "activation": N.nvmlDeviceSetMigMode(h, 1)}
out["mode1"] = list(N.nvmlDeviceGetMigMode(h))
info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
gi = N.nvmlDeviceCreateGpuInstance(h, info.id)
gi_info = N.nvmlGpuInstanceGetInfo(gi)
ci_info = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
ci = N.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
attrs = N.nvmlDeviceGetAttributes(m)
out.update(
    profile=[info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.name],
    gi=[gi_info.id, gi_info.profileId, gi_info.placement.start, gi_info.placement.size],
    ci=[N.nvmlComputeInstanceGetInfo(ci).id, N.nvmlComputeInstanceGetInfo(ci).profileId],
    max=N.nvmlDeviceGetMaxMigDeviceCount(h),
    is_mig=[N.nvmlDeviceIsMigDeviceHandle(h).value, N.nvmlDeviceIsMigDeviceHandle(m).value],
    uuid=N.nvmlDeviceGetUUID(m),
    name=N.nvmlDeviceGetName(m),
    ids=[N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m)],
    memory=N.nvmlDeviceGetMemoryInfo(m).total,
    attrs=[attrs.multiprocessorCount, attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount, attrs.memorySizeMB],
    parent=N.nvmlDeviceGetUUID(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)) == N.nvmlDeviceGetUUID(h),
    by_uuid=N.nvmlDeviceGetGpuInstanceId(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(m))),
    next=err(N.nvmlDeviceGetMigDeviceHandleByIndex, h, 1),
)
print(json.dumps(out))
"""

SEE = """
out = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    for j in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except N.NVMLError_NotFound:
            continue
        out.append([i, j, N.nvmlDeviceGetUUID(m), N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m)])
print(json.dumps(out))
"""

TEAR_DOWN = """
h = N.nvmlDeviceGetHandleByIndex(0)
gi = N.nvmlDeviceGetGpuInstanceById(h, {gi})
ci = N.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
out = {{"gi_in_use": err(N.nvmlGpuInstanceDestroy, gi), "mig_off_in_use": err(N.nvmlDeviceSetMigMode, h, 0)}}
N.nvmlComputeInstanceDestroy(ci)
out["stale_ci"] = err(N.nvmlComputeInstanceGetInfo, ci)
N.nvmlGpuInstanceDestroy(gi)
out["stale_gi"] = err(N.nvmlGpuInstanceGetInfo, gi)
out["gone"] = err(N.nvmlDeviceGetGpuInstanceById, h, {gi})
print(json.dumps(out))
"""


def test_round_trip_seen_by_a_second_process(stage_mig: Callable[..., Staged]) -> None:
    staged = stage_mig("h100", 2)
    made = py(staged, ROUND_TRIP)
    assert made["mode0"] == [0, 0] and made["activation"] == 0 and made["mode1"] == [1, 1]
    assert made["profile"] == [9, 3, 2, 40448, "MIG 3g.40gb"]
    assert made["gi"] == [2, 9, 4, 4]  # the upper half first, id 1 + 4/4
    assert made["ci"] == [0, 2] and made["max"] == 7 and made["is_mig"] == [0, 1]
    assert made["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert made["ids"] == [2, 0] and made["memory"] == 40448 << 20
    assert made["attrs"] == [60, 3, 3, 40448]
    assert made["parent"] and made["by_uuid"] == 2
    assert made["next"] == 6  # NVML_ERROR_NOT_FOUND: no second MIG device
    gpu_uuid = staged.profile.devices()[0].uuid
    assert made["uuid"] == mig.mig_uuid(gpu_uuid, 2, 9, 0, 2)

    seen = py(staged, SEE)  # a fresh process
    assert seen == [[0, 0, made["uuid"], 2, 0]]
    assert [d.uuid for g in mig_state.read(staged.root.library) for d in g.devices] == [made["uuid"]]

    gone = py(staged, TEAR_DOWN.format(gi=2))
    assert gone == {"gi_in_use": 19, "mig_off_in_use": 19, "stale_ci": 2, "stale_gi": 2, "gone": 6}
    assert py(staged, SEE) == []


def test_declared_layout_is_what_nvml_shows(stage_mig: Callable[..., Staged]) -> None:
    staged = stage_mig(
        "h100", 2, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}, {"profile": "1g.10gb"}]
    )
    seen = py(staged, SEE)
    assert [(s[0], s[1], s[3], s[4]) for s in seen] == [(g, k, gi, 0) for g in (0, 1) for k, gi in enumerate([2, 3, 9])]
    assert len({s[2] for s in seen}) == 6


LAYOUT_VIA_NVML = """
h = N.nvmlDeviceGetHandleByIndex(1)
for pid in (9, 14, 19):
    gi = N.nvmlDeviceCreateGpuInstance(h, pid)
    full = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, {9: 2, 14: 1, 19: 0}[pid], 0)
    N.nvmlGpuInstanceCreateComputeInstance(gi, full.id)
print(json.dumps(0))
"""


def test_nvml_and_a_profile_place_alike(stage_mig: Callable[..., Staged]) -> None:
    """The same layout declared in a profile (GPU 0) and created through NVML (GPU 1) gets the
    same ids and placements, so the same MIG devices."""
    staged = stage_mig(
        "h100",
        2,
        overrides={1: {"mig": {"mode": True, "instances": []}}},
        mode=True,
        instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}, {"profile": "1g.10gb"}],
    )
    assert mig_state.read(staged.root.library)[1].devices == ()
    py(staged, LAYOUT_VIA_NVML)
    gpus = mig_state.read(staged.root.library)
    assert gpus[0].gpu_instances == gpus[1].gpu_instances == ((2, 9), (3, 14), (9, 19))
    assert [(d.gi, d.ci, d.profile, d.placement) for d in gpus[0].devices] == [
        (d.gi, d.ci, d.profile, d.placement) for d in gpus[1].devices
    ]


ERRORS = """
h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
out = {
    "create_mig_off": err(N.nvmlDeviceCreateGpuInstance, h1, 9),
    "v_mig_off": err(N.nvmlDeviceGetGpuInstanceProfileInfo, h1, 0),
    "v1_mig_off": N.nvmlDeviceGetGpuInstanceProfileInfo(h1, 0, version=1).id,
    "remaining_mig_off": err(N.nvmlDeviceGetGpuInstanceRemainingCapacity, h1, 19),
    "max_mig_off": N.nvmlDeviceGetMaxMigDeviceCount(h1),
    "index_mig_off": err(N.nvmlDeviceGetMigDeviceHandleByIndex, h1, 0),
    "unknown_index": err(N.nvmlDeviceGetGpuInstanceProfileInfo, h0, 5, 1),
    "past_last_index": err(N.nvmlDeviceGetGpuInstanceProfileInfo, h0, N.NVML_GPU_INSTANCE_PROFILE_COUNT, 1),
    "bad_profile_id": err(N.nvmlDeviceCreateGpuInstance, h0, 42),
    "remaining_7g": int(N.nvmlDeviceGetGpuInstanceRemainingCapacity(h0, 0)),
}
p = N.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 2, 4
out["bad_placement"] = err(N.nvmlDeviceCreateGpuInstanceWithPlacement, h0, 9, N.byref(p))
p.start = 0
gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(h0, 9, N.byref(p))
out["overlap"] = err(N.nvmlDeviceCreateGpuInstanceWithPlacement, h0, 5, N.byref(p))
out["full_7g"] = err(N.nvmlDeviceCreateGpuInstance, h0, 0)
out["remaining"] = [int(N.nvmlDeviceGetGpuInstanceRemainingCapacity(h0, pid)) for pid in (19, 20, 15, 14, 9, 5, 0)]
out["ci_unknown"] = err(N.nvmlGpuInstanceCreateComputeInstance, gi, 3)
for _ in range(3):
    N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
out["ci_full"] = err(N.nvmlGpuInstanceCreateComputeInstance, gi, 0)
out["ci_remaining"] = int(N.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 2))
out["devices"] = [N.nvmlDeviceGetComputeInstanceId(N.nvmlDeviceGetMigDeviceHandleByIndex(h0, i)) for i in range(3)]
out["index_beyond_max"] = err(N.nvmlDeviceGetMigDeviceHandleByIndex, h0, 7)
out["mig_queries_on_gpu"] = [
    err(N.nvmlDeviceGetGpuInstanceId, h0), err(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h0)
]
out["util_mig_on"] = err(N.nvmlDeviceGetUtilizationRates, h0)
print(json.dumps(out))
"""


def test_errors_as_real_boards_give_them(stage_mig: Callable[..., Staged]) -> None:
    staged = stage_mig("h100", 2, overrides={1: {"mig": {"mode": False, "instances": []}}}, mode=True)
    out = py(staged, ERRORS)
    assert out["create_mig_off"] == 3 and out["v_mig_off"] == 3  # NOT_SUPPORTED
    assert out["v1_mig_off"] == 19  # v1 answers with MIG off: the device plugin's start-up walk relies on it
    assert out["remaining_mig_off"] == 3 and out["max_mig_off"] == 0 and out["index_mig_off"] == 6
    assert out["unknown_index"] == 3 and out["past_last_index"] == 2  # NOT_SUPPORTED, then INVALID_ARGUMENT
    assert out["bad_profile_id"] == 2 and out["remaining_7g"] == 1
    assert out["bad_placement"] == 2 and out["overlap"] == 23 and out["full_7g"] == 23  # INSUFFICIENT_RESOURCES
    assert out["remaining"] == [3, 1, 2, 1, 1, 0, 0]  # what a 3g at 0:4 leaves
    assert out["ci_unknown"] == 3 and out["ci_full"] == 23 and out["ci_remaining"] == 0
    assert out["devices"] == [0, 1, 2] and out["index_beyond_max"] == 2
    assert out["mig_queries_on_gpu"] == [3, 2]
    assert out["util_mig_on"] == 3


PENDING = """
h = N.nvmlDeviceGetHandleByIndex(0)
print(json.dumps({"activation": N.nvmlDeviceSetMigMode(h, 1), "mode": list(N.nvmlDeviceGetMigMode(h))}))
"""


def test_a_busy_gpu_keeps_mig_pending(stage_mig: Callable[..., Staged]) -> None:
    """With processes on the GPU the driver cannot reset it: SetMigMode succeeds, the activation
    status says In use, the mode stays pending (nvidia-smi's "pending enable state" warning)."""
    staged = stage_mig("h100", 1)

    def busy(node: object, gpus: object) -> None:
        g = gpus[0]  # type: ignore[index]
        g.n_procs = 1
        g.procs[0].pid, g.procs[0].used_memory = 4242, 1 << 30

    state.update(staged.root.library, busy)
    assert py(staged, PENDING) == {"activation": 19, "mode": [0, 1]}


def test_boards_without_mig(stage: Callable[..., Staged]) -> None:
    for name in ("l40s", "t4"):
        out = py(
            stage(name, 1),
            """
h = N.nvmlDeviceGetHandleByIndex(0)
print(json.dumps([err(N.nvmlDeviceGetMigMode, h), err(N.nvmlDeviceSetMigMode, h, 1),
                  err(N.nvmlDeviceGetGpuInstanceProfileInfo, h, 0, 1), err(N.nvmlDeviceGetMaxMigDeviceCount, h),
                  err(N.nvmlDeviceGetMigDeviceHandleByIndex, h, 0)]))
""",
        )
        assert out == [3, 3, 3, 3, 6], name  # NOT_SUPPORTED everywhere; NOT_FOUND for the device plugin's walk


ENABLE = """
h = N.nvmlDeviceGetHandleByIndex(0)
print(json.dumps([err(N.nvmlDeviceSetMigMode, h, 1), err(N.nvmlDeviceCreateGpuInstance, h, 0)]))
"""


@pytest.mark.root
def test_unprivileged_and_read_only_callers_get_no_permission(stage_mig: Callable[..., Staged]) -> None:
    """Changing the layout needs write access to the state: an unprivileged user, or a container
    given the library on a read-only mount, gets NVML_ERROR_NO_PERMISSION and changes nothing."""
    staged = stage_mig("h100", 1, mode=True)
    code = PRELUDE + ENABLE
    shared = Path(tempfile.mkdtemp(prefix="mokka-mig-"))  # readable by nobody, unlike pytest's tmp
    try:
        shared.chmod(0o755)
        lib = shared / "lib"
        shutil.copytree(staged.root.libdir, lib, symlinks=True)
        before = (lib / staged.root.library.name).read_bytes()
        env = {**staged.env(), "LD_LIBRARY_PATH": str(lib)}
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code]
        res = subprocess.run(nobody, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == [4, 4]  # NVML_ERROR_NO_PERMISSION for both
        script = f'mount --bind -o ro {lib} {lib} && exec {sys.executable} -c "$CODE"'
        res = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env={**env, "CODE": code},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == [4, 4]
        assert (lib / staged.root.library.name).read_bytes() == before
    finally:
        shutil.rmtree(shared)


def test_a_container_view(stage_mig: Callable[..., Staged]) -> None:
    """NVIDIA_VISIBLE_DEVICES as a runtime sets it for a MIG device: MIG-<uuid> or <gpu>:<mig>
    shows the parent GPU and that MIG device alone, numbered from 0; a GPU index shows all its."""
    staged = stage_mig("h100", 2, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}])
    devices = [d for g in mig_state.read(staged.root.library) for d in g.devices]
    second = devices[3]  # GPU 1's 2g.20gb
    for visible in (second.uuid, "1:1", f"MIG-{staged.profile.devices()[1].uuid}/3/0"):
        seen = py(staged, SEE, NVIDIA_VISIBLE_DEVICES=visible, MOKKA_IGNORE_DEVICE_NODES="1")
        assert seen == [[0, 0, second.uuid, 3, 0]], visible
    seen = py(staged, SEE, NVIDIA_VISIBLE_DEVICES=f"0,{second.uuid}", MOKKA_IGNORE_DEVICE_NODES="1")
    assert [s[2] for s in seen] == [devices[0].uuid, devices[1].uuid, second.uuid]
    assert py(staged, SEE, NVIDIA_VISIBLE_DEVICES="MIG-00000000-0000-5000-8000-000000000000") == []


def test_python_reads_what_c_wrote(stage_mig: Callable[..., Staged]) -> None:
    """UUIDs hashed in C for instances created at run time equal the model's (gpumodel.mig)."""
    staged = stage_mig("h100", 1, mode=True)
    seven = """
h = N.nvmlDeviceGetHandleByIndex(0)
for _ in range(7):
    N.nvmlGpuInstanceCreateComputeInstance(N.nvmlDeviceCreateGpuInstance(h, 19), 0)
print(0)
"""
    py(staged, seven)
    gpu = mig_state.read(staged.root.library)[0]
    assert [d.gi for d in gpu.devices] == list(range(7, 14))
    assert [d.uuid for d in gpu.devices] == [mig.mig_uuid(gpu.uuid, d.gi, 19, 0, 0) for d in gpu.devices]


def test_a_change_through_nvml_repairs_a_torn_copy(stage_mig: Callable[..., Staged]) -> None:
    """NVML writes only the records it changed when both copies agree; where a killed writer
    left the copy readers are not on torn, it rewrites both copies whole, as the Python writer
    does (the latch of mokka_state.h)."""
    staged = stage_mig("h100", 2, mode=True)
    path = staged.root.library
    fd = os.open(path, os.O_RDWR)
    try:
        offset, _ = state.locate(fd, str(path))
        f = state.ffi()
        copy = f.sizeof("mokka_node_t") + 2 * f.sizeof("mokka_gpu_t")
        gpu1_name = offset + f.sizeof("mokka_header_t") + copy + f.sizeof("mokka_node_t") + f.sizeof("mokka_gpu_t")
        os.pwrite(fd, b"torn" * 8, gpu1_name)  # copy 1, GPU 1: torn while readers use copy 0
    finally:
        os.close(fd)
    out = py(
        staged,
        """
h = N.nvmlDeviceGetHandleByIndex(0)
N.nvmlDeviceCreateGpuInstance(h, 0)
name = N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(1))
print(json.dumps([name, N.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 0)]))
""",
    )
    assert out == [staged.profile.gpu.name, 0]
    region = state.read(path)
    hsize = state.ffi().sizeof("mokka_header_t")
    assert region[hsize : hsize + copy] == region[hsize + copy : hsize + 2 * copy]
