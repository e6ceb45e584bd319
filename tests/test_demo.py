"""`mokka demo` itself: both containerd versions, Ctrl-C midway, and its refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from containers import cleanup
from gpumodel import profile
from mokka import demo

pytestmark = [pytest.mark.consumers, pytest.mark.slow, pytest.mark.root]
BASE = demo.DEFAULT_BASE


@pytest.fixture(autouse=True)
def _root_and_clean() -> None:
    if os.geteuid() != 0:
        pytest.skip("mokka demo needs root")
    assert not BASE.exists(), f"{BASE} exists before the test"
    yield
    assert_nothing_left()


def assert_nothing_left() -> None:
    assert not BASE.exists()
    assert cleanup.leftovers(BASE / "sb") == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(BASE) not in mounts
    live = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(BASE) in argv:
            live.append(argv.replace("\0", " "))
    assert not live


def mokka(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mokka.cli", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C reaches it even when this suite runs where SIGINT is ignored (a background job
        # of a non-interactive shell): Python installs its handler only where SIGINT is not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("version", ["1.7", "2.1"])
def test_demo_prints_the_gpu_table(version: str) -> None:
    proc = mokka("--containerd", version)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    devices = profile.load("h100").devices()
    rows = [ln for ln in out.splitlines() if "NVIDIA H100 80GB HBM3" in ln]
    assert len(rows) == 8, out
    for d, row in zip(devices, rows, strict=True):
        assert row.split()[1] == str(d.index) and d.bus_id in row
    assert "81559MiB" in out and "No running processes found" in out
    assert "What the plugin injected" in out and "/dev/nvidia7" in out
    assert "[7/7] teardown: ok" in err


def test_interrupt_midway_tears_everything_down() -> None:
    proc = mokka("--containerd", "2.1")
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + 120
    # Step 4 done: containerd is up and the plugin is starting.
    while not any(ln.startswith("[4/7] ") and ": ok" in ln for ln in seen.splitlines()) and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert "[4/7]" in seen, seen
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    assert "torn down" in err


def test_refuses_when_the_directory_is_in_use() -> None:
    BASE.mkdir(parents=True)
    (BASE / "something").write_text("x")
    try:
        proc = mokka()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1 and "mokka demo --stop" in err
        assert (BASE / "something").exists()  # nothing of the user's touched
    finally:
        (BASE / "something").unlink()
        BASE.rmdir()


def test_refuses_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo.os, "geteuid", lambda: 1000)
    with pytest.raises(demo.DemoError, match="needs root"):
        demo.run(demo.Options())
    assert not BASE.exists()


def test_keep_then_stop() -> None:
    """--keep leaves it running; --stop as another user refuses and changes nothing; as root it removes all.
    The GPU count defaults to the profile's: a100 has eight (an HGX A100)."""
    proc = mokka("--containerd", "2.1", "--profile", "a100", "--keep")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert len([ln for ln in out.splitlines() if "NVIDIA A100" in ln]) == 8, out
    assert "8x NVIDIA A100" in err
    assert "kept running" in err and (BASE / "sb" / "containerd.sock").exists()
    before = sorted(str(p) for p in BASE.rglob("*"))
    nobody = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "mokka.cli",
            "demo",
            "--stop",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobody.returncode == 1, nobody.stderr
    assert nobody.stderr.startswith("mokka: error: ") and "needs root" in nobody.stderr
    assert len(nobody.stderr.splitlines()) == 1 and "Traceback" not in nobody.stderr
    assert sorted(str(p) for p in BASE.rglob("*")) == before
    stop = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "demo", "--stop"], capture_output=True, text=True, timeout=120
    )
    assert stop.returncode == 0 and "nothing left behind" in stop.stdout, stop.stderr


def first_run(env: dict[str, str], *prefix: str) -> subprocess.CompletedProcess[str]:
    argv = [*prefix, sys.executable, "-m", "mokka.cli", "demo", "--containerd", "2.1"]
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)


def error_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in res.stderr, res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("mokka: error:")]


def test_a_first_run_without_network_says_so(tmp_path: Path) -> None:
    res = first_run({"MOKKA_CACHE": str(tmp_path / "cache")}, "unshare", "--net")
    assert res.returncode == 1
    (line,) = error_lines(res)
    assert line.startswith("mokka: error: cannot get containerd 2.1 from Debian's archive (")
    assert f"the first run downloads it into {tmp_path / 'cache'}" in line


def test_a_read_only_cache_says_so(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    script = f'mount -t tmpfs -o ro none {cache} && exec "$@"'
    res = first_run(
        {"MOKKA_CACHE": str(cache)}, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "-"
    )
    assert res.returncode == 1
    assert error_lines(res) == [
        f"mokka: error: cannot get containerd 2.1: the cache {cache} is not writable (Read-only file system): "
        "set MOKKA_CACHE to a writable directory"
    ]
