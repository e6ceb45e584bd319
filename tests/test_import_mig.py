"""`mokka profile import` carries a capture's MIG layout into the profile (gpumodel/mig_import.py).

The real capture (tests/captures/public/qx-a100-sxm4-80gb-mig.xml, four 1g.20gb MIG devices) is
imported and read back with the real nvidia-smi: the same MIG devices in ``-q -x`` (the fidelity
scorer's ``mig`` class) and in ``-L``. Other layouts go the same way through the real nvidia-smi:
a mock with a known layout prints ``-q -x``, that output is imported, and the layout comes back.
What a capture cannot say is inferred and named in the notes; what could not exist is not imported.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Staged

from bench import fidelity
from fetch import nvidia_smi
from gpumodel import driver_root, importer, mig, mig_state, profile
from gpumodel.smi_xml import parse, text

CAPTURE = Path(__file__).parent / "captures" / "public" / "qx-a100-sxm4-80gb-mig.xml"


def layout_of(spec: profile.GpuSpec) -> list[tuple[int, str, int, list[tuple[int, str, int]]]]:
    """(GI id, profile, start, [(CI id, profile, start)]) of a GPU's declared layout."""
    return [
        (g.id, g.profile.name, g.start, [(c.id, c.profile.name, c.start) for c in g.compute])
        for g in mig_state.initial_layout(spec)
    ]


def test_the_captured_layout_becomes_the_profiles() -> None:
    result = importer.import_capture(CAPTURE)
    section = result.data["gpu"]["mig"]
    assert section == {"mode": True, "instances": [{"profile": "1g.20gb", "placement": s} for s in (0, 2, 4, 6)]}
    assert result.data["gpu"]["modes"]["mig"] is True
    prof = profile.Profile.model_validate(result.data)
    assert layout_of(prof.devices()[0].spec) == [(i, "1g.20gb", 2 * (i - 3), [(0, "1g.20gb", 0)]) for i in (3, 4, 5, 6)]
    note = next(n for n in result.notes if "MIG layout from the capture's 4 MIG devices" in n)
    assert "placements are not in -q -x" in note and "differ" not in note
    assert any(i.startswith("mig.instances") for i in result.inferred)
    head = result.yaml_text().split("\nname:")[0]
    assert "mig.instances" in head and "GI 3 1g.20gb" in head


@pytest.mark.consumers
def test_a_mock_of_the_capture_shows_its_mig_devices(tmp_path: Path) -> None:
    """The mock built from the import, read with the nvidia-smi nearest the capture's driver:
    every MIG device element of ``-q -x`` as captured (the ``mig`` class, scored), and ``-L``
    lists the four devices under their GPU."""
    release = fidelity.release_for(text(parse(CAPTURE), "driver_version"))
    smi = nvidia_smi.fetch(release)
    report = fidelity.roundtrip(CAPTURE, smi, tmp_path / "rt", release)
    mig_class = report.classes["mig"]
    assert mig_class.compared == 4 * 13 and mig_class.matched == mig_class.compared, report.mismatched
    assert report.share == 1.0, report.mismatched
    prof = profile.Profile.model_validate(importer.import_capture(CAPTURE).data)
    root = driver_root.stage(prof, tmp_path / "root")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(root.libdir)}
    listing = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, check=True).stdout
    lines = listing.splitlines()
    assert lines[0].startswith("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-")
    assert [re.sub(r"\(UUID: MIG-[0-9a-f-]{36}\)", "(UUID)", line) for line in lines[1:]] == [
        f"  MIG 1g.20gb     Device  {k}: (UUID)" for k in range(4)
    ]


LAYOUTS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "h100",
        [
            {"profile": "3g.40gb"},
            {"profile": "2g.20gb", "compute": ["1c.2g.20gb", "1c.2g.20gb"]},
            {"profile": "1g.10gb+me"},
            {"profile": "1g.10gb"},
        ],
    ),
    ("h100", [{"profile": "1g.20gb"}, {"profile": "1g.20gb"}, {"profile": "4g.40gb", "compute": ["2c.4g.40gb"]}]),
    ("a100", [{"profile": "7g.40gb", "compute": ["3c.7g.40gb", "2c.7g.40gb", "1c.7g.40gb", "1c.7g.40gb"]}]),
    ("a100", [{"profile": "3g.20gb", "placement": 0}, {"profile": "2g.10gb", "placement": 4}, {"profile": "1g.5gb"}]),
]


