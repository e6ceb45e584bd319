"""The mock libdcgm under NVIDIA's real dcgm-exporter: every default counter for every GPU with
NVML's values, injected faults at the next scrape (Xid, temperature, a lost GPU, NVLink down,
ECC) in the exporter's own metrics and health watches, MIG instances as the exporter labels
them, and the whole run again under the ASan/UBSan build of the library.

The exporter comes from ../shared/thirdparty/dcgm or $MOKKA_DCGM_DIR; without either these
tests skip (the library's ABI test, test_dcgm_abi.py, never needs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from conftest import Staged
from fault_fixtures import FaultNode

from fetch import dcgm_exporter
from fetch.dcgm_exporter import Exporter, Sample

pytestmark = [
    pytest.mark.consumers,
    pytest.mark.skipif(
        dcgm_exporter.default_counters() is None,
        reason=f"no dcgm-exporter (../shared/thirdparty/dcgm or ${dcgm_exporter.ENV_DIR})",
    ),
]

Serve = Callable[..., AbstractContextManager[Exporter]]
NATIVE = Path(__file__).resolve().parent.parent / "native"
# The exporter's own experimental collectors, fed by dcgmHealthCheck and dcgmGetValuesSince.
EXTRA_COUNTERS = "DCGM_EXP_GPU_HEALTH_STATUS, gauge, health\nDCGM_EXP_XID_ERRORS_COUNT, gauge, Xids in the window\n"


def default_families() -> list[str]:
    """The exporter's default counters that are GPU series (the driver version is a label; the
    vGPU license status exists on vGPU entities only, which real DCGM has none of either here)."""
    path = dcgm_exporter.default_counters()
    assert path is not None
    names = []
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(",")
        name = name.strip()
        if name and not name.startswith("#") and "label" not in rest and name != "DCGM_FI_DEV_VGPU_LICENSE_STATUS":
            names.append(name)
    return names


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dcgm_exporter.binary(tmp_path_factory.mktemp("dcgm-exporter"))


@pytest.fixture(scope="module")
def counters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = dcgm_exporter.default_counters()
    assert path is not None
    out = tmp_path_factory.mktemp("counters") / "counters.csv"
    out.write_text(path.read_text().rstrip("\n") + "\n" + EXTRA_COUNTERS)
    return out


@pytest.fixture
def serve(exe: Path, counters: Path, tmp_path: Path) -> Serve:
    @contextmanager
    def _serve(libdir: Path, **env: str) -> Iterator[Exporter]:
        with dcgm_exporter.running(exe, libdir, counters, tmp_path / "exporter.log", env=env) as e:
            yield e

    return _serve


def by_gpu(samples: list[Sample], name: str) -> dict[int, Sample]:
    return {int(s.labels["gpu"]): s for s in samples if s.name == name and "GPU_I_ID" not in s.labels}


NVML_PROBE = r"""
import json, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    u = n.nvmlDeviceGetUtilizationRates(h)
    out.append({
        "uuid": n.nvmlDeviceGetUUID(h), "bus": n.nvmlDeviceGetPciInfo(h).busId, "name": n.nvmlDeviceGetName(h),
        "DCGM_FI_DEV_SM_CLOCK": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "DCGM_FI_DEV_MEM_CLOCK": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
        "DCGM_FI_DEV_GPU_TEMP": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "DCGM_FI_DEV_POWER_USAGE": n.nvmlDeviceGetPowerUsage(h) / 1000,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": n.nvmlDeviceGetTotalEnergyConsumption(h),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": n.nvmlDeviceGetPcieReplayCounter(h),
        "DCGM_FI_DEV_GPU_UTIL": u.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": u.memory,
        "DCGM_FI_DEV_FB_FREE": m.free >> 20, "DCGM_FI_DEV_FB_USED": m.used >> 20,
        "DCGM_FI_DEV_FB_RESERVED": m.reserved >> 20,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": n.nvmlDeviceGetRemappedRows(h)[1],
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": n.nvmlDeviceGetRemappedRows(h)[0],
    })
