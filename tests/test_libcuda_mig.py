"""The mock libcuda with MIG: a GPU in MIG mode is seen through its MIG devices, as CUDA sees them.

Facts (NVIDIA MIG user guide, "CUDA Device Enumeration", docs.nvidia.com/datacenter/tesla/
mig-user-guide/mig-device-names.html): from R570 CUDA enumerates one compute instance per GPU
instance (at most 64 MIG devices) beside every GPU without MIG; before R570 a single MIG device
and then no GPU without MIG; CUDA_VISIBLE_DEVICES takes `MIG-<uuid>` (R470+) and
`MIG-GPU-<uuid>/<gi>/<ci>`, and of several compute instances of one GPU instance it uses one. A MIG
device is named "<parent> MIG <profile>" with its GPU instance's memory (CUDA on an
A100-SXM4-80GB 1g.10gb: 10,200,547,328 bytes = 9728 MiB) and its compute instance's SMs;
cuDeviceGetUuid_v2 gives its MIG UUID, cuDeviceGetUuid the parent's (FFmpeg/nv-codec-headers#11:
"_v2, giving distinct IDs for different MIG instances"). Through ctypes and NVIDIA's
cuda-bindings, against states staged from profiles and changed by the real nvidia-smi.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Staged
from mig_fixtures import mig_profile_data, write_profile

from fetch import nvidia_smi
from gpumodel import driver_root, mig, mig_state, profile

pytestmark = pytest.mark.consumers

NO_DEVICE = 100
LAYOUT = [
    {"profile": "3g.40gb"},
    {"profile": "2g.20gb", "compute": ["1c.2g.20gb", "1c.2g.20gb"]},
    {"profile": "1g.10gb"},
]

PROBE = r"""
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
out = {"init": cu.cuInit(0), "devices": []}
n = ctypes.c_int()
cu.cuDeviceGetCount(ctypes.byref(n))
for i in range(n.value if out["init"] == 0 else 0):
    dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), i)
    name = ctypes.create_string_buffer(256); cu.cuDeviceGetName(name, 256, dev)
    v1 = ctypes.create_string_buffer(16); cu.cuDeviceGetUuid(v1, dev)
    v2 = ctypes.create_string_buffer(16); cu.cuDeviceGetUuid_v2(v2, dev)
    mem = ctypes.c_size_t(); cu.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
    sms = ctypes.c_int(); cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)
    major = ctypes.c_int(); cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
    bus = ctypes.create_string_buffer(32); cu.cuDeviceGetPCIBusId(bus, 32, dev)
    out["devices"].append({"name": name.value.decode(), "uuid": v1.raw.hex(), "uuid_v2": v2.raw.hex(),
                           "memory": mem.value, "sms": sms.value, "cc_major": major.value,
                           "bus": bus.value.decode()})
print(json.dumps(out))
"""


def hexid(uuid: str) -> str:
    return uuid.split("-", 1)[1].replace("-", "")


def probe(staged: Staged, **env: str) -> dict[str, Any]:
    return json.loads(staged.python(PROBE, MOKKA_IGNORE_DEVICE_NODES="1", **env).stdout)  # type: ignore[no-any-return]


def stage_with(tmp_path: Path, base: str, gpus: int, driver: str | None = None, **kwargs: Any) -> Staged:
    """A profile as mig_fixtures builds it, reporting ``driver`` if given, staged into tmp_path."""
    data = mig_profile_data(base, gpus, **kwargs)
    if driver:
        data["driver"] = {"version": driver, "cuda": "12.4"}
    prof = profile.load(write_profile(tmp_path / "profile.yaml", data))
    return Staged(driver_root.stage(prof, tmp_path / "root"), prof)


def expected(staged: Staged, device: mig_state.MigDevice) -> dict[str, Any]:
    """What CUDA reports for a MIG device: from the board's table and the parent."""
    parent = staged.profile.devices()[device.gpu]
    board = mig.board_for(parent.spec.pci.device_id)
    assert board is not None
    gi = board.profile(device.gi_profile_id)
    assert gi is not None
    ci = gi.compute_profile(device.ci_profile_id)
    assert ci is not None
    return {
        "name": f"{parent.spec.name} MIG {device.profile}",
        "uuid": hexid(parent.uuid),
        "uuid_v2": hexid(device.uuid),
        "memory": gi.memory_mib * 1024 * 1024,
        "sms": ci.multiprocessors,
        "cc_major": int(parent.spec.compute_capability.split(".")[0]),
        "bus": parent.bus_id[4:].upper(),
    }


