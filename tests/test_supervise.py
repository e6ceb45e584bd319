"""The node's service manager for containerd (:mod:`localcluster.supervise`): a program that exits
is started again (NVIDIA's toolkit operand restarts containerd with SIGHUP, on which it exits);
SIGTERM reaches the program and ends the supervision; one that keeps exiting is given up."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster import supervise


def start(program: str, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", supervise.__name__, "sh", "-c", program],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_program_that_exits_is_started_again_and_sigterm_ends_it(tmp_path: Path) -> None:
    # First run: note its start and exit on SIGHUP, as containerd 2.x does; later runs: wait for SIGTERM.
    program = (
        'echo x >> starts; if [ "$(wc -l < starts)" -eq 1 ]; then kill -HUP $$; fi; '
        "trap 'echo stopped > stopped; exit 0' TERM; touch up; while :; do sleep 0.1; done"
    )
    sup = start(program, tmp_path)
    try:
        wait_for(tmp_path / "up")
        assert (tmp_path / "starts").read_text().count("x") == 2
        sup.send_signal(signal.SIGTERM)
        out, _ = sup.communicate(timeout=20)
    finally:
        sup.kill()
    assert sup.returncode == 0, out
    assert (tmp_path / "stopped").read_text() == "stopped\n"  # the program got the SIGTERM
    assert "exited with status -1; starting it again" in out, out


def test_a_program_that_keeps_exiting_is_given_up(tmp_path: Path) -> None:
    sup = start("echo x >> starts; exit 3", tmp_path)
    out, _ = sup.communicate(timeout=60)
    assert sup.returncode == 3, out
    assert (tmp_path / "starts").read_text().count("x") == supervise.BURST
    assert f"exited {supervise.BURST} times within" in out, out


def test_without_a_program_it_says_how_to_call_it() -> None:
    res = subprocess.run([sys.executable, "-m", supervise.__name__], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and res.stderr.startswith("usage: python -m localcluster.supervise"), res.stderr
