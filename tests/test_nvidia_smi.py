"""The real nvidia-smi (Debian's 550 and 535) against the mock library, every mode."""

from __future__ import annotations

import csv
import io
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged
from test_profile import BUILTINS

pytestmark = pytest.mark.consumers

Smi = tuple[str, Path]


def arch_name(arch: str, smi_version: str) -> str:
    """How nvidia-smi spells an architecture; 535/550 predate Blackwell and print Unknown."""
    if arch == "Blackwell" and int(smi_version) < 570:
        return "Unknown"
    return {"Ada": "Ada Lovelace"}.get(arch, arch)


def smi_run(staged: Staged, smi: Smi, *args: str, check: bool = True) -> str:
    return staged.run([str(smi[1]), *args], check=check).stdout


@pytest.mark.parametrize("name", BUILTINS)
def test_plain(stage: Callable[..., Staged], smi: Smi, name: str) -> None:
    staged = stage(name)
    out = smi_run(staged, smi)
    assert f"Driver Version: {staged.profile.driver.version}" in out
    for dev in staged.profile.devices():
        assert dev.bus_id in out
        total, limit = str(dev.spec.memory.total_mib), str(round(dev.spec.power.limit_w))
        # 535's table is narrower: it cuts long cells with "...", as it does on real boards.
        assert f"{total}MiB" in out or (smi[0] == "535" and f"{total[:5]}..." in out)
        assert f"{limit}W" in out or (smi[0] == "535" and f"/ {limit[:1]}..." in out)
    assert out.count(staged.profile.gpu.name[:20]) == staged.profile.gpu_count
    assert "No running processes found" in out


@pytest.mark.parametrize("name", BUILTINS)
def test_list(stage: Callable[..., Staged], smi: Smi, name: str) -> None:
    staged = stage(name)
    lines = smi_run(staged, smi, "-L").splitlines()
    expected = [f"GPU {d.index}: {d.spec.name} (UUID: {d.uuid})" for d in staged.profile.devices()]
    assert lines == expected


@pytest.mark.parametrize("name", BUILTINS)
def test_query_xml(stage: Callable[..., Staged], smi: Smi, name: str) -> None:
    staged = stage(name)
    root = ET.fromstring(smi_run(staged, smi, "-q", "-x"))
    gpus = root.findall("gpu")
    assert len(gpus) == staged.profile.gpu_count
    for gpu, dev in zip(gpus, staged.profile.devices(), strict=True):
        s = dev.spec
        assert gpu.get("id") == dev.bus_id
        assert gpu.findtext("product_name") == s.name
        assert gpu.findtext("product_architecture") == arch_name(s.architecture, smi[0])
        assert gpu.findtext("uuid") == dev.uuid
        assert gpu.findtext("serial") == dev.serial
        assert gpu.findtext("vbios_version") == s.vbios_version
        assert gpu.findtext("board_part_number") == s.board_part_number
        assert gpu.findtext("pci/pci_device_id") == f"{s.pci.device_id:04X}10DE"
        assert gpu.findtext("pci/pci_sub_system_id") == f"{s.pci.subsystem_device_id:04X}10DE"
        assert gpu.findtext("pci/pci_gpu_link_info/pcie_gen/max_link_gen") == str(s.pci.max_link_gen)
        assert gpu.findtext("fb_memory_usage/total") == f"{s.memory.total_mib} MiB"
        assert gpu.findtext("bar1_memory_usage/total") == f"{s.memory.bar1_total_mib} MiB"
        assert gpu.findtext("gpu_power_readings/max_power_limit") == f"{s.power.max_limit_w:.2f} W"
        assert gpu.findtext("gpu_power_readings/min_power_limit") == f"{s.power.min_limit_w:.2f} W"
        assert gpu.findtext("max_clocks/sm_clock") == f"{s.clocks.max.sm} MHz"
        assert gpu.findtext("max_clocks/mem_clock") == f"{s.clocks.max.memory} MHz"
        assert gpu.findtext("temperature/gpu_temp") == f"{s.temperature.gpu} C"
        ecc = "N/A" if s.modes.ecc is None else ("Enabled" if s.modes.ecc else "Disabled")
        assert gpu.findtext("ecc_mode/current_ecc") == ecc
        mig = "N/A" if s.modes.mig is None else ("Enabled" if s.modes.mig else "Disabled")
        assert gpu.findtext("mig_mode/current_mig") == mig
        supported = gpu.findall("supported_clocks/supported_mem_clock")
        assert [e.findtext("value") for e in supported] == [f"{c.memory} MHz" for c in s.clocks.supported]


def test_query_text_single_gpu(stage: Callable[..., Staged], smi: Smi) -> None:
    staged = stage("h100")
    dev = staged.profile.devices()[5]
    out = smi_run(staged, smi, "-q", "-i", "5")
    assert out.count("Product Name") == 1
    assert f"GPU {dev.bus_id}" in out
    assert dev.uuid in out and dev.spec.vbios_version in out


