"""Each built-in profile against its real-hardware capture, through the real nvidia-smi.

Every GPU of each capture is scored against a mock with the capture's GPU count, per field
class (bench/fidelity.py says what each class holds and what the strict rule counts).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench import fidelity
from fetch import nvidia_smi
from gpumodel import profile

pytestmark = pytest.mark.consumers

STRICT_TARGET = 0.98  # nvidia-smi 550: static value-carrying fields matched over all GPUs
OTHER_RELEASES_WITHIN = 0.02  # 535 and 555 within 2 points of 550


def score(name: str, version: str, smi: Path, workdir: Path) -> fidelity.Report:
    capture = (fidelity.CAPTURES / fidelity.BUILTIN_CAPTURES[name]).read_text()
    return fidelity.score_profile(profile.load(name), capture, smi, workdir)


def test_every_builtin_profile_has_a_capture() -> None:
    assert sorted(fidelity.BUILTIN_CAPTURES) == profile.builtin_names()


@pytest.mark.parametrize("name", sorted(fidelity.BUILTIN_CAPTURES))
def test_fidelity(
    smi: tuple[str, Path], name: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    report = score(name, smi[0], smi[1], tmp_path)
    record_property("strict", report.share)
    for cls in fidelity.CLASSES:
        record_property(cls, report.classes[cls].share)
    print(fidelity.table_row(name, smi[0], report))
    assert report.gpus == len(profile.load(name).with_count(report.gpus).devices())
    assert report.compared > 100
    assert not report.invented, "\n".join(report.invented[:20])
    target = STRICT_TARGET if smi[0] == "550" else STRICT_TARGET - OTHER_RELEASES_WITHIN
    assert report.share >= target, "\n".join(report.mismatched[:40])


@pytest.mark.parametrize("name", sorted(fidelity.BUILTIN_CAPTURES))
def test_releases_agree(name: str, tmp_path: Path) -> None:
    """535 and 555 read each profile within two points of what 550 reads."""
    shares = {v: score(name, v, nvidia_smi.fetch(v), tmp_path / v).share for v in ("550", "535", "555")}
    for version in ("535", "555"):
        assert abs(shares[version] - shares["550"]) <= OTHER_RELEASES_WITHIN, shares


def test_strict_counts_what_the_lenient_rule_skipped() -> None:
    """SRAM counters, T.Limit thresholds and sparse mode count under the strict rule; an element
    the release does not print is listed, not counted; a capture N/A the mock fills is invented."""
    capture = """<nvidia_smi_log><gpu id="0">
        <product_name>B</product_name><sparse_operation_mode>Disabled</sparse_operation_mode>
        <gpu_recovery_action>None</gpu_recovery_action><compute_mode>Default</compute_mode>
        <ecc_errors><volatile><sram_correctable>0</sram_correctable></volatile></ecc_errors>
        <temperature><gpu_temp>30 C</gpu_temp><gpu_temp_max_tlimit_threshold>-8 C</gpu_temp_max_tlimit_threshold>
        </temperature><serial>1</serial></gpu></nvidia_smi_log>"""
    mock = """<nvidia_smi_log><gpu id="0">
        <product_name>B</product_name><sparse_operation_mode>N/A</sparse_operation_mode>
        <compute_mode>Exclusive_Process</compute_mode>
        <ecc_errors><volatile><sram_correctable>0</sram_correctable></volatile></ecc_errors>
        <temperature><gpu_temp>31 C</gpu_temp><gpu_temp_max_threshold>95 C</gpu_temp_max_threshold></temperature>
        <serial>2</serial></gpu></nvidia_smi_log>"""
    known = frozenset(
        [
            "gpu",
            "product_name",
            "sparse_operation_mode",
            "compute_mode",
            "ecc_errors",
            "volatile",
            "sram_correctable",
            "temperature",
            "gpu_temp",
            "gpu_temp_max_tlimit_threshold",
            "gpu_temp_max_threshold",
            "serial",
        ]
    )
    report = fidelity.compare(capture, mock, known)
    # product name, SRAM count match; sparse mode, compute mode, the T.Limit threshold do not
    assert (report.strict.matched, report.strict.compared) == (2, 5)
    assert report.classes["health"].compared == 1 and report.classes["live"].compared == 1
    assert any("gpu_recovery_action" in u for u in report.unprintable)
    assert report.lenient.compared == 3  # the old rule skipped ECC and T.Limit
    swapped = fidelity.compare(capture.replace("Default", "N/A"), mock, known)
    assert swapped.invented == ["GPU 0 compute_mode: capture 'N/A', mock 'Exclusive_Process'"]


@pytest.mark.parametrize(
    ("path", "cls"),
    [
        ("product_name", "board"),
        ("supported_clocks/supported_mem_clock[0]/supported_graphics_clock[3]", "board"),
        ("max_clocks/graphics_clock", "board"),
        ("clocks/graphics_clock", "live"),
        ("temperature/gpu_temp_slow_tlimit_threshold", "board"),
        ("temperature/gpu_temp_tlimit", "live"),
        ("ecc_errors/aggregate/sram_threshold_exceeded", "health"),
        ("remapped_rows/row_remapper_histogram/row_remapper_histogram_max", "board"),
        ("remapped_rows/remapped_row_pending", "health"),
        ("sparse_operation_mode", "config"),
        ("gpu_power_readings/current_power_limit", "config"),
        ("gpu_power_readings/max_power_limit", "board"),
        ("gpu_reset_status/reset_required", "host"),
        ("pci/pci_bus_id", "identity"),
        ("driver_version", "host"),
        ("mig_devices/mig_device[2]/gpu_instance_id", "mig"),
        ("mig_devices/mig_device[0]/device_attributes/shared/multiprocessor_count", "mig"),
        ("mig_devices/mig_device[0]/fb_memory_usage/total", "mig"),
        ("mig_devices/mig_device[0]/fb_memory_usage/used", "live"),
        ("mig_mode/current_mig", "config"),
    ],
)
def test_field_classes(path: str, cls: str) -> None:
    assert fidelity.field_class(path) == cls


def test_dtd_elements_of_each_release() -> None:
    """What each release prints comes from the DTD it embeds: 550 knows the SRAM lines and
    T.Limit thresholds, none of 535/550/555 knows 580's gpu_recovery_action."""
    for version in ("535", "550", "555"):
        known = fidelity.dtd_elements(nvidia_smi.fetch(version))
        assert {"sram_threshold_exceeded", "gpu_temp_max_tlimit_threshold", "sparse_operation_mode"} <= known
        assert "gpu_recovery_action" not in known
