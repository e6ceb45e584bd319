"""What nvidia-smi 535, 550 and 555 read through their private table (native/src/private.c
documents each slot's contract) and the public calls beside them, printed as on real boards."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import Staged

from gpumodel import driver_root, profile

pytestmark = pytest.mark.consumers

Smi = tuple[str, Path]


def gpu0(staged: Staged, smi: Smi) -> ET.Element:
    root = ET.fromstring(staged.run([str(smi[1]), "-q", "-x", "-i", "0"]).stdout)
    gpu = root.find("gpu")
    assert gpu is not None
    return gpu


def custom(tmp_path: Path, base: str, **changes: object) -> Staged:
    data = yaml.safe_load((Path(profile.__file__).parent / "profiles" / f"{base}.yaml").read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    data["name"] = f"custom-{base}"
    f = tmp_path / "custom.yaml"
    f.write_text(yaml.safe_dump(data))
    prof = profile.load(f)
    return Staged(driver_root.stage(prof, tmp_path / "root"), prof)


def test_tlimit_temperatures(stage: Callable[..., Staged], smi: Smi) -> None:
    """Slot 0x780: the T.Limit margin; with it -q switches to the T.Limit threshold lines."""
    staged = stage("h100")
    t = gpu0(staged, smi).find("temperature")
    assert t is not None
    spec = staged.profile.devices()[0].spec.temperature
    assert spec.gpu_max is not None and spec.shutdown is not None and spec.slowdown is not None
    assert t.findtext("gpu_temp_tlimit") == f"{spec.gpu_max - spec.gpu} C"  # 87 - 29 = 58, as captured
    assert t.findtext("gpu_temp_max_tlimit_threshold") == f"{spec.gpu_max - spec.shutdown} C"
    assert t.findtext("gpu_temp_slow_tlimit_threshold") == f"{spec.gpu_max - spec.slowdown} C"
    assert t.findtext("gpu_temp_max_gpu_tlimit_threshold") == "0 C"
    assert t.find("gpu_temp_max_threshold") is None  # the absolute lines give way
    query = staged.run([str(smi[1]), "-i", "0", "--query-gpu=temperature.gpu.tlimit", "--format=csv,noheader"])
    assert query.stdout.strip() == str(spec.gpu_max - spec.gpu)


def test_no_tlimit_before_ada(stage: Callable[..., Staged], smi: Smi) -> None:
    t = gpu0(stage("a100"), smi).find("temperature")
    assert t is not None
    assert t.findtext("gpu_temp_tlimit") == "N/A"
    assert t.findtext("gpu_temp_max_threshold") == "92 C"


def test_sparse_operation_mode(stage: Callable[..., Staged], smi: Smi, tmp_path: Path) -> None:
    """Slot 0x7c8 (550, 555) / 0x798 (535): Disabled on Hopper as captured, N/A where unsupported."""
    assert gpu0(stage("h100"), smi).findtext("sparse_operation_mode") == "Disabled"
    assert gpu0(stage("b200"), smi).findtext("sparse_operation_mode") == "N/A"
    enabled = custom(tmp_path, "h200", gpu__modes__sparse=True)
    assert gpu0(enabled, smi).findtext("sparse_operation_mode") == "Enabled"


def test_enforced_power_limit_query(stage: Callable[..., Staged], smi: Smi) -> None:
    """Slot 0x360: --query-gpu=enforced.power.limit (N/A before, though the public call answers)."""
    staged = stage("h100")
    out = staged.run([str(smi[1]), "-i", "0", "--query-gpu=enforced.power.limit,power.limit", "--format=csv,noheader"])
    assert out.stdout.strip() == "700.00 W, 700.00 W"


def test_sram_ecc(stage: Callable[..., Staged], smi: Smi, tmp_path: Path) -> None:
    """nvmlDeviceGetSramEccErrorStatus: the parity/SEC-DED split, threshold and sources on Ampere+;
    the plain pair on Turing (as the T4 capture shows)."""
    ecc = gpu0(stage("h100"), smi).find("ecc_errors")
    assert ecc is not None
    assert ecc.findtext("volatile/sram_uncorrectable_secded") == "0"
    assert ecc.findtext("aggregate/sram_threshold_exceeded") == "No"
    assert ecc.findtext("aggregate_uncorrectable_sram_sources/sram_l2") == "0"
    t4 = gpu0(stage("t4"), smi).find("ecc_errors")
    assert t4 is not None
    assert t4.findtext("volatile/sram_uncorrectable") == "0"
    assert t4.findtext("aggregate/dram_correctable") == "1"  # the capture's one corrected error
    errors = custom(tmp_path, "h100", gpu__ecc_errors={"aggregate": {"sram_uncorrectable": 2, "dram_correctable": 5}})
    got = gpu0(errors, smi).find("ecc_errors")
    assert got is not None
    assert got.findtext("aggregate/sram_uncorrectable_secded") == "2"
    assert got.findtext("aggregate_uncorrectable_sram_sources/sram_other") == "2"
    assert got.findtext("aggregate/dram_correctable") == "5"


def test_atomic_caps(stage: Callable[..., Staged], smi: Smi) -> None:
    """Slot 0x710: outbound and inbound PCIe atomics as captured (GB200: inbound only)."""
    pci = gpu0(stage("gb200"), smi).find("pci")
    assert pci is not None
    assert (
        pci.findtext("atomic_caps_inbound") or ""
    ).strip() == "FETCHADD_32 FETCHADD_64 SWAP_32 SWAP_64 CAS_32 CAS_64"
    assert pci.findtext("atomic_caps_outbound") == "N/A"
    h100 = gpu0(stage("h100"), smi).find("pci")
    assert h100 is not None and h100.findtext("atomic_caps_inbound") == "N/A"


def test_fabric_health_bandwidth(stage: Callable[..., Staged], smi: Smi) -> None:
    """healthMask through nvmlDeviceGetGpuFabricInfoV: 550 prints Full for DEGRADED_BW_FALSE;
    555.58 prints nothing but Degraded or N/A there (see bench/fidelity.py RELEASE_CANNOT_PRINT);
    535 has no health element."""
    got = gpu0(stage("gb200"), smi).findtext("fabric/health/bandwidth")
    assert got == {"535": None, "550": "Full", "555": "N/A"}[smi[0]]


def test_lost_gpu_named_by_bus_id(smi: Smi, tmp_path: Path) -> None:
    """Slot 0x288: the bus id nvidia-smi names a GPU by when its handle fails (4-digit domain)."""
    staged = custom(tmp_path, "h100", gpu_count=2, gpus={1: {"lost": True}})
    res = staged.run([str(smi[1]), "-L"], check=False)
    assert res.returncode == 15
    bus = staged.profile.devices()[1].bus_id  # 00000000:64:00.0
    assert f"gpu {bus[4:]}: GPU is lost" in res.stdout


@pytest.mark.parametrize("slot", [0x780, 0x360, 0x710, 0x7C8, 0x798, 0x288])
def test_slots_refuse_bad_arguments(stage: Callable[..., Staged], slot: int) -> None:
    """A null pointer or an unknown handle gets an error, not a crash."""
    staged = stage("h100")
    code = (
        "import ctypes\n"
        "lib = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "assert lib.nvmlInit_v2() == 0\n"
        "table = ctypes.c_void_p()\n"
        "tid = bytes([0xc4,0xfe,0x3e,0x6c,0xc9,0x8f,0x6c,0x4e,0xa3,0x27,0xee,0x69,0x6e,0x12,0xf7,0xc4])\n"
        "assert lib.nvmlInternalGetExportTable(ctypes.byref(table), tid) == 0\n"
        f"fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)("
        f"ctypes.c_void_p.from_address(table.value + {slot}).value)\n"
        "dev = ctypes.c_void_p()\n"
        "assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0\n"
        f"first = 99 if {slot} == 0x288 else dev\n"
        "print(fn(first, None, 0), fn(ctypes.c_void_p(16), None, 0))\n"
    )
    a, b = staged.python(code).stdout.split()
    assert a != "0" and b != "0"
