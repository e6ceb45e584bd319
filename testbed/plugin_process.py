"""`mokka nri-plugin` as a child process, watched through its health endpoint.

Used by `mokka demo`, `mokka bench nri` and the end-to-end tests: start it against a
containerd's NRI socket, wait until it has registered (again, after a restart), stop it.
"""

from __future__ import annotations

import json
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


class PluginProcess:
    def __init__(
        self, nri_socket: Path, root: Path, log: IO[bytes] | int = subprocess.DEVNULL, args: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mokka.cli",
                "nri-plugin",
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
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, path: str = "/healthz") -> tuple[int, dict[str, object]]:
        """HTTP status and body of a health endpoint; (0, {}) while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1) as res:
                return res.status, dict(json.loads(res.read()))
        except urllib.error.HTTPError as exc:
            return exc.code, dict(json.loads(exc.read() or b"{}"))
        except (OSError, ValueError):
            return 0, {}

    def registrations(self) -> int:
        value = self.status()[1].get("registrations", 0)
        return value if isinstance(value, int) else 0

    def wait_registered(self, registrations: int = 1, timeout: float = 15) -> float:
        """Seconds until the plugin has registered ``registrations`` times in all."""
        start = time.monotonic()
        while self.registrations() < registrations:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mokka nri-plugin exited with {self.proc.returncode}")
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"mokka nri-plugin did not register within {timeout:g} s")
            time.sleep(0.005)
        return time.monotonic() - start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