print(json.dumps(out))
"""

# Living metrics move between two reads a few milliseconds apart: allowed drift per family.
DRIFT = {"DCGM_FI_DEV_GPU_TEMP": 1, "DCGM_FI_DEV_POWER_USAGE": 3.0, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 5000}


def nvml_view(staged: Staged) -> list[dict[str, object]]:
    return list(json.loads(staged.python(NVML_PROBE).stdout))


def test_every_default_counter_for_every_gpu_with_nvml_values(stage: Callable[..., Staged], serve: Serve) -> None:
    staged = stage("h100", 8)
    with serve(staged.libdir) as exporter:
        # NVML read before and after the scrape: a living value is between the two (within its
        # drift), however long the reads take on a loaded machine
        before = nvml_view(staged)
        samples = exporter.scrape()
        truth = nvml_view(staged)
    assert len(truth) == 8
    for family in default_families():
        series = by_gpu(samples, family)
        assert sorted(series) == list(range(8)), f"{family}: series for GPUs {sorted(series)}"
    for gpu, want in enumerate(truth):
        labels = by_gpu(samples, "DCGM_FI_DEV_SM_CLOCK")[gpu].labels
        assert labels["UUID"] == want["uuid"] and labels["modelName"] == want["name"], labels
        assert labels["pci_bus_id"] == want["bus"] and labels["device"] == f"nvidia{gpu}", labels
        assert labels["DCGM_FI_DRIVER_VERSION"] == staged.profile.driver.version
        for family, value in want.items():
            if not family.startswith("DCGM_"):
                continue
            got = by_gpu(samples, family)[gpu].value
            low, high = sorted((float(before[gpu][family]), float(value)))  # type: ignore[arg-type]
            drift = DRIFT.get(family, 0)
            assert low - drift <= got <= high + drift, (family, gpu, got, low, high)
    # Hopper: the profiling fields come from NVML's GPM metrics (an idle GPU: 0).
    for family in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert all(0.0 <= s.value <= 1.0 for s in by_gpu(samples, family).values()), family
    health = [s for s in samples if s.name == "DCGM_EXP_GPU_HEALTH_STATUS"]
    assert health and all(s.value == 0 for s in health), [s for s in health if s.value]


def test_faults_show_at_the_next_scrape(fault_node: Callable[..., FaultNode], serve: Serve) -> None:
    node = fault_node("h100", 4)
    with serve(node.libdir) as exporter:
        before = exporter.scrape()
        assert {g: s.value for g, s in by_gpu(before, "DCGM_FI_DEV_XID_ERRORS").items()} == {0: 0, 1: 0, 2: 0, 3: 0}
        node.fault("xid", "13", "--gpu", "2")
        node.fault("temperature", "95", "--gpu", "0")
        node.fault("nvlink", "3", "down", "--gpu", "1")
        node.fault("ecc", "--uncorrected", "1", "--gpu", "0")
        after = exporter.scrape()
        node.fault("lost", "--gpu", "3")
        lost = exporter.scrape()
    xid = by_gpu(after, "DCGM_FI_DEV_XID_ERRORS")
    assert xid[2].value == 13 and xid[2].labels["err_code"] == "13", xid[2]
    assert xid[1].value == 74  # a link going down raises Xid 74
    assert xid[0].value == 63  # the last Xid of the DBE: 48, then 63 as its row is remapped
    assert by_gpu(after, "DCGM_FI_DEV_GPU_TEMP")[0].value == 95
    counts = {
        (int(s.labels["gpu"]), s.labels.get("xid")): s.value for s in after if s.name == "DCGM_EXP_XID_ERRORS_COUNT"
    }
    assert counts[(2, "13")] == 1 and counts[(3, None)] == 0, counts

    def health(samples: list[Sample], gpu: int, watch: str) -> tuple[float, str]:
        (s,) = [
            s
            for s in samples
            if s.name == "DCGM_EXP_GPU_HEALTH_STATUS"
            and s.labels["gpu"] == str(gpu)
            and s.labels["health_watch"] == watch
        ]
        return s.value, s.labels["health_error_code"]

    assert health(after, 0, "THERMAL") == (10, "DCGM_FR_TEMP_VIOLATION")
    assert health(after, 0, "MEM")[0] == 20
    assert health(after, 1, "NVLINK")[0] == 20
    assert health(after, 2, "DRIVER") == (10, "DCGM_FR_XID_ERROR")
    assert health(after, 3, "PCIE") == (0, "DCGM_FR_OK")
    # A lost GPU: DCGM reads nothing from it, so its value series end; its health says why.
    assert 3 not in by_gpu(lost, "DCGM_FI_DEV_GPU_TEMP") and 2 in by_gpu(lost, "DCGM_FI_DEV_GPU_TEMP")
    assert health(lost, 3, "PCIE") == (20, "DCGM_FR_FALLEN_OFF_BUS")


def test_a_container_sees_only_its_gpus(stage: Callable[..., Staged], serve: Serve) -> None:
    """DCGM sees the GPUs NVML sees: in a container given GPUs 1 and 3, those two, numbered 0 and 1."""
    staged = stage("h100", 8)
    uuids = [d.uuid for d in staged.profile.devices()]
    with serve(staged.libdir, NVIDIA_VISIBLE_DEVICES="1,3") as exporter:
        series = by_gpu(exporter.scrape(), "DCGM_FI_DEV_GPU_TEMP")
    assert {g: s.labels["UUID"] for g, s in series.items()} == {0: uuids[1], 1: uuids[3]}


MIG_LAYOUT = [{"profile": "3g.40gb"}, {"profile": "1g.10gb"}]


def test_mig_instances_are_series_of_their_own(stage_mig: Callable[..., Staged], serve: Serve) -> None:
    staged = stage_mig("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=MIG_LAYOUT)
    with serve(staged.libdir) as exporter:
        samples = exporter.scrape()
    fb = [s for s in samples if s.name == "DCGM_FI_DEV_FB_USED"]
    instances = sorted((s.labels["gpu"], s.labels["GPU_I_PROFILE"]) for s in fb if "GPU_I_ID" in s.labels)
    assert instances == [("0", "1g.10gb"), ("0", "3g.40gb")], fb
    assert [s.labels["gpu"] for s in fb if "GPU_I_ID" not in s.labels] == ["1"]  # GPU 1: MIG off, one series
    free = {
        s.labels["GPU_I_PROFILE"]: s.value
        for s in samples
        if s.name == "DCGM_FI_DEV_FB_FREE" and "GPU_I_ID" in s.labels
    }
    assert free["3g.40gb"] > free["1g.10gb"] > 0, free  # each instance's own memory


def test_exporter_under_the_sanitized_library(stage: Callable[..., Staged], serve: Serve, tmp_path: Path) -> None:
    build = tmp_path / "asan"
    subprocess.run(["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", "asan"], check=True)
    staged = stage("h100", 8)
    libdir = tmp_path / "lib"
    libdir.mkdir()
    shutil.copy(build / "asan" / "libdcgm.so", libdir / "libdcgm.so.4")
    shutil.copy(build / "asan" / "libnvidia-ml.so", libdir / "libnvidia-ml.so.1")
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], check=True, capture_output=True, text=True).stdout
    env = {
        "MOKKA_STATE": str(staged.root.library),
        "LD_PRELOAD": libasan.strip(),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    with serve(libdir, **env) as exporter:
        for _ in range(3):
            samples = exporter.scrape()
        log = exporter.log
        assert exporter.process.poll() is None, log.read_text()[-3000:]
    assert sorted(by_gpu(samples, "DCGM_FI_DEV_GPU_TEMP")) == list(range(8))
    text = log.read_text()
    assert "AddressSanitizer" not in text and "runtime error" not in text, text[-3000:]
