"""The NRI plugin (``python -m nri_mokka``) as a child process, watched through its health endpoint.

Used by `mokka demo`, `mokka bench nri` and the end-to-end tests: start it against a
containerd's NRI socket, wait until it has registered (again, after a restart), stop it.
By default it runs under its own supervisor: ``pid`` is the supervisor's, ``plugin_pid()``
the process serving NRI right now.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plugin_command(python: str | None = None) -> list[str]:
    """How to start the plugin: ``python -m nri_mokka`` with ``python`` (default: this one)."""
    return [python or sys.executable, "-m", "nri_mokka"]


class PluginProcess:
    def __init__(
        self,
        nri_socket: Path,
        root: Path,
        log: IO[bytes] | int = subprocess.DEVNULL,
        args: tuple[str, ...] = (),
        command: list[str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """``command``: another plugin command line (e.g. an earlier implementation's, run in its
        checkout ``cwd``) taking the same --socket, --root and --health-addr options."""
        self.port = free_port()
        self.spawned_at = time.monotonic()
        self.proc = subprocess.Popen(
            [
                *(command or plugin_command()),
                "--socket",
                str(nri_socket),
                "--root",
                str(root),
                "--health-addr",
                f"127.0.0.1:{self.port}",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, path: str = "/healthz", timeout: float = 1) -> tuple[int, dict[str, object]]:
        """HTTP status and body of a health endpoint; (0, {}) while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as res:
                return res.status, dict(json.loads(res.read()))
        except urllib.error.HTTPError as exc:
            return exc.code, dict(json.loads(exc.read() or b"{}"))
        except (OSError, ValueError):
            return 0, {}

    def number(self, key: str, default: float = 0) -> float:
        value = self.status()[1].get(key, default)
        return float(value) if isinstance(value, int | float) else default

    def registrations(self) -> int:
        return int(self.number("registrations"))

    def plugin_pid(self) -> int:
        """The process serving NRI (under the supervisor: its current child)."""
        return int(self.number("pid"))

    def wait_registered(self, registrations: int = 1, timeout: float = 15) -> float:
        """Seconds until the plugin has registered ``registrations`` times in all."""
        start = time.monotonic()
        while self.registrations() < registrations:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the NRI plugin exited with {self.proc.returncode}")
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the NRI plugin did not register within {timeout:g} s")
            time.sleep(0.005)
        return time.monotonic() - start

    def wait_ready_after(self, moment: float, timeout: float = 15) -> dict[str, object]:
        """The health body once a plugin process has completed a registration after ``moment``
        (``time.monotonic()``), whichever process it is."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.status()[1]
            ready_at = body.get("ready_at", 0)
            if isinstance(ready_at, int | float) and ready_at > moment and body.get("registered"):
                return body
            if self.proc.poll() is not None:
                raise RuntimeError(f"the NRI plugin exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the NRI plugin did not register again within {timeout:g} s")
            time.sleep(0.002)

    def signal_plugin(self, signum: int) -> int:
        """Send ``signum`` to the process serving NRI; returns its pid."""
        pid = self.plugin_pid()
        if pid:
            os.kill(pid, signum)
        return pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