@pytest.mark.consumers
@pytest.mark.parametrize(("base", "instances"), LAYOUTS, ids=lambda v: v if isinstance(v, str) else None)
def test_layouts_come_back_through_the_real_nvidia_smi(
    stage_mig: Callable[..., Staged], base: str, instances: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A mock with a known layout on GPU 0 and MIG off on GPU 1 prints ``-q -x`` (nvidia-smi 550);
    the import of that output declares the same GIs, placements and CIs, and a mock built from it
    prints the same MIG devices."""
    staged = stage_mig(base, 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=instances)
    smi = nvidia_smi.fetch("550")
    shown = staged.run([str(smi), "-q", "-x"]).stdout
    capture = tmp_path / "capture.xml"
    capture.write_text(shown)
    result = importer.import_capture(capture)
    prof = profile.Profile.model_validate(result.data)
    devices = prof.devices()
    assert layout_of(devices[0].spec) == layout_of(staged.profile.devices()[0].spec)
    assert devices[1].spec.modes.mig is False and not layout_of(devices[1].spec)
    assert not [n for n in result.notes if "not imported" in n or "differ" in n], result.notes
    report = fidelity.score_profile(prof, shown, smi, tmp_path / "again", "550")
    assert report.classes["mig"].compared > 0 and report.classes["mig"].share == 1.0, report.mismatched


def _variant(tmp_path: Path, edit: Callable[[str], str]) -> importer.ImportResult:
    path = tmp_path / "variant.xml"
    path.write_text(edit(CAPTURE.read_text()))
    return importer.import_capture(path)


def _device(gi: int, ci: int, mib: int | None, sms: int | None, ce: int | None = 1) -> str:
    attrs = "" if sms is None else f"<multiprocessor_count>{sms}</multiprocessor_count>"
    attrs += "" if ce is None else f"<copy_engine_count>{ce}</copy_engine_count>"
    memory = "" if mib is None else f"<fb_memory_usage><total>{mib} MiB</total></fb_memory_usage>"
    return (
        f"<mig_device><index>0</index><gpu_instance_id>{gi}</gpu_instance_id>"
        f"<compute_instance_id>{ci}</compute_instance_id>"
        f"<device_attributes><shared>{attrs}</shared></device_attributes>{memory}</mig_device>"
    )


def _devices(*devices: str) -> Callable[[str], str]:
    def edit(xml: str) -> str:
        head, rest = xml.split("<mig_devices>", 1)
        return head + "<mig_devices>" + "".join(devices) + rest[rest.index("</mig_devices>") :]

    return edit


@pytest.mark.parametrize(
    ("edit", "note"),
    [
        # a board without a MIG table in this Mokka (PCI device id changed)
        (lambda x: x.replace("<pci_device_id>20B2", "<pci_device_id>20F3"), "no MIG profile table for NVIDIA A100"),
        # two full-GPU instances cannot coexist
        (_devices(_device(0, 0, 80896, 98, 7), _device(1, 0, 80896, 98, 7)), "could not exist"),
        # memory no profile has
        (_devices(_device(3, 0, 4096, 14)), "matches no profile"),
        # nothing to tell the profile by (a trimmed capture)
        (_devices(_device(1, 0, None, None, None)), "show neither memory nor SMs nor engines"),
        (_devices(_device(3, 0, 19968, 14), _device(3, 0, 19968, 14)), "repeats GPU instance 3, compute instance 0"),
    ],
)
def test_what_cannot_be_imported_is_said(tmp_path: Path, edit: Callable[[str], str], note: str) -> None:
    """The rest of the capture imports; the GPU keeps its captured MIG mode, with no layout."""
    result = _variant(tmp_path, edit)
    assert result.data["gpu"]["modes"]["mig"] is True and result.data["gpu"].get("mig") is None
    said = [n for n in result.notes if "MIG layout not imported" in n]
    assert len(said) == 1 and note in said[0], result.notes
    profile.Profile.model_validate(result.data)


def test_what_the_capture_cannot_tell_is_inferred_and_said(tmp_path: Path) -> None:
    # memory alone: 1g.20gb and 2g.20gb share it on an A100 80GB
    result = _variant(tmp_path, _devices(_device(3, 0, 19968, None, None)))
    assert result.data["gpu"]["mig"]["instances"] == [{"profile": "1g.20gb", "placement": 0}]
    assert any("could be 1g.20gb or 2g.20gb" in n for n in result.notes)
    # a GI ID the mock's numbering cannot give that profile (14 is past 1g's placements): the
    # driver's placement stands, and the IDs that come out differ from the capture's
    result = _variant(tmp_path, _devices(_device(14, 0, 9728, 14, 1)))
    assert result.data["gpu"]["mig"]["instances"] == [{"profile": "1g.10gb"}]
    note = next(n for n in result.notes if "MIG layout from" in n)
    assert "where the driver would put them" in note and "differ from the capture's [(14, [0])]" in note
    # compute instances by SM count; a gap in CI IDs cannot be declared
    result = _variant(tmp_path, _devices(_device(1, 0, 40192, 14, 3), _device(1, 2, 40192, 28, 3)))
    # (a 2c CI fits a 3g GI only at 0: the 1c one, created first, goes after it)
    assert result.data["gpu"]["mig"]["instances"] == [
        {
            "profile": "3g.40gb",
            "placement": 0,
            "compute": [{"profile": "1c.3g.40gb", "placement": 2}, {"profile": "2c.3g.40gb", "placement": 0}],
        }
    ]
    assert any("[(1, [0, 1])] differ from the capture's [(1, [0, 2])]" in n for n in result.notes)


def test_pending_mode_is_kept(tmp_path: Path) -> None:
    result = _variant(
        tmp_path,
        lambda x: _devices()(x).replace("<current_mig>Enabled", "<current_mig>Disabled"),
    )
    assert result.data["gpu"]["mig"] == {"mode": False, "pending": True}
    prof = profile.Profile.model_validate(result.data)
    assert mig_state.pending_mode(prof.devices()[0].spec) is True and prof.devices()[0].spec.modes.mig is False


def test_tables_cover_the_capture() -> None:
    """The capture confirms the A100 80GB 1g.20gb row (memory, SMs, engines) gpumodel/mig.py
    had inferred from the 40GB board."""
    row = mig.board_by_key("a100-80gb").profile("1g.20gb")  # type: ignore[union-attr]
    assert row is not None
    assert (row.memory_mib, row.multiprocessors, row.copy_engines, row.decoders, row.jpeg, row.ofa) == (
        19968,
        14,
        1,
        1,
        0,
        0,
    )
