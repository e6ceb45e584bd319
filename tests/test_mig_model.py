"""MIG in the model: the boards' tables, the placement rules against what real boards did, the
layout a profile declares, and the errors for layouts that could not exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mig_fixtures import mig_profile_data, write_profile

from gpumodel import mig, mig_state, profile, state


def create(board: mig.Board, ids: list[int]) -> list[tuple[int, int] | None]:
    """GIs created one by one without placements, as `nvidia-smi mig -cgi` does: (id, start)
    each, None where the driver would refuse."""
    gis: list[mig.GpuInstance] = []
    out: list[tuple[int, int] | None] = []
    for pid in ids:
        p = board.profile(pid)
        assert p is not None
        start = mig.choose_gi_start(board, gis, p)
        if start is None:
            out.append(None)
            continue
        gis.append(mig.GpuInstance(p, start, mig.gi_id(p, start)))
        out.append((gis[-1].id, start))
    return out


H100 = mig.board_by_key("h100-80gb")
A100 = mig.board_by_key("a100-40gb")
assert H100 is not None and A100 is not None


def test_seven_1g_on_an_h100_as_captured() -> None:
    """nvidia-smi mig -cgi 19 x7 -C on an H100 80GB HBM3 printed GI ids 13, 11, 12, 7, 8, 9, 10
    and -lgi showed id 7 at 0:1 ... 13 at 6:1."""
    assert create(H100, [19] * 7) == [(13, 6), (11, 4), (12, 5), (7, 0), (8, 1), (9, 2), (10, 3)]


def test_user_guide_sequences() -> None:
    """The MIG user guide's A100 examples (getting-started page)."""
    assert create(A100, [9, 19, 14, 19]) == [(2, 4), (7, 0), (4, 2), (8, 1)]
    assert create(A100, [14, 19, 19, 19, 19, 19]) == [(5, 4), (13, 6), (7, 0), (8, 1), (9, 2), (10, 3)]
    assert create(A100, [19, 19, 14, 9])[-1] is None  # "Insufficient Resources"


def test_two_3g_take_the_upper_half_first() -> None:
    assert [s for _, s in filter(None, create(H100, [9, 9]))] == [4, 0]
    assert create(H100, [9, 9, 9])[-1] is None


@pytest.mark.parametrize(
    ("gi", "expected"),
    [
        ("1g.10gb", [("1g.10gb", 0, 1, 16)]),
        ("2g.20gb", [("1c.2g.20gb", 0, 2, 16), ("2g.20gb", 1, 1, 32)]),
        ("3g.40gb", [("1c.3g.40gb", 0, 3, 20), ("2c.3g.40gb", 1, 1, 40), ("3g.40gb", 2, 1, 60)]),
        ("4g.40gb", [("1c.4g.40gb", 0, 4, 16), ("2c.4g.40gb", 1, 2, 32), ("4g.40gb", 3, 1, 64)]),
        (
            "7g.80gb",
            [
                ("1c.7g.80gb", 0, 7, 18),
                ("2c.7g.80gb", 1, 3, 37),
                ("3c.7g.80gb", 2, 2, 56),
                ("4c.7g.80gb", 3, 1, 75),
                ("7g.80gb", 4, 1, 132),
            ],
        ),
    ],
)
def test_compute_profiles(gi: str, expected: list[tuple[str, int, int, int]]) -> None:
    """-lcip as on A100s: no 3c in a 4g, floor(g/c) instances, IDs = NVML indices."""
    p = H100.profile(gi)
    assert p is not None
    assert [(c.name, c.id, c.instances, c.multiprocessors) for c in p.compute_profiles()] == expected