WIDE_FIELDS = [
    "index",
    "name",
    "uuid",
    "serial",
    "pci.bus_id",
    "pci.device_id",
    "pci.sub_device_id",
    "driver_version",
    "vbios_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "power.draw",
    "power.limit",
    "power.default_limit",
    "power.min_limit",
    "power.max_limit",
    "enforced.power.limit",
    "temperature.gpu",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "pstate",
    "compute_mode",
    "persistence_mode",
    "ecc.mode.current",
    "mig.mode.current",
    "utilization.gpu",
    "utilization.memory",
    "pcie.link.gen.max",
    "pcie.link.width.max",
    "display_mode",
    "count",
]


@pytest.mark.parametrize("name", ["h100", "a100", "t4"])
def test_query_gpu_wide(stage: Callable[..., Staged], smi: Smi, name: str) -> None:
    staged = stage(name)
    out = smi_run(staged, smi, f"--query-gpu={','.join(WIDE_FIELDS)}", "--format=csv,noheader,nounits")
    rows = list(csv.reader(io.StringIO(out), skipinitialspace=True))
    assert len(rows) == staged.profile.gpu_count
    for row, dev in zip(rows, staged.profile.devices(), strict=True):
        got = dict(zip(WIDE_FIELDS, row, strict=True))
        s = dev.spec
        assert got["index"] == str(dev.index)
        assert got["name"] == s.name
        assert got["uuid"] == dev.uuid
        assert got["pci.bus_id"] == dev.bus_id
        assert got["pci.device_id"] == f"0x{s.pci.device_id:04X}10DE"
        assert got["driver_version"] == staged.profile.driver.version
        assert got["memory.total"] == str(s.memory.total_mib)
        assert float(got["power.limit"]) == pytest.approx(s.power.limit_w)
        assert float(got["power.max_limit"]) == pytest.approx(s.power.max_limit_w)
        assert got["temperature.gpu"] == str(s.temperature.gpu)
        assert got["clocks.max.sm"] == str(s.clocks.max.sm)
        assert got["count"] == str(staged.profile.gpu_count)
        assert got["pcie.link.gen.max"] == str(s.pci.max_link_gen)
        for field, value in got.items():
            assert "Uninitialized" not in value and "Unknown Error" not in value, f"{field}: {value}"


def test_query_compute_apps_empty(stage: Callable[..., Staged], smi: Smi) -> None:
    out = smi_run(stage("h100"), smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    assert out.strip().splitlines() == ["pid, process_name, used_gpu_memory [MiB]"]


def test_visible_devices_renumber(stage: Callable[..., Staged], smi: Smi) -> None:
    staged = stage("h100")
    devices = staged.profile.devices()
    out = staged.run([str(smi[1]), "-L"], NVIDIA_VISIBLE_DEVICES=f"1,{devices[3].uuid}").stdout.splitlines()
    assert out == [
        f"GPU 0: {devices[1].spec.name} (UUID: {devices[1].uuid})",
        f"GPU 1: {devices[3].spec.name} (UUID: {devices[3].uuid})",
    ]


def test_visible_devices_none_and_void(stage: Callable[..., Staged], smi: Smi) -> None:
    """``none`` is the driver without devices; ``void`` keeps the runtime out, so the process's
    own /dev decides: with no GPU node there (a bare host, or a privileged pod such as NVIDIA's
    DRA kubelet plugins, whose chart sets ``void``) every GPU."""
    staged = stage("h100", 2)
    res = staged.run([str(smi[1]), "-L"], NVIDIA_VISIBLE_DEVICES="none")
    assert "UUID" not in res.stdout, res.stdout
    out = staged.run([str(smi[1]), "-L"], NVIDIA_VISIBLE_DEVICES="void").stdout.splitlines()
    assert out == [f"GPU {i}: {d.spec.name} (UUID: {d.uuid})" for i, d in enumerate(staged.profile.devices())]


def test_topology_single_gpu(stage: Callable[..., Staged], smi: Smi) -> None:
    out = smi_run(stage("h100", 1), smi, "topo", "-m")
    assert "GPU0" in out and " X " in out


def test_topology_eight_gpus(stage: Callable[..., Staged], smi: Smi) -> None:
    """An HGX H100: every pair joined by 18 NVLinks, GPUs 0-3 and 4-7 on the two NUMA nodes."""
    out = smi_run(stage("h100"), smi, "topo", "-m")
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("GPU") and "\t" in line[:5]]
    assert len(rows) == 8
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row[1:9]]
        assert cells == ["X" if j == i else "NV18" for j in range(8)]
        assert row[10].strip() == str(i // 4)  # NUMA affinity (columns: 8 GPUs, CPU, NUMA, GPU NUMA ID)
        assert row[-1].strip() == "N/A"  # GPU NUMA ID: only coherent (C2C) GPUs are NUMA nodes


@pytest.mark.parametrize("name", BUILTINS)
@pytest.mark.parametrize("gpus", [1, 2, None])
def test_topology_of_every_profile_at_every_count(
    stage: Callable[..., Staged], smi: Smi, name: str, gpus: int | None
) -> None:
    """`nvidia-smi topo -m` asks every NVLink up to NVML's maximum: a link the board does not have is
    not supported on it (an A100 has 12 of 18), never an invalid argument, or the matrix fails."""
    staged = stage(name, gpus)
    out = smi_run(staged, smi, "topo", "-m")
    count, links = staged.profile.gpu_count, staged.profile.gpu.nvlink.links
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("GPU") and "\t" in line[:5]]
    assert len(rows) == count, out
    if links and count > 1:
        for i, row in enumerate(rows):
            assert [c.strip() for c in row[1 : count + 1]] == ["X" if j == i else f"NV{links}" for j in range(count)]


