"""Upstream Mokka's Go NRI plugin (NVIDIA's ``nvml-mock-nri``) beside Mokka's, for `mokka bench nri --peer`.

The user brings a directory holding the binary, plain or ``.xz`` (``../shared/thirdparty/nvml-mock-nri/``
is one), unpacked once into the cache (``fetch.thirdparty``). By
default it injects one rbind mount of its overlay directory and environment (``MOCK_NVML_CONFIG``,
``LD_PRELOAD`` of its shims, ...); a pod annotated ``nvml-mock.nvidia.com/devices=true`` also gets
the ``/dev/nvidia*`` nodes found under ``--device-host-path``: here the node's own (those Mokka's
plugin injects), copied from the staged root, so that both inject the same device nodes. It
subscribes to CreateContainer only. With ``--health-addr=`` it serves no probe: it is ready once a
container created gets its environment. It exits when containerd closes the connection.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from fetch import thirdparty
from gpumodel.edits import container_edits
from gpumodel.nodelayout import NodeLayout

__all__ = ["DEVICES_ANNOTATION", "INJECTED_ENV", "PROGRAM", "Peer", "PeerError", "binary", "stage_overlay"]

PROGRAM = "nvml-mock-nri"
DEVICES_ANNOTATION = "nvml-mock.nvidia.com/devices"  # its device opt-in (a pod annotation)
INJECTED_ENV = "MOCK_NVML_CONFIG"  # what it sets in every container it injects


class PeerError(RuntimeError):
    """The peer cannot be run (a missing binary, a peer that never injects)."""


def binary(directory: Path, cache: Path) -> Path:
    """The peer's executable from the user's ``directory`` (``nvml-mock-nri``, plain or ``.xz``)."""
    try:
        return thirdparty.unpacked(directory, [PROGRAM], cache / "nri-peer")[PROGRAM]
    except thirdparty.Missing as exc:
        raise PeerError(f"--peer {directory}: {exc}") from None


def stage_overlay(layout: NodeLayout, overlay: Path) -> Path:
    """The peer's overlay directory (empty: containers are created, never started) with the node's
    GPU device nodes under ``driver/dev``, as Mokka's plugin injects them; returns that folder."""
    dev = overlay / "driver" / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    for node in container_edits(layout, layout.gpus).device_nodes:
        target = dev / node.path.removeprefix("/dev/")
        target.parent.mkdir(parents=True, exist_ok=True)
        st = os.stat(node.host_path)
        if not target.exists():
            os.mknod(target, stat.S_IFCHR | 0o666, st.st_rdev)
    return dev


class Peer:
    """The peer as a child process on containerd's NRI socket."""

    def __init__(self, program: Path, nri_socket: Path, overlay: Path, log: IO[bytes]) -> None:
        self.proc = subprocess.Popen(
            [
                str(program),
                "--socket-path", str(nri_socket),
                "--health-addr=",
                "--overlay-host-path", str(overlay),
                "--device-host-path", str(overlay / "driver" / "dev"),
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_injecting(self, env_of_a_new_container: Callable[[], list[str]], timeout: float = 15) -> None:
        """Until a container created gets the peer's environment (it has registered)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PeerError(f"the peer exited (rc {self.proc.returncode}) before it injected anything")
            if any(e.startswith(f"{INJECTED_ENV}=") for e in env_of_a_new_container()):
                return
            time.sleep(0.05)
        raise PeerError(f"the peer injected nothing within {timeout:g} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
