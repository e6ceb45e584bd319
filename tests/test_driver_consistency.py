"""Each profile reports a driver its board runs, and the library answers as that driver's would:
functions its release lacks are not there, GPM where the architecture has it, NVLinks that end
at the node's NVSwitches."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import Staged

from bench import fidelity
from gpumodel import driver_root, profile
from gpumodel.native import library_path
from gpumodel.smi_xml import parse, text
from hostsetup import sysfs

NATIVE = Path(__file__).resolve().parent.parent / "native"
FUNCTION_NOT_FOUND = 13


def staged_with(tmp_path: Path, base: str = "h100", **top: object) -> Staged:
    data = yaml.safe_load((Path(profile.__file__).parent / "profiles" / f"{base}.yaml").read_text())
    data.update(top)
    data["name"] = f"consistency-{base}"
    tmp_path.mkdir(parents=True, exist_ok=True)
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    prof = profile.load(f)
    return Staged(driver_root.stage(prof, tmp_path / "root"), prof)


@pytest.mark.parametrize("name", sorted(fidelity.BUILTIN_CAPTURES))
def test_builtin_profiles_report_their_captures_driver(name: str) -> None:
    """No built-in board claims a driver it cannot run (Blackwell on 550 did)."""
    root = parse(fidelity.CAPTURES / fidelity.BUILTIN_CAPTURES[name])
    prof = profile.load(name)
    assert (prof.driver.version, prof.driver.cuda) == (text(root, "driver_version"), text(root, "cuda_version"))
    if prof.gpu.architecture == "Blackwell":
        assert int(prof.driver.version.split(".")[0]) >= 570


def symbols(release: int) -> set[str]:
    return set((NATIVE / "symbols" / f"nvml-{release}.txt").read_text().split())


def implemented() -> set[str]:
    objects = sorted(str(p) for p in (NATIVE / "build" / "obj" / "src").glob("*.o"))
    out = subprocess.run(["nm", "--defined-only", "-g", *objects], capture_output=True, text=True, check=True).stdout
    return {parts[2] for parts in (line.split() for line in out.splitlines()) if len(parts) == 3}


def call_all(staged: Staged, names: list[str]) -> dict[str, int]:
    """Each function called with null arguments (a gated one answers before looking at them)."""
    code = (
        "import ctypes, json\n"
        "lib = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "assert lib.nvmlInit_v2() == 0\n"
        f"names = {names!r}\n"
        "print(json.dumps({n: getattr(lib, n)(None, None, None, None) for n in names}))\n"
    )
    import json

    return dict(json.loads(staged.python(code).stdout))


@pytest.mark.parametrize("release", [535, 550, 555])
def test_functions_the_release_lacks_are_not_found(tmp_path: Path, release: int) -> None:
    """Every function the mock implements that the reported release's library does not export
    answers NVML_ERROR_FUNCTION_NOT_FOUND; one that release exports does not."""
    version = {535: "535.261.03", 550: "550.163.01", 555: "555.58.02"}[release]
    staged = staged_with(tmp_path, driver={"version": version, "cuda": "12.4"})
    lacking = sorted(n for n in implemented() - symbols(release) if n.startswith("nvml"))
    assert "nvmlDeviceGetAddressingMode" in lacking
    answers = call_all(staged, [*lacking, "nvmlDeviceGetSramUniqueUncorrectedEccErrorCounts"])
    assert {n: r for n, r in answers.items() if r != FUNCTION_NOT_FOUND} == {}
    kept = call_all(staged, ["nvmlDeviceGetPciInfoExt", "nvmlDeviceGetTemperatureV"])
    for name, rc in kept.items():
        assert (rc == FUNCTION_NOT_FOUND) == (name not in symbols(release)), (name, rc)


def test_a_newer_release_exports_them(tmp_path: Path) -> None:
    staged = staged_with(tmp_path, driver={"version": "580.105.08", "cuda": "13.0"})
    code = (
        "import pynvml as N\n"
        "N.nvmlInit()\n"
        "h = N.nvmlDeviceGetHandleByIndex(0)\n"
        "print(N.nvmlDeviceGetAddressingMode(h), N.nvmlDeviceGetMarginTemperature(h))\n"
    )
    mode, margin = staged.python(code).stdout.split()
    assert mode == "0" and margin == "58"  # 87 C max - 29 C now
    old = staged_with(tmp_path / "old", driver={"version": "550.163.01", "cuda": "12.4"})
    res = old.python(code.replace("print(", "print(0 or "), check=False)
    assert res.returncode != 0 and "NVMLError_FunctionNotFound" in res.stderr


@pytest.mark.consumers
def test_gpm_through_nvidia_smi_dmon(tmp_path: Path, smi: tuple[str, Path]) -> None:
    """GPM on Hopper: dmon --gpm-metrics prints the metrics over its sampling interval from the
    GPU's utilization (graphics = SM = utilization, SM occupancy half of it, DRAM bandwidth the
    memory utilization); a Turing board prints '-'."""
    busy = staged_with(tmp_path / "h", gpu_count=1, gpus={0: {"utilization": {"gpu": 80, "memory": 30}}})
    out = busy.run([str(smi[1]), "dmon", "--gpm-metrics", "1,2,3,10", "-c", "5"]).stdout
    rows = [line.split()[-4:] for line in out.splitlines() if line.strip() and not line.startswith("#")]
    # dmon's sampling thread needs two samples before its printing thread shows a value (its first
    # row prints 0s), and under load its printing thread can read a row the sampler is half-way
    # through (some columns '-'): a full row shows every metric, and no row shows another value
    expected = ["80", "80", "40", "30"]
    assert expected in rows, out
    assert all(v in ("-", "0", want) for row in rows for v, want in zip(row, expected, strict=True)), out
    turing = staged_with(tmp_path / "t", "t4", gpu_count=1)
    out = turing.run([str(smi[1]), "dmon", "--gpm-metrics", "1", "-c", "3"]).stdout
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert [r[-1] for r in rows][1:] == ["-", "-"], out


def test_gpm_contract(stage: Callable[..., Staged]) -> None:
    """Support query, samples of one GPU taken in order, metrics with names, bad samples refused."""
    code = (
        "import pynvml as N, time\n"
        "N.nvmlInit()\n"
        "h = N.nvmlDeviceGetHandleByIndex(0)\n"
        "assert N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1\n"
        "a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()\n"
        "N.nvmlGpmSampleGet(h, a); time.sleep(0.01); N.nvmlGpmSampleGet(h, b)\n"
        "m = N.c_nvmlGpmMetricsGet_t(); m.version = N.NVML_GPM_METRICS_GET_VERSION; m.numMetrics = 3\n"
        "m.sample1, m.sample2 = a, b\n"
        "for i, mid in enumerate((N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_PCIE_TX_PER_SEC, 999)):\n"
        "    m.metrics[i].metricId = mid\n"
        "N.nvmlGpmMetricsGet(m)\n"
        "print(m.metrics[0].nvmlReturn, m.metrics[0].value, m.metrics[0].metricInfo.shortName.decode(),\n"
        "      m.metrics[1].nvmlReturn, m.metrics[2].nvmlReturn)\n"
        "m.sample1, m.sample2 = b, a\n"
        "try:\n"
        "    N.nvmlGpmMetricsGet(m); print('accepted')\n"
        "except N.NVMLError as e:\n"
        "    print('refused', e.value)\n"
        "N.nvmlGpmSampleFree(a); N.nvmlGpmSampleFree(b)\n"
    )
    out = stage("h100").python(code).stdout.split()
    assert out[:5] == ["0", "0.0", "sm_util", "0", "2"]
    assert out[5:] == ["refused", "2"]


def test_nvlink_far_ends_are_the_nodes_nvswitches(stage: Callable[..., Staged], tmp_path: Path) -> None:
    """On an HGX board every NVLink ends at one of the baseboard's NVSwitches (18 links over 4:
    5, 4, 4, 5), each a PCI bridge of NVIDIA's that lspci and hwloc find in the staged tree --
    what hwloc's NVML plugin needs to place the peer instead of warning it cannot."""
    staged = stage("h100")
    switches = staged.profile.topology.nvswitches
    code = (
        "import pynvml as N\n"
        "N.nvmlInit()\n"
        "h = N.nvmlDeviceGetHandleByIndex(0)\n"
        "for l in range(18):\n"
        "    p = N.nvmlDeviceGetNvLinkRemotePciInfo(h, l)\n"
        "    print(p.busId.decode() if isinstance(p.busId, bytes) else p.busId, hex(p.pciDeviceId))\n"
    )
    ends = [line.split() for line in staged.python(code).stdout.splitlines()]
    assert {e[0] for e in ends} == set(switches)
    assert [sum(e[0] == s for e in ends) for s in switches] == [5, 4, 4, 5]
    assert {e[1] for e in ends} == {"0x22a310de"}
    root = tmp_path / "tree"
    sysfs.write_tree(staged.profile, root)
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(library_path("libmokka-sysfs.so")), "MOKKA_SYSFS_ROOT": str(root)}
    lspci = subprocess.run(
        [shutil.which("lspci") or "lspci", "-D", "-nn"], env=env, capture_output=True, text=True
    ).stdout
    for bus in switches:
        assert re.search(rf"^{bus[4:].lower()} Bridge \[0680\]: NVIDIA Corporation .*\[10de:22a3\]", lspci, re.M)
    lstopo = shutil.which("lstopo-no-graphics") or "lstopo-no-graphics"
    xml = subprocess.run(
        [lstopo, "--of", "xml", "--whole-io"],
        env={**env, "HWLOC_COMPONENTS": "-gl,-opencl,-cuda,-nvml"},
        capture_output=True,
        text=True,
    ).stdout
    found = {o.get("pci_busid"): o.get("pci_type") for o in ET.fromstring(xml).iter("object") if o.get("pci_busid")}
    for bus in switches:
        assert (found.get(bus[4:].lower()) or "").startswith("0680 [10de:22a3]")


def test_boards_without_switches_keep_no_far_end(stage: Callable[..., Staged]) -> None:
    code = (
        "import pynvml as N\n"
        "N.nvmlInit()\n"
        "print(N.nvmlDeviceGetNvLinkRemotePciInfo(N.nvmlDeviceGetHandleByIndex(0), 0).domain)\n"
    )
    assert stage("b200").python(code).stdout.strip() == str(0xFFFFFFFF)


@pytest.mark.consumers
def test_h200_subsystem_and_l40s_persistence(stage: Callable[..., Staged], smi: tuple[str, Path]) -> None:
    """As their captures show: H200 sub-device 0x18BF, L40S persistence mode Enabled."""
    for name, path, want in (("h200", "pci/pci_sub_system_id", "18BF10DE"), ("l40s", "persistence_mode", "Enabled")):
        gpu = ET.fromstring(stage(name).run([str(smi[1]), "-q", "-x", "-i", "0"]).stdout).find("gpu")
        capture = parse(fidelity.CAPTURES / fidelity.BUILTIN_CAPTURES[name]).find("gpu")
        assert gpu is not None and gpu.findtext(path) == want == text(capture, path)
