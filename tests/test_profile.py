"""The profile model, built-in profiles and the `mokka profile` commands."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# The server a user means by the name (the quick start's `--set gpu.profile=<name>`): HGX/DGX
# baseboards of eight, GB200/GB300 compute trays of four, T4 servers of four, L40S servers of eight.
SERVER_GPUS = {"a100": 8, "b200": 8, "gb200": 4, "gb300": 4, "h100": 8, "h200": 8, "l40s": 8, "t4": 4}


@pytest.mark.parametrize("name", BUILTINS)
def test_default_count_is_the_server_a_user_runs(name: str) -> None:
    """Each profile's default GPU count is its server's, whatever the capture's was; every GPU of it
    has its own bus address and module id, including those beyond the capture's."""
    p = profile.load(name)
    assert p.gpu_count == SERVER_GPUS[name]
    assert p.description.startswith(f"{p.gpu_count}x ")
    for count in (1, p.gpu_count, 16):
        devices = p.with_count(count).devices()
        assert len({d.bus_id for d in devices}) == count, (name, count)
        assert len({d.module_id for d in devices}) == count, (name, count)


def test_a_captured_gpu_keeps_its_identity_beside_synthesized_ones() -> None:
    """a100's capture is one GPU at bus 06:00.0, module 7: it stays GPU 0, and the seven added
    take the free module ids."""
    devices = profile.load("a100").devices()
    assert (devices[0].bus_id, devices[0].module_id) == ("00000000:06:00.0", 7)
    assert sorted(d.module_id for d in devices) == list(range(1, 9))


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


def _h100(tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
    data = yaml.safe_load((Path(profile.__file__).parent / "profiles" / "h100.yaml").read_text())
    change(data)
    f = tmp_path / name
    f.write_text(yaml.safe_dump(data))
    return f


def _process(pid: int) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.setdefault("gpus", {}).__setitem__(
        1, {"processes": [{"pid": pid, "name": "x", "used_memory_mib": 1}]}
    )


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("pid-huge.yaml", _process(2**40), r"gpus\.1\.processes\.0\.pid: .*less than or equal to 2147483647"),
        ("pid-zero.yaml", _process(0), r"gpus\.1\.processes\.0\.pid: .*greater than or equal to 1"),
        (
            "used.yaml",
            lambda d: d["gpu"]["memory"].__setitem__("used_mib", 90000),
            r"gpu\.memory: used_mib \(90000\) \+ reserved_mib \(480\) exceed total_mib \(81559\)",
        ),
        (
            "override.yaml",
            lambda d: d.update(gpu_count=2, gpus={5: {"temperature": {"gpu": 80}}}),
            r"gpus\.5: no such GPU \(gpu_count 2: indices 0\.\.1\)",
        ),
    ],
)
def test_bad_values_are_one_line_errors_and_change_nothing(
    tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    f = _h100(tmp_path, name, change)
    before = sorted(tmp_path.iterdir())
    res = mokka("profile", "validate", str(f), cwd=tmp_path)
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mokka: error: {f}: "), res.stderr
    assert re.search(message, lines[0]), lines[0]
    assert sorted(tmp_path.iterdir()) == before
    out = tmp_path / "root"
    res = mokka("driver-root", "--profile", str(f), "--out", str(out))
    assert res.returncode == 1 and "Traceback" not in res.stderr and not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00\x00", r"not a UTF-8 text file \(byte 0xff at offset 8\)"),
        (b"name: x\x00\x01\x02", r"not a text file \(character #x00 at offset 7\)"),
        ("name: \u00e9\u00e9\n".encode("latin-1"), r"not a UTF-8 text file \(byte 0xe9 at offset 6\)"),
        (b"", r"empty \(a profile is a YAML mapping: name, gpu, \.\.\.\)"),
    ],
)
def test_binary_and_non_utf8_files(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "blob.yaml"
    f.write_bytes(content)
    res = mokka("profile", "validate", str(f), cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert len(res.stderr.splitlines()) == 1 and re.fullmatch(
        rf"mokka: error: {re.escape(str(f))}: {message}\n", res.stderr
    )
    assert f.read_bytes() == content and sorted(tmp_path.iterdir()) == [f]


def test_fewer_gpus_drop_overrides_beyond_the_count() -> None:
    b200 = profile.load("b200")
    assert max(b200.gpus) == 7
    two = b200.with_count(2)
    assert sorted(two.gpus) == [1] and two.gpus[1] == b200.gpus[1]
    assert [d.spec for d in two.devices()] == [d.spec for d in b200.devices()[:2]]
    res = mokka("profile", "show", "b200", "--gpus", "2", "--resolved", "--format", "json")
    assert res.returncode == 0, res.stderr


def test_validate_reports_every_file(tmp_path: Path) -> None:
    good = _h100(tmp_path, "good.yaml", lambda d: None)
    bad = _h100(tmp_path, "bad.yaml", lambda d: d["gpu"]["memory"].__setitem__("used_mib", 90000))
    res = mokka("profile", "validate", str(bad), str(good))
    assert res.returncode == 1
    assert f"{good}: ok (8x NVIDIA H100 80GB HBM3)" in res.stdout
    assert res.stderr.count("mokka: error: ") == 1 and str(bad) in res.stderr


def test_a_device_is_not_read_as_a_profile() -> None:
    res = mokka("profile", "show", "/dev/zero")  # would never end
    assert res.returncode == 1 and res.stderr == "mokka: error: /dev/zero: not a regular file\n"
