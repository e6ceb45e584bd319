"""``python -m nri_mokka`` as a process: its supervisor, its command line, the units it prints.

The runtime is the fake of test_nri_stub (plain sockets, the same framing); containerd itself
runs these paths in test_e2e_nri.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_nri_stub import FakeRuntime, Session

from nri_mokka import service
from nri_mokka.supervisor import MAX_DELAY, QUICK_FAILURES, Supervisor

REPO = Path(__file__).resolve().parent.parent


def plugin(*args: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "nri_mokka", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        **kw,  # type: ignore[arg-type]
    )


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def wait_gone(proc: subprocess.Popen[bytes], timeout: float = 10) -> int:
    code = proc.wait(timeout)
    return code


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[FakeRuntime]:
    rt = FakeRuntime(tmp_path / "nri.sock")
    yield rt
    rt.stop()


def test_a_killed_or_stopped_plugin_is_replaced_at_once(runtime: FakeRuntime, tmp_path: Path) -> None:
    proc = plugin("--socket", str(runtime.path), "--root", str(tmp_path / "no-node"))
    try:
        first = runtime.next_session()
        first.configure()
        [child] = children(proc.pid)
        os.kill(child, signal.SIGKILL)
        t0 = time.monotonic()
        second = runtime.next_session()  # a new plugin process dials and registers
        second.configure()
        took = time.monotonic() - t0
        [replacement] = children(proc.pid)
        assert replacement != child and took < 5
        os.kill(replacement, signal.SIGSTOP)  # a stopped plugin would hold up containerd
        third = runtime.next_session()
        third.configure()
        [after] = children(proc.pid)
        assert after not in (child, replacement)
        assert not Path(f"/proc/{replacement}").exists() or "Z" in Path(f"/proc/{replacement}/stat").read_text()
        for s in (first, second, third):
            s.close()
    finally:
        proc.terminate()
        assert wait_gone(proc) == 0
    log = proc.stdout.read().decode() if proc.stdout else ""
    assert "killed by SIGKILL" in log and "stopped by SIGSTOP" in log, log


def marked(marker: str) -> dict[int, int]:
    """{pid: parent pid} of the live processes whose command line contains ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            found[int(entry.name)] = int(stat[1])
    return found


def test_prelaunched_supervisor_dials_after_a_crash_and_leaves_with_containerd(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    """Launched by containerd: the launched process leaves at once (containerd kills it when its
    connection closes), a detached supervisor serves the inherited connection, replaces a crashed
    plugin process by one that dials, and everything exits when containerd closes the connection."""
    ours, theirs = socket.socketpair()
    env = {"NRI_PLUGIN_SOCKET": "3", "NRI_PLUGIN_NAME": "mokka", "NRI_PLUGIN_IDX": "10"}
    fd = theirs.fileno()
    root = tmp_path / "prelaunched-root"
    log = tmp_path / "plugin.log"
    proc = plugin(
        "--socket",
        str(runtime.path),
        "--root",
        str(root),
        "--log-file",
        str(log),
        env=env,
        pass_fds=(3, fd),
        preexec_fn=lambda: os.dup2(fd, 3),
    )
    theirs.close()
    try:
        assert wait_gone(proc) == 0  # the launched process
        first = Session(ours)  # containerd's end of the inherited connection
        first.configure()
        family = marked(str(root))
        [supervisor] = [pid for pid, parent in family.items() if parent not in family]
        [child] = [pid for pid, parent in family.items() if parent == supervisor]
        os.kill(child, signal.SIGKILL)
        second = runtime.next_session()  # the replacement cannot inherit: it dials
        second.configure()
        second.close()  # containerd stops: the plugin exits, containerd will launch it afresh
        deadline = time.monotonic() + 10
        while marked(str(root)):
            assert time.monotonic() < deadline, "the detached supervisor did not exit"
            time.sleep(0.02)
    finally:
        for pid in marked(str(root)):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert "pre-connected socket fd 3" in text and "containerd closed its connection; exiting" in text, text


def test_supervisor_death_takes_the_plugin_along(runtime: FakeRuntime, tmp_path: Path) -> None:
    proc = plugin("--socket", str(runtime.path), "--root", str(tmp_path))
    session = runtime.next_session()
    session.configure()
    [child] = children(proc.pid)
    proc.kill()  # SIGKILL: no chance to forward anything
    proc.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]:
        assert time.monotonic() < deadline, "the plugin process outlived its supervisor"
        time.sleep(0.01)
    session.close()


def test_restart_delays_grow_only_for_plugins_that_never_registered() -> None:
    sup = Supervisor(service.Options(root="/nonexistent"))
    for n in range(1, 8):
        sup.child, sup.child_ready = 4242, False
        sup._exited(4242, 1 << 8)  # exit status 1
        delay = (sup.restart_at or 0) - time.monotonic()
        if n < QUICK_FAILURES:
            assert delay <= 0.01
        else:
            assert 0 < delay <= MAX_DELAY
    sup.child, sup.child_ready = 4242, True
    sup._exited(4242, signal.SIGKILL)  # killed after registering: back at once
    assert (sup.restart_at or 0) - time.monotonic() <= 0.01
    sup.child = 4242
    sup._exited(4242, 2 << 8)  # bad configuration: final
    assert (sup.stopping, sup.exit_code) == ("configuration error", 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--idx", "1"], "argument --idx: '1' is not two digits"),
        (["--name", "a/b"], "argument --name: 'a/b' is not a usable plugin name"),
        (["--mode", "some"], "argument --mode: invalid choice"),
        (["--allocator", "kubelet"], "argument --allocator: invalid choice"),
        (["--health-addr", "nonsense"], "argument --health-addr: 'nonsense' is not HOST:PORT"),
        (["--log-file", "/nonexistent/dir/log"], "--log-file /nonexistent/dir/log: No such file or directory"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    for argv in ([sys.executable, "-m", "nri_mokka", *args], [sys.executable, "-m", "mokka.cli", "nri-plugin", *args]):
        res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
        assert res.returncode == 2
        assert res.stderr.startswith("mokka: error: ") and message in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_units(tmp_path: Path) -> None:
    args = ["--root", "/srv/mokka", "--allocator", "external", "--exclude-namespace", "a b", "--idx", "20"]
    res = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "nri-plugin", "--print-systemd-unit", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    unit = res.stdout
    assert "Restart=always" in unit and "RestartSec=0" in unit and "StartLimitIntervalSec=0" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart={sys.executable} -m nri_mokka ")
    assert "--allocator external" in exec_start and "--exclude-namespace 'a b'" in exec_start
    assert "--idx 20" in exec_start and "--print" not in exec_start
    res = subprocess.run(
        [sys.executable, "-m", "nri_mokka", "--print-prelaunch-script", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    script = tmp_path / "20-mokka"
    script.write_text(res.stdout)
    assert res.stdout.startswith("#!/bin/sh\n") and f"exec {sys.executable} -m nri_mokka " in res.stdout
    syntax = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


def test_sigterm_at_any_moment_stops_everything(runtime: FakeRuntime, tmp_path: Path) -> None:
    """SIGTERM right after registration (the plugin process busy logging, the supervisor warming
    up) still stops both: a signal handler that raised was once swallowed by a logging call."""
    for delay in (0, 0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3):
        proc = plugin("--socket", str(runtime.path), "--root", str(tmp_path))
        session = runtime.next_session()
        session.configure()
        time.sleep(delay)
        family = [proc.pid, *children(proc.pid)]
        proc.terminate()
        try:
            assert proc.wait(20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        for pid in family:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
        session.close()