def test_a100_compute_slices_have_14_sms() -> None:
    p = A100.profile("7g.40gb")
    assert p is not None
    assert {c.multiprocessors // c.slices for c in p.compute_profiles()} == {14}


BUILTIN_TOTALS = {"a100": "a100-40gb", "h100": "h100-80gb", "h200": "h200-141gb", "b200": "b200", "gb200": "gb200"}


@pytest.mark.parametrize("name", sorted(BUILTIN_TOTALS))
def test_names_agree_with_what_gfd_computes(name: str) -> None:
    """GFD and the device plugin name profiles from memory (go-nvlib); the tables' names must be
    what they compute from the built-in profile's total memory, or labels and resources drift."""
    gpu = profile.load(name).gpu
    board = mig.board_for(gpu.pci.device_id)
    assert board is not None and board.key == BUILTIN_TOTALS[name]
    for p in board.profiles:
        suffix = "+me" if p.index == mig.GI_INDEX["1+me"] else ""
        assert mig.nvlib_profile_name(p.slices, p.slices, p.memory_mib, gpu.memory.total_mib, suffix) == p.name


def test_no_table_for_boards_without_mig() -> None:
    for name in ("l40s", "t4"):
        gpu = profile.load(name).gpu
        assert gpu.modes.mig is None and mig.board_for(gpu.pci.device_id) is None


def test_mig_minors_closed_form() -> None:
    """/proc/driver/nvidia-caps/mig-minors as the user guide shows it."""
    lines = mig.mig_minors_text().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi1/access 12" in lines and "gpu0/gi1/ci2/access 15" in lines
    assert lines[-2:] == ["gpu31/gi14/ci6/access 4321", "gpu31/gi14/ci7/access 4322"]
    assert len(lines) == 2 + 32 * 15 * 9


def test_mig_uuids_look_like_real_ones_and_are_stable() -> None:
    a = mig.mig_uuid("GPU-1", 1, 9, 0, 2)
    assert a == mig.mig_uuid("GPU-1", 1, 9, 0, 2)
    assert len({a, mig.mig_uuid("GPU-1", 2, 9, 0, 2), mig.mig_uuid("GPU-2", 1, 9, 0, 2)}) == 3
    assert a.startswith("MIG-") and len(a) == 40 and a[18] == "5" and a[23] in "89ab"


# ---- layouts in profiles ---------------------------------------------------------------


def load(tmp_path: Path, data: dict[str, Any]) -> profile.Profile:
    return profile.load(write_profile(tmp_path / "p.yaml", data))


def test_declared_layout_is_placed_as_the_driver_would(tmp_path: Path) -> None:
    p = load(
        tmp_path,
        mig_profile_data(
            mode=True,
            instances=[
                {"profile": "3g.40gb", "compute": ["2c.3g.40gb", {"profile": "1c.3g.40gb", "placement": 2}]},
                {"profile": 14},
                {"profile": "MIG 1g.10gb", "placement": 2, "compute": []},
            ],
        ),
    )
    gis = mig_state.initial_layout(p.gpu)
    assert [(g.profile.name, g.id, g.start) for g in gis] == [("3g.40gb", 2, 4), ("2g.20gb", 3, 0), ("1g.10gb", 9, 2)]
    assert [(c.profile.name, c.id, c.start) for c in gis[0].compute] == [("2c.3g.40gb", 0, 0), ("1c.3g.40gb", 1, 2)]
    assert [c.profile.name for c in gis[1].compute] == ["2g.20gb"]  # the default: one CI spanning the GI
    assert gis[2].compute == []
    assert p.gpu.modes.mig is True  # mig.mode sets modes.mig


def test_layout_reads_back_from_the_compiled_state(tmp_path: Path) -> None:
    p = load(tmp_path, mig_profile_data(gpus=2, mode=True, pending=True, instances=[{"profile": "7g.80gb"}]))
    path = tmp_path / "state.bin"
    path.write_bytes(state.compile_profile(p))
    gpus = mig_state.read(path)
    assert [(g.current, g.pending, len(g.devices)) for g in gpus] == [(True, True, 1), (True, True, 1)]
    d = gpus[1].devices[0]
    assert (d.gpu, d.index, d.gi, d.ci, d.profile, d.placement) == (1, 0, 0, 0, "7g.80gb", (0, 8))
    assert d.uuid == mig.mig_uuid(p.devices()[1].uuid, 0, 0, 0, 4)
    assert (d.gi_cap_minor, d.ci_cap_minor) == (3 + 135, 3 + 135 + 1)


def test_pending_mode(tmp_path: Path) -> None:
    p = load(tmp_path, mig_profile_data(gpus=1, mode=False, pending=True))
    path = tmp_path / "state.bin"
    path.write_bytes(state.compile_profile(p))
    assert [(g.current, g.pending) for g in mig_state.read(path)] == [(False, True)]


def test_builtin_profiles_compile_with_mig_off() -> None:
    for name in profile.builtin_names():
        p = profile.load(name)
        for g in mig_state.read_region(state.compile_profile(p)):
            assert not g.current and g.devices == ()


BAD = [
    (
        {"mode": True, "instances": [{"profile": "4g.40gb"}, {"profile": "3g.40gb", "placement": 0}]},
        "gpu.mig.instances.1.placement: 3g.40gb at 0:4 overlaps mig.instances.0",
    ),
    (
        {"mode": True, "instances": [{"profile": "3g.40gb", "placement": 2}]},
        "gpu.mig.instances.0.placement: 3g.40gb can start only at memory slice 0, 4, not 2",
    ),
    (
        {"mode": True, "instances": [{"profile": "7g.80gb"}, {"profile": "1g.10gb"}]},
        "gpu.mig.instances.1: no room for 1g.10gb (insufficient resources",
    ),
    (
        {"mode": True, "instances": [{"profile": "1g.10gb+me"}, {"profile": 20}]},
        "gpu.mig.instances.1: no room for 1g.10gb+me",
    ),
    ({"mode": True, "instances": [{"profile": "3g.20gb"}]}, "gpu.mig.instances.0.profile: '3g.20gb' is not a GPU"),
    (
        {"mode": True, "instances": [{"profile": "4g.40gb", "compute": ["3c.4g.40gb"]}]},
        "gpu.mig.instances.0.compute.0: '3c.4g.40gb' is not a compute instance profile of 4g.40gb",
    ),
    (
        {"mode": True, "instances": [{"profile": "2g.20gb", "compute": ["2g.20gb", "1c.2g.20gb"]}]},
        "gpu.mig.instances.0.compute.1: no room for 1c.2g.20gb in 2g.20gb",
    ),
    ({"mode": False, "instances": [{"profile": "1g.10gb"}]}, "gpu.mig.instances: GPU instances need MIG mode on"),
    ({"board": "a300"}, "gpu.mig.board: no MIG table 'a300'"),
]


@pytest.mark.parametrize(("section", "message"), BAD)
def test_impossible_layouts_are_refused(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    with pytest.raises(profile.ProfileError) as err:
        load(tmp_path, mig_profile_data(**section))
    assert str(tmp_path / "p.yaml") in str(err.value)
    assert message in str(err.value), err.value


@pytest.mark.parametrize("name", ["l40s", "t4"])
def test_boards_without_mig_refuse_it(tmp_path: Path, name: str) -> None:
    with pytest.raises(profile.ProfileError) as err:
        load(tmp_path, mig_profile_data(name, 1, mode=True))
    assert "gpu.mig: " in str(err.value) and "does not support MIG" in str(err.value)


def test_a_per_gpu_override_turns_mig_off_for_one_gpu(tmp_path: Path) -> None:
    data = mig_profile_data(gpus=2, mode=True, instances=[{"profile": "7g.80gb"}])
    data["gpus"][1] = {"mig": {"mode": False}}
    with pytest.raises(profile.ProfileError) as err:
        load(tmp_path, data)
    assert "gpus.1.mig.instances: GPU instances need MIG mode on" in str(err.value)
    data["gpus"][1] = {"mig": {"mode": False, "instances": []}}
    p = load(tmp_path, data)
    assert [d.spec.modes.mig for d in p.devices()] == [True, False]


def test_cli_names_file_and_field_and_changes_nothing(tmp_path: Path) -> None:
    source = write_profile(tmp_path / "bad.yaml", mig_profile_data(**BAD[0][0]))
    out = tmp_path / "root"
    res = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "driver-root", "--profile", str(source), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(f"mokka: error: {source}: invalid profile")
    assert "gpu.mig.instances.1.placement" in res.stderr
    assert not out.exists()
