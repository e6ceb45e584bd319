"""`mokka profile import`: real captures become profiles that read back as the capture did."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench import fidelity
from fetch import nvidia_smi
from gpumodel import importer, profile
from gpumodel.smi_xml import parse, text

CAPTURES = Path(__file__).parent / "captures"
# Every nvidia-smi -q -x capture the tests hold (tests/captures/README.md names each source).
ALL = sorted(p for p in CAPTURES.rglob("qx-*.xml") if "mock-under" not in str(p))
PUBLIC = sorted((CAPTURES / "public").glob("qx-*.xml"))
ROUNDTRIP_TARGET = 0.99


def mokka(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


@pytest.mark.consumers
@pytest.mark.parametrize("capture", ALL, ids=lambda p: p.stem)
def test_roundtrip(capture: Path, tmp_path: Path) -> None:
    """Import, stage, read back with the Debian nvidia-smi nearest the capture's driver: the
    strict static values match on >= 99 % over all GPUs, and nothing is invented."""
    release = fidelity.release_for(text(parse(capture), "driver_version"))
    report = fidelity.roundtrip(capture, nvidia_smi.fetch(release), tmp_path, release)
    print(fidelity.table_row(capture.stem, release, report))
    assert report.compared > 100
    assert not report.invented, "\n".join(report.invented[:20])
    assert report.share >= ROUNDTRIP_TARGET, "\n".join(report.mismatched[:40])


def test_three_boards_without_a_builtin_profile() -> None:
    builtin = {profile.load(n).gpu.name for n in profile.builtin_names()}
    names = {text(parse(p).find("gpu"), "product_name") for p in PUBLIC}
    assert len(names - builtin) >= 3, names


def test_every_value_the_capture_carries(tmp_path: Path) -> None:
    """Board facts, per-GPU differences, bus and module ids, driver, N/A kept as N/A."""
    result = importer.import_capture(CAPTURES / "qx-h100.xml")
    data = result.data
    assert data["gpu_count"] == 8 and data["driver"] == {"version": "580.105.08", "cuda": "13.0"}
    g = data["gpu"]
    assert (g["name"], g["vbios_version"], g["board_part_number"]) == (
        "NVIDIA H100 80GB HBM3",
        "96.00.99.00.01",
        "692-2G520-0200-000",
    )
    assert g["pci"]["device_id"] == 0x2330 and g["memory"]["total_mib"] == 81559
    assert g["temperature"]["gpu_max"] == 87 and g["temperature"]["shutdown"] == 95  # from the T.Limit form
    assert g["clocks"]["supported"][0] == {"memory": 2619, "graphics": [], "graphics_range": [1980, 345, 15]}
    assert data["gpus"][3]["board_part_number"] == "965-2G520-A800-000"  # the one GPU that differs
    assert data["topology"]["bus_ids"][0] == "00000000:53:00.0"
    assert data["topology"]["module_ids"] == [7, 5, 6, 8, 1, 3, 4, 2]
    assert g["modes"]["sparse"] is False and g["power"]["memory_draw_w"] == 32.98
    assert result.base == "h100" and "cuda_cores" in result.inferred  # lent by the same board


def test_ids_regenerated_unless_kept() -> None:
    plain = importer.import_capture(CAPTURES / "public" / "qx-a10g.xml")
    assert "uuid" not in plain.data["gpu"] and "uuid" not in yaml.safe_dump(plain.data.get("gpus", {}))
    kept = importer.import_capture(CAPTURES / "public" / "qx-a10g.xml", keep_ids=True)
    assert kept.data["gpus"][0]["uuid"] == "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"
    prof = profile.Profile.model_validate(kept.data)
    assert prof.devices()[0].uuid == "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"


def test_inferred_and_unknown_fields_are_named() -> None:
    """An A10G has no built-in board: it borrows generic defaults from the nearest one (Ampere)
    and leaves board-specific counts unknown rather than borrowing another board's."""
    result = importer.import_capture(CAPTURES / "public" / "qx-a10g.xml")
    assert result.base == "a100"
    assert "compute_capability" in result.inferred and result.data["gpu"]["compute_capability"] == "8.6"
    assert set(result.unknown) == {"cuda_cores", "memory.bus_width", "nvlink"}
    assert result.data["gpu"]["cuda_cores"] is None and result.data["gpu"]["nvlink"]["links"] == 0
    head = result.yaml_text().split("\nname:")[0]
    assert "# Inferred" in head and "compute_capability" in head and "cuda_cores" in head


def test_legacy_capture_elements() -> None:
    """A v11 capture (515): power_readings, clocks_throttle_reasons, per-location ECC."""
    g = importer.import_capture(CAPTURES / "public" / "qx-a10g.xml").data["gpu"]
    assert g["power"]["limit_w"] == 300 and g["power"]["min_limit_w"] == 100 and g["power"]["management"]
    assert g["clocks_event_reasons"] == 1  # idle, from clocks_throttle_reasons
    p2000 = importer.import_capture(CAPTURES / "public" / "qx-quadro-p2000.xml").data["gpu"]
    assert p2000["modes"]["ecc"] is None and p2000["architecture"] == "Pascal" and p2000["brand"] == "Quadro"
    assert (p2000["temperature"]["target"], p2000["temperature"]["target_max"]) == (83, 98)
    assert p2000["clocks"]["supported"][2]["graphics"][0] == 607  # an uneven list kept as listed


