"""containerd configuration: plan, diff, apply, remove; checked with the real containerd 1.7 and 2.1."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from fetch import containerd_dist
from gpumodel import atomic
from hostsetup import containerd as cc
from hostsetup.containerd import systemd as cc_systemd

RUNC = "/usr/sbin/runc"
NRI = "io.containerd.nri.v1.nri"
CRI = {"1.7": ("io.containerd.grpc.v1.cri",), "2.1": ("io.containerd.cri.v1.runtime",)}

USER_V2 = """\
# Site containerd config -- managed by hand, keep the comments.
version = 2
root = "/var/lib/containerd"   # default root

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example/pause:3.9"  # our mirror
  # CDI stays off until the GPU team says so
  enable_cdi = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true

    # gVisor for untrusted pods
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gvisor]
      runtime_type = "io.containerd.runsc.v1"

[plugins."io.containerd.nri.v1.nri"]
  disable = true  # not yet
"""

USER_V3 = """\
# Site containerd 2 config
version = 3

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "registry.example/pause:3.10"  # our mirror

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = false  # off for now
  cdi_spec_dirs = ["/opt/cdi"]

  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = true

  # gVisor for untrusted pods
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.gvisor]
    runtime_type = "io.containerd.runsc.v1"

[plugins."io.containerd.nri.v1.nri"]
  disable = true  # not yet