def test_nvlink_status(stage: Callable[..., Staged], smi: Smi) -> None:
    staged = stage("h100")
    out = smi_run(staged, smi, "nvlink", "-s", "-i", "0")
    links = [line for line in out.splitlines() if "Link" in line]
    assert len(links) == staged.profile.gpu.nvlink.links
    assert all("26.562 GB/s" in line for line in links)


def test_mig_list_on_non_mig_gpus(stage: Callable[..., Staged], smi: Smi) -> None:
    res = stage("h100").run([str(smi[1]), "mig", "-lgi"], check=False)
    assert "No MIG-enabled devices found" in res.stdout


@pytest.mark.parametrize("mode", ["dmon", "pmon"])
def test_monitoring(stage: Callable[..., Staged], smi: Smi, mode: str) -> None:
    staged = stage("h100", 2)
    res = staged.run([str(smi[1]), mode, "-c", "1"], check=False, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Not supported" not in res.stdout
    if mode == "dmon":
        rows = [line.split() for line in res.stdout.splitlines() if not line.startswith("#")]
        assert [r[0] for r in rows] == ["0", "1"]


def test_device_nodes_decide_visibility(stage: Callable[..., Staged], smi: Smi, tmp_path: Path) -> None:
    """In a container, only GPUs whose /dev/nvidiaN exist are visible, renumbered from 0."""
    if not shutil.which("unshare"):
        pytest.fail("unshare (util-linux) is required")
    staged = stage("h100")
    devices = staged.profile.devices()
    script = (
        "set -e; mount -t tmpfs none /dev; "
        "mknod /dev/nvidiactl c 195 255; mknod /dev/nvidia2 c 195 2; mknod /dev/nvidia5 c 195 5; "
        f"exec {smi[1]} -L"
    )
    res = staged.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], check=False)
    if res.returncode != 0 and "Operation not permitted" in res.stderr:
        pytest.fail(f"needs root (mount namespaces): {res.stderr}")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        f"GPU 0: {devices[2].spec.name} (UUID: {devices[2].uuid})",
        f"GPU 1: {devices[5].spec.name} (UUID: {devices[5].uuid})",
    ]


def test_processes_from_the_profile(smi: Smi, tmp_path: Path) -> None:
    """Processes a profile declares show in plain mode, -q and --query-compute-apps."""
    import yaml
    from conftest import Staged as StagedRoot

    from gpumodel import driver_root, profile

    data = yaml.safe_load((Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text())
    data["name"] = "busy"
    data["gpu_count"] = 2
    data["gpus"] = {
        1: {
            "processes": [
                {"pid": 4242, "name": "python3", "used_memory_mib": 1024},
                {"pid": 4343, "name": "Xorg", "used_memory_mib": 64, "type": "G"},
            ]
        }
    }
    f = tmp_path / "busy.yaml"
    f.write_text(yaml.safe_dump(data))
    prof = profile.load(f)
    staged = StagedRoot(driver_root.stage(prof, tmp_path / "root"), prof)
    plain = smi_run(staged, smi)
    assert "4242" in plain and "python3" in plain and "1024MiB" in plain
    assert "4343" in plain and " G " in plain
    apps = smi_run(staged, smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    assert apps.strip().splitlines() == ["4242, python3, 1024 MiB"]


def test_lost_gpu_as_nvidia_smi_reports_it(smi: Smi, tmp_path: Path) -> None:
    """A GPU marked lost fails its handle as a GPU off the bus does: nvidia-smi exits 15."""
    import yaml
    from conftest import Staged as StagedRoot

    from gpumodel import driver_root, profile

    data = yaml.safe_load((Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text())
    data.update(name="lost", gpu_count=2, gpus={1: {"lost": True}})
    f = tmp_path / "lost.yaml"
    f.write_text(yaml.safe_dump(data))
    prof = profile.load(f)
    staged = StagedRoot(driver_root.stage(prof, tmp_path / "root"), prof)
    res = staged.run([str(smi[1]), "-L"], check=False)
    assert res.returncode == 15  # NVML_ERROR_GPU_IS_LOST
    assert res.stdout.splitlines()[0].startswith("GPU 0: NVIDIA H100 80GB HBM3")
    assert "GPU is lost" in res.stdout + res.stderr