def whole(staged: Staged, index: int) -> dict[str, Any]:
    dev = staged.profile.devices()[index]
    return {
        "name": dev.spec.name,
        "uuid": hexid(dev.uuid),
        "uuid_v2": hexid(dev.uuid),
        "memory": round(dev.spec.memory.total_mib * 1024 * 1024),
        "sms": 132,  # H100 SXM5
        "cc_major": 9,
        "bus": dev.bus_id[4:].upper(),
    }


def mig_devices(staged: Staged) -> list[mig_state.MigDevice]:
    return [d for g in mig_state.read(staged.root.library) for d in g.devices]


@pytest.fixture
def two_h100(stage_mig: Callable[..., Staged]) -> Staged:
    """H100s on R580: GPU 0 in MIG mode (3g.40gb, a 2g.20gb split in two 1c CIs, 1g.10gb), GPU 1 not."""
    return stage_mig("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=LAYOUT)


def test_from_r570_one_compute_instance_per_gpu_instance(two_h100: Staged) -> None:
    assert two_h100.profile.driver.version.startswith("580")
    devices = mig_devices(two_h100)
    assert [(d.profile, d.gi, d.ci) for d in devices] == [
        ("3g.40gb", 2, 0),  # GI 2 at 4:4
        ("1c.2g.20gb", 3, 0),  # GI 3 at 0:2, split in two
        ("1c.2g.20gb", 3, 1),
        ("1g.10gb", 9, 0),  # GI 9 at 2:1
    ]
    got = probe(two_h100)
    assert got["init"] == 0
    first_per_gi = [devices[0], devices[1], devices[3]]
    assert got["devices"] == [expected(two_h100, d) for d in first_per_gi] + [whole(two_h100, 1)]
    assert got["devices"][0]["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert got["devices"][0]["memory"] == 40448 * 1024 * 1024 and got["devices"][0]["sms"] == 60
    assert got["devices"][1]["name"] == "NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb" and got["devices"][1]["sms"] == 16


def test_before_r570_a_single_mig_device(tmp_path: Path) -> None:
    """R550: one MIG device (the first), and then no GPU without MIG."""
    staged = stage_with(
        tmp_path,
        "h100",
        2,
        "550.163.01",
        overrides={1: {"mig": {"mode": False, "instances": []}}},
        mode=True,
        instances=LAYOUT,
    )
    got = probe(staged)
    assert got["devices"] == [expected(staged, mig_devices(staged)[0])]
    # without MIG devices the GPUs without MIG are CUDA devices again
    assert probe(staged, CUDA_VISIBLE_DEVICES="1")["devices"] == [whole(staged, 1)]


def test_cuda_visible_devices_names_mig_devices(two_h100: Staged) -> None:
    devices = mig_devices(two_h100)
    gpu0 = two_h100.profile.devices()[0].uuid

    def seen(cvd: str) -> list[str]:
        return [d["uuid_v2"] for d in probe(two_h100, CUDA_VISIBLE_DEVICES=cvd)["devices"]]

    assert seen(devices[2].uuid) == [hexid(devices[2].uuid)]  # the second CI of the 2g alone
    assert seen(f"MIG-{gpu0}/9/0") == [hexid(devices[3].uuid)]  # the pre-R470 form
    # two compute instances of one GPU instance: CUDA uses one, the first listed
    assert seen(f"{devices[2].uuid},{devices[1].uuid},{devices[0].uuid}") == [
        hexid(devices[2].uuid),
        hexid(devices[0].uuid),
    ]
    # an ordinal or a GPU UUID (prefix) names a GPU: in MIG mode, its MIG devices
    per_gi = [hexid(devices[k].uuid) for k in (0, 1, 3)]
    assert seen("1,0") == [hexid(two_h100.profile.devices()[1].uuid), *per_gi]
    assert seen(gpu0[:12]) == per_gi
    # an entry naming nothing ends the list
    assert seen(f"{devices[3].uuid},MIG-00000000-0000-5000-8000-000000000000,1") == [hexid(devices[3].uuid)]
    assert probe(two_h100, CUDA_VISIBLE_DEVICES="MIG-00000000-0000-5000-8000-000000000000")["init"] == NO_DEVICE


def test_nvidia_visible_devices_gives_a_slice(two_h100: Staged) -> None:
    """As a container runtime sets it for one MIG device: CUDA sees that device alone."""
    devices = mig_devices(two_h100)
    for visible in (devices[2].uuid, "0:2"):
        got = probe(two_h100, NVIDIA_VISIBLE_DEVICES=visible)
        assert got["devices"] == [expected(two_h100, devices[2])], visible


def test_mig_mode_without_instances_offers_no_cuda_device(stage_mig: Callable[..., Staged]) -> None:
    assert probe(stage_mig("h100", 1, mode=True))["init"] == NO_DEVICE
    staged = stage_mig("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True)
    assert probe(staged)["devices"] == [whole(staged, 1)]


@pytest.mark.root
def test_a_container_sees_only_its_slice(two_h100: Staged) -> None:
    """Inside a container (the node's /dev/nvidiaN exist) CUDA uses the MIG devices whose GPU and
    compute instance capability nodes it was given, as the driver grants access: here GPU 0's
    node and the nodes of the 3g.40gb alone, in a private mount namespace."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a private mount namespace)")
    target = mig_devices(two_h100)[2]
    script = (
        "mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 && mkdir /dev/nvidia-caps && "
        f"touch /dev/nvidia0 /dev/nvidia-caps/nvidia-cap{target.gi_cap_minor} "
        f'/dev/nvidia-caps/nvidia-cap{target.ci_cap_minor} && exec {sys.executable} -c "$CODE"'
    )
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env={**two_h100.env(), "CODE": PROBE},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["devices"] == [expected(two_h100, target)]


def test_instances_changed_through_nvidia_smi(stage_mig: Callable[..., Staged]) -> None:
    """The layout is the node's: what the real nvidia-smi destroys and creates, the next CUDA
    process sees (and a GPU left in MIG mode without instances offers nothing)."""
    staged = stage_mig("h100", 1, mode=True, instances=[{"profile": "3g.40gb"}])
    smi = str(nvidia_smi.fetch("550"))
    staged.run([smi, "mig", "-dci"])
    staged.run([smi, "mig", "-dgi"])
    assert probe(staged)["init"] == NO_DEVICE
    staged.run([smi, "mig", "-cgi", "19,19", "-C"])
    got = probe(staged)["devices"]
    assert [d["name"] for d in got] == ["NVIDIA H100 80GB HBM3 MIG 1g.10gb"] * 2
    assert [d["uuid_v2"] for d in got] == [hexid(d.uuid) for d in mig_devices(staged)]


BINDINGS = r"""
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == d.CUresult.CUDA_SUCCESS
_, n = d.cuDeviceGetCount()
for i in range(n):
    _, dev = d.cuDeviceGet(i)
    _, name = d.cuDeviceGetName(128, dev)
    _, parent = d.cuDeviceGetUuid(dev)
    _, uuid = d.cuDeviceGetUuid_v2(dev)
    _, mem = d.cuDeviceTotalMem(dev)
    _, sms = d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
    print(name.split(b"\0")[0].decode(), bytes(parent.bytes).hex(), bytes(uuid.bytes).hex(), mem, sms, sep="|")
"""


def test_cuda_bindings_see_the_mig_devices(stage_mig: Callable[..., Staged]) -> None:
    """NVIDIA's cuda-python binding (every entry point found through cuGetProcAddress, each
    variant by the CUDA version that brought it): an A100 40GB split 3g.20gb + 2g.10gb + 1g.5gb
    on its R570 driver; cuDeviceGetUuid answers the parent's UUID, cuDeviceGetUuid_v2 the MIG one."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is a test dependency (pip install -e .[test])")
    staged = stage_mig(
        "a100", 1, mode=True, instances=[{"profile": "3g.20gb"}, {"profile": "2g.10gb"}, {"profile": "1g.5gb"}]
    )
    rows = [line.split("|") for line in staged.python(BINDINGS, MOKKA_IGNORE_DEVICE_NODES="1").stdout.splitlines()]
    want = [expected(staged, d) for d in mig_devices(staged)]
    assert rows == [[w["name"], w["uuid"], w["uuid_v2"], str(w["memory"]), str(w["sms"])] for w in want]
    assert {r[0] for r in rows} == {
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    }