"""


def listing(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for directories)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def settle(config: Path, **kw: Any) -> cc.Plan:
    """Install, then check that planning again changes nothing."""
    result = cc.install(config, **kw)
    again = cc.plan(config, **kw)
    assert not again.changed, again.diff()
    return result


def loads(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def dig(data: Any, *key: str) -> Any:
    for part in key:
        data = data[part]
    return data


# --------------------------------------------------------------------------- unit tests


def test_missing_config_is_created_then_removed(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "containerd" / "config.toml"
    result = settle(config, runtime=RUNC, search_path="")
    assert result.placement == "in-place" and result.config_version == 2
    assert any("version unknown" in n for n in result.notes)
    data = loads(config)
    cri = data["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert cri["containerd"]["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": RUNC},
    }
    assert cri["containerd"]["runtimes"]["runc"] == {"runtime_type": "io.containerd.runc.v2"}  # 1.7 would drop it
    assert data["plugins"][NRI] == {"disable": False}
    cc.remove(config)
    assert listing(tmp_path) == {}


@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_missing_config_on_known_version(tmp_path: Path, version: str) -> None:
    config = tmp_path / "config.toml"
    result = settle(config, containerd_version=version, runtime=RUNC)
    assert result.config_version == (2 if version == "1.7" else 3)
    assert (tmp_path / "conf.d" / "99-mokka.toml").exists() == (version == "2.1")
    cc.remove(config)
    assert listing(tmp_path) == {}


def test_in_place_keeps_comments_and_order(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V2)
    result = settle(config, containerd_version="1.7", runtime=RUNC)
    assert result.placement == "in-place"
    text = config.read_text()
    kept = [ln for ln in USER_V2.splitlines() if ln.strip().startswith("#") or "[" in ln]
    positions = [text.splitlines().index(ln) for ln in kept]
    assert positions == sorted(positions), "comments and tables keep their order"
    assert 'sandbox_image = "registry.example/pause:3.9"  # our mirror' in text
    assert "disable = false  # not yet" in text
    cri = loads(config)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"BinaryName": RUNC, "SystemdCgroup": True}  # copied from runc
    assert set(cri["containerd"]["runtimes"]) == {"runc", "gvisor", "nvidia"}


def test_drop_in_for_containerd_2(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V3)
    result = cc.plan(config, containerd_version="2.1", runtime=RUNC)
    diff = result.diff()
    main_lines = [ln for ln in diff.split(f"+++ {config}\n", 1)[1].splitlines() if ln[:1] in "+-"]
    assert main_lines == ['+imports = ["conf.d/99-mokka.toml"]'], diff
    assert any("sets plugins" in n and "disable = True" in n for n in result.notes)
    cc.apply(result)
    dropin = loads(tmp_path / "conf.d" / "99-mokka.toml")
    cri = dropin["plugins"]["io.containerd.cri.v1.runtime"]
    assert dropin["version"] == 3 and cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == ["/opt/cdi", "/etc/cdi", "/var/run/cdi"]  # the user's dir kept
    assert cri["containerd"]["runtimes"]["nvidia"]["options"] == {"BinaryName": RUNC, "SystemdCgroup": True}
    assert config.read_text() == USER_V3.replace("version = 3\n", 'version = 3\nimports = ["conf.d/99-mokka.toml"]\n')
    assert not cc.plan(config, containerd_version="2.1", runtime=RUNC).changed


def test_existing_imports_and_glob(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 3\nimports = ["/nonexistent/*.toml"]  # site\n')
    settle(config, containerd_version="2.1", runtime=RUNC)
    assert loads(config)["imports"] == ["/nonexistent/*.toml", "conf.d/99-mokka.toml"]
    assert "# site" in config.read_text()
    cc.remove(config)
    covered = tmp_path / "b" / "config.toml"
    covered.parent.mkdir()
    covered.write_text('version = 3\nimports = ["conf.d/*.toml"]\n')
    settle(covered, containerd_version="2.1", runtime=RUNC)
    assert covered.read_text() == 'version = 3\nimports = ["conf.d/*.toml"]\n'
    assert (covered.parent / "conf.d" / "99-mokka.toml").exists()


def test_remove_restores_exact_bytes_mode_and_dirs(tmp_path: Path) -> None:
    odd = b'version=2\r\n\t# tabbed comment   \r\n[plugins."io.containerd.nri.v1.nri"]\r\n\tdisable=true'
    for version in ("1.7", "2.1"):
        root = tmp_path / version
        root.mkdir()
        config = root / "config.toml"
        config.write_bytes(odd)
        config.chmod(0o640)
        before = listing(root)
        settle(config, containerd_version=version, runtime=RUNC)
        assert stat.S_IMODE(config.stat().st_mode) == 0o640
        assert stat.S_IMODE(cc.journal_path(config).stat().st_mode) == 0o600
        cc.remove(config)
        assert listing(root) == before
        assert stat.S_IMODE(config.stat().st_mode) == 0o640


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V3)
    before = listing(tmp_path)
    result = cc.plan(config, containerd_version="2.1", runtime=RUNC)
    diff = result.diff()
    assert f"--- /dev/null\n+++ {tmp_path}/conf.d/99-mokka.toml" in diff
    assert '+  BinaryName = "/usr/sbin/runc"' in diff
    assert cc.JOURNAL_SUFFIX not in diff  # the journal is named in the notes, not diffed
    assert any(cc.JOURNAL_SUFFIX in n for n in result.notes)
    assert listing(tmp_path) == before
    cc.plan_remove(config)
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('version = 2\n\n[plugins."io.containerd.grpc.v1.cri"\nenable_cdi = true\n', ":3:"),
        ("version = 2\nroot = \n", ":2:"),
        ("version = 2\nroot = 1\nroot = 2\n", ":3:"),
    ],
)
def test_malformed_toml_names_file_and_line(tmp_path: Path, text: str, where: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    before = listing(tmp_path)
    with pytest.raises(cc.ConfigError, match="malformed TOML") as err:
        cc.install(config, containerd_version="1.7", runtime=RUNC)
    assert f"{config}{where}" in str(err.value)
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('root = "/var/lib/containerd"\n', "config version 1"),
        ("version = 4\n", "versions 2 and 3"),
        ('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = "yes"\n', "enable_cdi is 'yes'"),
        ('version = 2\nplugins = "none"\n', "plugins is a string, not a table"),
        ('version = 2\nimports = "conf.d"\n', "'imports' must be an array"),
        ("version = 3\n", "needs containerd 2.x"),
    ],
)
def test_bad_config_is_refused(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    before = listing(tmp_path)
    with pytest.raises(cc.ConfigError, match=message) as err:
        cc.install(config, containerd_version="1.7", runtime=RUNC)
    assert str(config) in str(err.value)
    assert listing(tmp_path) == before


def test_malformed_import_is_named(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 3\nimports = ["site/*.toml"]\n')
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "a.toml").write_text("version = 3\n[broken\n")
    before = listing(tmp_path)
    with pytest.raises(cc.ConfigError, match=rf"{tmp_path}/site/a.toml:2:"):
        cc.install(config, containerd_version="2.1", runtime=RUNC)
    assert listing(tmp_path) == before


def test_later_import_that_overrides_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 3\nimports = ["conf.d/*.toml"]\n')
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "zz-site.toml").write_text(f'version = 3\n[plugins."{NRI}"]\ndisable = true\n')
    before = listing(tmp_path)
    with pytest.raises(cc.ConfigError, match=r"zz-site.toml sets it to True") as err:
        cc.install(config, containerd_version="2.1", runtime=RUNC)
    assert f'"{NRI}".disable would not be False' in str(err.value)
    assert listing(tmp_path) == before


def test_17_edits_the_import_that_owns_the_plugin_table(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        'version = 2\nimports = ["cri.toml"]\n[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "x"\n'
    )
    (tmp_path / "cri.toml").write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nsandbox_image = "y"\n')
    result = settle(config, containerd_version="1.7", runtime=RUNC)
    assert {c.path.name for c in result.changes} == {"cri.toml", "config.toml"}
    assert loads(tmp_path / "cri.toml")["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] is True
    assert "enable_cdi" not in loads(config)["plugins"]["io.containerd.grpc.v1.cri"]
    assert loads(config)["plugins"][NRI] == {"disable": False}


def test_runtime_detection(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("runc", "nvidia-container-runtime"):
        (bindir / name).write_text("#!/bin/sh\nexit 0\n")
        (bindir / name).chmod(0o755)
    config = tmp_path / "config.toml"
    result = cc.plan(config, containerd_version="2.1", search_path=str(bindir))
    assert result.runtime == str(bindir / "nvidia-container-runtime")
    (bindir / "nvidia-container-runtime").unlink()
    result = cc.plan(config, containerd_version="2.1", search_path=str(bindir))
    assert result.runtime == str(bindir / "runc")
    assert any("nvidia-container-runtime not found" in n for n in result.notes)
    config.write_text(USER_V2.replace("SystemdCgroup = true", 'SystemdCgroup = true\n        BinaryName = "/opt/runc"'))
    assert cc.plan(config, containerd_version="1.7", search_path=str(bindir)).runtime == "/opt/runc"


def test_runtime_switch_then_remove(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V2)
    cc.install(config, containerd_version="1.7", runtime=RUNC)
    settle(config, containerd_version="1.7", runtime="/usr/bin/nvidia-container-runtime")
    assert "nvidia-container-runtime" in config.read_text()
    cc.remove(config)
    assert config.read_text() == USER_V2


def test_remove_keeps_later_user_edits(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V2)
    cc.install(config, containerd_version="1.7", runtime=RUNC)
    doc = tomlkit.parse(config.read_text())
    doc["plugins"]["io.containerd.grpc.v1.cri"]["max_concurrent_downloads"] = 7  # the admin's own change
    config.write_text(tomlkit.dumps(doc))
    result = cc.remove(config)
    assert any("undoing only Mokka's keys" in n for n in result.notes)
    cri = loads(config)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["max_concurrent_downloads"] == 7
    assert cri["enable_cdi"] is False and "nvidia" not in cri["containerd"]["runtimes"]
    assert loads(config)["plugins"][NRI]["disable"] is True
    assert "# gVisor for untrusted pods" in config.read_text()
    assert not cc.journal_path(config).exists()


def test_remove_keeps_user_edits_on_drop_in_setup(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V3)
    cc.install(config, containerd_version="2.1", runtime=RUNC)
    config.write_text(config.read_text() + '\n[plugins."io.containerd.grpc.v1.cri"]\n  stream_server_port = "10010"\n')
    dropin = tmp_path / "conf.d" / "99-mokka.toml"
    dropin.write_text(dropin.read_text() + "# admin note\n")
    result = cc.remove(config)
    assert config.read_text() == USER_V3 + '\n[plugins."io.containerd.grpc.v1.cri"]\n  stream_server_port = "10010"\n'
    saved = tmp_path / "conf.d" / "99-mokka.toml.mokka-saved"
    assert saved.read_text().endswith("# admin note\n") and not dropin.exists()
    assert any(str(saved) in n for n in result.notes)


def test_reinstall_after_user_edit_then_remove(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V2)
    cc.install(config, containerd_version="1.7", runtime=RUNC)
    config.write_text(config.read_text().replace('"registry.example/pause:3.9"', '"registry.example/pause:3.10"'))
    cc.install(config, containerd_version="1.7", runtime="/usr/bin/nvidia-container-runtime")
    cc.remove(config)
    assert config.read_text() == USER_V2.replace("pause:3.9", "pause:3.10")


def test_stale_plan_and_failed_write_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(USER_V3)
    result = cc.plan(config, containerd_version="2.1", runtime=RUNC)
    config.write_text(USER_V3 + "# edited meanwhile\n")
    before = listing(tmp_path)
    with pytest.raises(cc.ConfigError, match="changed since the plan"):
        cc.apply(result)
    assert listing(tmp_path) == before
    result = cc.plan(config, containerd_version="2.1", runtime=RUNC)
    real_write, calls = atomic.write, []

    def failing(path: Path, *args: Any, **kw: Any) -> None:
        calls.append(path)  # the journal, the drop-in, then the main config
        if len(calls) == 3:
            raise PermissionError(13, "Permission denied", str(path))
        real_write(path, *args, **kw)

    monkeypatch.setattr(atomic, "write", failing)
    with pytest.raises(cc.ConfigError, match=rf"{config}: cannot write: Permission denied; nothing was changed"):
        cc.apply(result)
    monkeypatch.undo()
    assert listing(tmp_path) == before


def test_symlinked_config_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.toml"
    real.write_text(USER_V2)
    config = tmp_path / "config.toml"
    config.symlink_to(real)
    settle(config, containerd_version="1.7", runtime=RUNC)
    assert config.is_symlink() and "nvidia" in real.read_text()
    cc.remove(config)
    assert config.is_symlink() and real.read_text() == USER_V2


def test_remove_without_journal(tmp_path: Path) -> None:
    result = cc.remove(tmp_path / "config.toml")
    assert not result.changed and "has not changed" in result.summary()


def test_containerd_major() -> None:
    assert cc.containerd_major("1.7") == 1
    assert cc.containerd_major("v2.1.9") == 2
    assert cc.containerd_major("1.7.24~ds1") == 1


def test_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(cc_systemd, "SYSTEMD_RUN_DIR", tmp_path / "absent")
    assert "restart it yourself" in cc.restart(Path("/etc/containerd/config.toml"), run=run)
    assert calls == []
    monkeypatch.setattr(cc_systemd, "SYSTEMD_RUN_DIR", tmp_path)
    assert cc.restart(Path("/etc/containerd/config.toml"), run=run) == "restarted containerd.service"
    assert calls == [
        ["systemctl", "is-active", "--quiet", "containerd.service"],
        ["systemctl", "restart", "containerd.service"],
    ]


# --------------------------------------------------------------------------- the real containerd


@pytest.fixture(scope="session")
def containerd_bins() -> dict[str, Path]:
    """``containerd`` of 1.7 and 2.1, from Debian (cached)."""
    try:
        return {v: containerd_dist.fetch(v) / "containerd" for v in containerd_dist.SUITES}
    except Exception as exc:
        pytest.fail(f"cannot get Debian's containerd: {exc}")


@pytest.fixture(scope="session")
def runc_bin() -> Path:
    try:
        return containerd_dist.runc()
    except Exception as exc:
        pytest.fail(f"cannot get Debian's runc: {exc}")


def dump(binary: Path, config: Path) -> dict[str, Any]:
    res = subprocess.run([str(binary), "--config", str(config), "config", "dump"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return tomllib.loads(res.stdout)


def default_config(binary: Path) -> str:
    res = subprocess.run([str(binary), "config", "default"], capture_output=True, text=True, check=True)
    return res.stdout


def assert_mokka(data: dict[str, Any], version: str, binary_name: str) -> dict[str, Any]:
    """NRI on, CDI on with the spec dirs, the nvidia handler, the default runc kept; return the CRI table."""
    assert data["plugins"][NRI]["disable"] is False
    cri = dig(data["plugins"], *CRI[version])
    assert cri["enable_cdi"] is True
    assert {"/etc/cdi", "/var/run/cdi"} <= set(cri["cdi_spec_dirs"])
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == binary_name
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    return dict(cri)


@pytest.mark.consumers
@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_real_default_config(tmp_path: Path, containerd_bins: dict[str, Path], runc_bin: Path, version: str) -> None:
    binary = containerd_bins[version]
    config = tmp_path / "config.toml"
    config.write_text(default_config(binary))
    original = config.read_bytes()
    before = dump(binary, config)
    assert before["plugins"][NRI]["disable"] is (version == "1.7")
    result = settle(config, containerd=binary, runtime=str(runc_bin))
    assert result.placement == ("in-place" if version == "1.7" else "drop-in")
    assert_mokka(dump(binary, config), version, str(runc_bin))
    cc.remove(config)
    assert config.read_bytes() == original and listing(tmp_path) == {"config.toml": original}


@pytest.mark.consumers
@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_real_user_config(tmp_path: Path, containerd_bins: dict[str, Path], runc_bin: Path, version: str) -> None:
    binary = containerd_bins[version]
    config = tmp_path / "config.toml"
    config.write_text(USER_V2 if version == "1.7" else USER_V3)
    settle(config, containerd=binary, runtime=str(runc_bin))
    data = dump(binary, config)
    cri = assert_mokka(data, version, str(runc_bin))
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["gvisor"]["runtime_type"] == "io.containerd.runsc.v1"
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    if version == "1.7":
        assert cri["sandbox_image"] == "registry.example/pause:3.9"
    else:
        assert data["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].endswith("pause:3.10")
        assert cri["cdi_spec_dirs"] == ["/opt/cdi", "/etc/cdi", "/var/run/cdi"]
    cc.remove(config)
    assert config.read_text() == (USER_V2 if version == "1.7" else USER_V3)


@pytest.mark.consumers
@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_real_missing_config_and_detected_runtime(
    tmp_path: Path, containerd_bins: dict[str, Path], version: str
) -> None:
    binary = containerd_bins[version]
    stub = tmp_path / "bin" / "nvidia-container-runtime"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    config = tmp_path / "etc" / "config.toml"
    settle(config, containerd=binary, search_path=str(stub.parent))
    assert_mokka(dump(binary, config), version, str(stub))
    cc.remove(config)
    assert listing(tmp_path / "etc") == {} or not (tmp_path / "etc").exists()


@pytest.mark.consumers
def test_real_17_import_owning_the_cri_table(tmp_path: Path, containerd_bins: dict[str, Path]) -> None:
    binary = containerd_bins["1.7"]
    config = tmp_path / "config.toml"
    config.write_text('version = 2\nimports = ["site.toml"]\n')
    site = '# site CRI settings\nversion = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "site/pause:1"\n'
    (tmp_path / "site.toml").write_text(site)
    settle(config, containerd=binary, runtime=RUNC)
    cri = assert_mokka(dump(binary, config), "1.7", RUNC)
    assert cri["sandbox_image"] == "site/pause:1"
    cc.remove(config)
    assert (tmp_path / "site.toml").read_text() == site


@pytest.mark.consumers
@pytest.mark.root
@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_real_containerd_starts_with_cri_and_nri(
    tmp_path: Path, containerd_bins: dict[str, Path], runc_bin: Path, version: str
) -> None:
    """containerd boots on the installed config, loads CRI with the nvidia handler, and serves NRI."""
    if os.geteuid() != 0:
        pytest.skip("starting containerd needs root")
    binary = containerd_bins[version]
    doc = tomlkit.parse(default_config(binary))
    doc["root"], doc["state"] = str(tmp_path / "root"), str(tmp_path / "state")
    doc["grpc"]["address"], doc["ttrpc"]["address"] = str(tmp_path / "c.sock"), str(tmp_path / "t.sock")
    doc["plugins"]["io.containerd.internal.v1.opt"]["path"] = str(tmp_path / "opt")
    doc["plugins"][NRI]["socket_path"] = str(tmp_path / "nri.sock")
    config = tmp_path / "config.toml"
    config.write_text(tomlkit.dumps(doc))
    cc.install(config, containerd=binary, runtime=str(runc_bin))
    log = tmp_path / "containerd.log"
    env = {**os.environ, "PATH": f"{binary.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    with log.open("w") as out:
        proc = subprocess.Popen([str(binary), "--config", str(config)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 20
        while "successfully booted" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        text = log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "successfully booted" in text, text[-3000:]
    assert "failed to load plugin" not in text, text[-3000:]
    assert (tmp_path / "nri.sock").exists() or "Registered namespace" in text
    flat = text.replace('\\"', '"')  # the CRI plugin logs its config at start: 1.7 as Go struct, 2.x as JSON
    assert "nvidia:{Type:io.containerd.runc.v2" in flat or '"nvidia":{"runtimeType":"io.containerd.runc.v2"' in flat


def cli(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path} if path is not None else None
    return subprocess.run([sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("abc", "containerd version 'abc': not a version like 1.7 or 2.1"),
        ("1.6", "containerd version 1.6: containerd before 1.7 has no NRI"),
        ("1.5.9", "containerd version 1.5.9: containerd before 1.7 has no NRI"),
        ("3.0", "containerd version 3.0: unknown to this Mokka"),
        ("./evil", "not a version like 1.7 or 2.1"),
    ],
)
def test_unknown_containerd_version_is_refused_never_run(tmp_path: Path, version: str, message: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "ran"
    for name in ("abc", "evil"):
        (bindir / name).write_text(f"#!/bin/sh\ntouch {marker}\necho containerd x 1.7.0\n")
        (bindir / name).chmod(0o755)
    (tmp_path / "evil").symlink_to(bindir / "evil")
    config = tmp_path / "config.toml"
    config.write_text(USER_V2)
    before = listing(tmp_path)
    res = cli(
        "containerd-config",
        "install",
        "--config",
        str(config),
        "--containerd-version",
        version,
        "--no-restart",
        path=f"{bindir}:/usr/bin:/bin",
    )
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("mokka: error: ") and message in res.stderr
    assert not marker.exists()
    assert listing(tmp_path) == before


@pytest.mark.parametrize(("version", "major"), [("1.7", 1), ("v1.7.24", 1), ("2.0", 2), ("2.2.1", 2), ("2.10", 2)])
def test_known_containerd_versions(version: str, major: int) -> None:
    assert cc.containerd_major(version) == major


def test_cli_install_twice_then_remove_twice(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V3)
    before = listing(tmp_path)
    args = ["--config", str(config), "--no-restart"]
    res = cli("containerd-config", "install", *args, "--containerd-version", "2.1", "--runtime", RUNC)
    assert res.returncode == 0 and "installed; undo with" in res.stdout, res.stderr
    res = cli("containerd-config", "install", *args, "--containerd-version", "2.1", "--runtime", RUNC)
    assert res.returncode == 0 and "already installed" in res.stdout, res.stderr
    res = cli("containerd-config", "remove", *args)
    assert res.returncode == 0 and "removed" in res.stdout, res.stderr
    assert listing(tmp_path) == before
    res = cli("containerd-config", "remove", *args)
    assert res.returncode == 0 and res.stdout == "nothing to remove\n", res.stderr


def test_an_older_mokkas_record_is_named(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(USER_V2)
    (tmp_path / "config.toml.mokka-backup").write_text('{"format": 1}\n')
    before = listing(tmp_path)
    for run in (lambda: cc.install(config, containerd_version="1.7", runtime=RUNC), lambda: cc.remove(config)):
        with pytest.raises(cc.ConfigError, match="installed by an older Mokka"):
            run()
    assert listing(tmp_path) == before
