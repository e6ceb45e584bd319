"""The profile model, built-in profiles and the `mokka profile` commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpumodel import profile, state

BUILTINS = ["a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4"]


def mokka(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_every_builtin_is_present() -> None:
    assert profile.builtin_names() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_compiles(name: str) -> None:
    p = profile.load(name)
    data = state.compile_profile(p)
    _, _, count = state.check(data)
    assert count == p.gpu_count
    assert len(data) == state.region_size(count)


@pytest.mark.parametrize("count", [1, 8, 13, 64])
def test_any_gpu_count(count: int) -> None:
    p = profile.load("h100").with_count(count)
    devices = p.devices()
    assert len(devices) == count
    assert len({d.bus_id for d in devices}) == count
    assert len({d.uuid for d in devices}) == count
    state.compile_profile(p)


def test_gpu_count_bounds() -> None:
    with pytest.raises(ValueError):
        profile.load("h100").with_count(65)
    with pytest.raises(ValueError):
        profile.load("h100").with_count(0)


def test_overrides_apply_to_one_gpu(tmp_path: Path) -> None:
    data = yaml.safe_load((Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text())
    data["name"] = "hot"
    data.setdefault("gpus", {}).setdefault(3, {}).update({"temperature": {"gpu": 81}, "power": {"draw_w": 650}})
    f = tmp_path / "hot.yaml"
    f.write_text(yaml.safe_dump(data))
    base = profile.load("h100").devices()
    devices = profile.load(f).devices()
    assert devices[3].spec.temperature.gpu == 81
    assert devices[3].spec.power.draw_w == 650
    assert devices[2].spec == base[2].spec
    assert devices[3].spec.temperature.shutdown == base[3].spec.temperature.shutdown  # untouched fields stay


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    return f


def test_unknown_field_is_named(tmp_path: Path) -> None:
    base = (Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text()
    f = _write(tmp_path, base.replace("  vbios_version:", "  vbios_versoin:"))
    with pytest.raises(profile.ProfileError) as exc:
        profile.load(f)
    msg = str(exc.value)
    assert str(f) in msg
    assert "gpu.vbios_versoin" in msg
    assert "gpu.vbios_version" in msg  # and the required field it replaced is missing


def test_wrong_type_is_named(tmp_path: Path) -> None:
    base = (Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text()
    f = _write(tmp_path, base.replace("limit_w: 700,", "limit_w: lots,"))
    with pytest.raises(profile.ProfileError) as exc:
        profile.load(f)
    assert "gpu.power.limit_w" in str(exc.value)


def test_bad_override_is_named(tmp_path: Path) -> None:
    base = (Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text()
    data = yaml.safe_load(base)
    data.setdefault("gpus", {})[2] = {"memory": {"totl_mib": 5}}
    f = _write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(profile.ProfileError) as exc:
        profile.load(f)
    assert "gpus.2" in str(exc.value) and "totl_mib" in str(exc.value)


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    f = _write(tmp_path, "name: x\ngpu: [unclosed\n")
    with pytest.raises(profile.ProfileError) as exc:
        profile.load(f)
    assert str(f) in str(exc.value) and "line" in str(exc.value)


def test_unknown_profile_lists_builtins() -> None:
    with pytest.raises(profile.ProfileError) as exc:
        profile.load("h900")
    assert "h100" in str(exc.value)


def test_cli_list_and_show() -> None:
    res = mokka("profile", "list")
    assert res.returncode == 0
    for name in BUILTINS:
        assert name in res.stdout
    res = mokka("profile", "show", "h100", "--gpus", "2", "--resolved", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count('"bus_id"') == 2


def test_cli_validate_bad_file_exits_nonzero_and_writes_nothing(tmp_path: Path) -> None:
    f = _write(tmp_path, "name: broken\ngpu: {name: x}\n")
    before = sorted(tmp_path.iterdir())
    res = mokka("profile", "validate", str(f), cwd=tmp_path)
    assert res.returncode == 1
    assert str(f) in res.stderr and "gpu.architecture" in res.stderr
    assert sorted(tmp_path.iterdir()) == before


def test_cli_driver_root_bad_profile_writes_nothing(tmp_path: Path) -> None:
    f = _write(tmp_path, "name: broken\n")
    out = tmp_path / "root"
    res = mokka("driver-root", "--profile", str(f), "--out", str(out))
    assert res.returncode == 1
    assert "gpu" in res.stderr
    assert not out.exists()