def test_completing_files(tmp_path: Path) -> None:
    """The NVML dump fills what the XML lacks (CUDA cores, bus width, memory max), the
    --query-gpu CSV the compute capability, the -q text a part number the XML shows N/A."""
    h200 = CAPTURES / "h200"
    result = importer.import_capture(h200 / "qx-h200.xml", nvml=h200 / "nvml-dump.json")
    g = result.data["gpu"]
    assert (g["cuda_cores"], g["memory"]["bus_width"], g["temperature"]["memory_max"]) == (16896, 6016, 95)
    assert "cuda_cores" not in result.inferred and g["compute_capability"] == "9.0"
    csv = tmp_path / "q.csv"
    csv.write_text("name, compute_cap, memory.total [MiB]\nNVIDIA A10G, 8.7, 23028 MiB\n")
    assert (
        importer.import_capture(CAPTURES / "public" / "qx-a10g.xml", query=csv).data["gpu"]["compute_capability"]
        == "8.7"
    )
    xml = (CAPTURES / "public" / "qx-a10g.xml").read_text().replace("000-00000-0000-000", "N/A")
    (tmp_path / "a.xml").write_text(xml)
    q = tmp_path / "q.txt"
    q.write_text("GPU 00000000:00:1E.0\n    Product Name : NVIDIA A10G\n    GPU Part Number : 2237-892-A1\n")
    assert importer.import_capture(tmp_path / "a.xml", smi_q=q).data["gpu"]["gpu_part_number"] == "2237-892-A1"


def test_cli_writes_a_valid_profile(tmp_path: Path) -> None:
    capture = tmp_path / "t4.xml.gz"
    capture.write_bytes(gzip.compress((CAPTURES / "qx-t4.xml").read_bytes()))  # gzip accepted
    out = tmp_path / "mine.yaml"
    res = mokka("profile", "import", str(capture), "--name", "my-t4", "-o", str(out), "--driver", "550.163.01")
    assert res.returncode == 0, res.stderr
    assert "closest built-in: t4" in res.stderr
    prof = profile.load(out)
    assert (prof.name, prof.driver.version, prof.driver.cuda) == ("my-t4", "550.163.01", "13.2")
    res = mokka("profile", "import", str(CAPTURES / "qx-l40s.xml"), "--cuda", "12.4")
    assert res.returncode == 0 and profile.load_text(res.stdout, "stdout").driver.cuda == "12.4"


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("not xml at all", [], "not an nvidia-smi -q -x capture"),
        ("<html><body/></html>", [], "root element <html>"),
        ("<nvidia_smi_log></nvidia_smi_log>", [], "the capture lists no <gpu>"),
        (None, ["--nvml", "/etc/hostname"], "not an NVML dump"),
        (None, ["--name", "Bad Name"], "--name Bad Name"),
        (None, ["--driver", "latest"], "--driver latest"),
        (None, ["--query-csv", "/nonexistent.csv"], "/nonexistent.csv: cannot read"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, content: str | None, extra: list[str], message: str) -> None:
    capture = tmp_path / "in.xml"
    if content is None:
        capture.write_bytes((CAPTURES / "qx-t4.xml").read_bytes())
    else:
        capture.write_text(content)
    out = tmp_path / "out.yaml"
    res = mokka("profile", "import", str(capture), "-o", str(out), *extra)
    assert res.returncode == 1
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mokka: error: ") and message in lines[0], res.stderr
    assert not out.exists()


def test_missing_capture(tmp_path: Path) -> None:
    res = mokka("profile", "import", str(tmp_path / "nope.xml"))
    assert res.returncode == 1 and res.stderr.strip().endswith("nope.xml: cannot read: No such file or directory")


def test_json_dump_of_several_gpus_maps_by_index(tmp_path: Path) -> None:
    dump = json.loads((CAPTURES / "h200" / "nvml-dump.json").read_text())
    dump["devices"] = dump["devices"] * 2
    (tmp_path / "d.json").write_text(json.dumps(dump))
    xml = (CAPTURES / "h200" / "qx-h200.xml").read_text()
    gpu = xml[xml.index("<gpu ") : xml.index("</gpu>") + 6]
    two = xml.replace(gpu, gpu + "\n" + gpu.replace("00000000:00:06.0", "00000000:00:07.0"))
    (tmp_path / "two.xml").write_text(two)
    result = importer.import_capture(tmp_path / "two.xml", nvml=tmp_path / "d.json")
    assert result.data["gpu_count"] == 2 and result.data["gpu"]["cuda_cores"] == 16896
    assert result.data["topology"]["bus_ids"] == ["00000000:00:06.0", "00000000:00:07.0"]
