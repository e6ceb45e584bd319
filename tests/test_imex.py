"""The node's IMEX surface and the mock IMEX tools (native/imex/), always tested: NVIDIA's DRA
driver and its ComputeDomain daemons read these where a real node has them.

The daemons here are real processes talking real TCP, each on its own loopback address
(127.0.0.2, .3, .4: local addresses, so each daemon takes the first listed one it can bind)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumodel import mig, nodelayout, profile
from gpumodel.native import library_path
from hostsetup import majors, node

IMEX = library_path("nvidia-imex")
CTL = library_path("nvidia-imex-ctl")


def test_host_setup_stages_the_imex_surface(tmp_path: Path) -> None:
    root = tmp_path / "root"
    node.apply(node.plan(profile.load("h100"), node.Options(root=root, majors="safe")))
    layout = nodelayout.NodeLayout.load(root)
    assert (layout.imex_major, layout.imex_caps_major) == (majors.SAFE_IMEX_MAJOR, majors.SAFE_CAPS_MAJOR)
    # /proc/devices as NVIDIA's DRA driver parses it: both majors among the character devices
    assert layout.proc_devices == str(root / "proc" / "devices")
    text = Path(layout.proc_devices).read_text()
    chars, _, block = text.partition("\nBlock devices:\n")
    assert chars.startswith("Character devices:\n") and block
    assert f"\n{layout.imex_major} nvidia-caps-imex-channels\n" in chars + "\n"
    assert f"\n{layout.imex_caps_major} nvidia-caps\n" in chars + "\n"
    assert f"\n{layout.uvm_major} nvidia-uvm\n" in chars and "\n195 nvidiactl\n" not in chars  # safe numbers
    channel = (root / "dev/nvidia-caps-imex-channels/channel0").lstat()
    assert stat.S_ISCHR(channel.st_mode) and os.major(channel.st_rdev) == layout.imex_major
    assert os.minor(channel.st_rdev) == 0 and stat.S_IMODE(channel.st_mode) == 0o666
    cap = (root / f"dev/nvidia-caps/nvidia-cap{mig.FABRIC_IMEX_MINOR}").lstat()
    assert (os.major(cap.st_rdev), os.minor(cap.st_rdev)) == (layout.imex_caps_major, 4323)
    assert stat.S_IMODE(cap.st_mode) == 0o400
    mgmt = (root / "proc/driver/nvidia/capabilities/fabric-imex-mgmt").read_text()
    assert mgmt == "DeviceFileMinor: 4323\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    assert layout.imex_tools == str(root / "driver/usr/bin")
    for name in ("nvidia-imex", "nvidia-imex-ctl"):
        assert os.access(root / "driver/usr/bin" / name, os.X_OK)
    node.cleanup(root)
    assert not (root / "dev").exists() and not (root / "proc").exists()


def test_boards_without_a_fabric_get_no_imex_nodes(tmp_path: Path) -> None:
    """The driver registers the majors on every board (so /proc/devices names them); the channel
    and capability nodes are a fabric node's."""
    root = tmp_path / "root"
    node.apply(node.plan(profile.load("l40s"), node.Options(root=root, majors="safe")))
    assert not (root / "dev/nvidia-caps-imex-channels").exists() and not (root / "dev/nvidia-caps").exists()
    assert "nvidia-caps-imex-channels" in (root / "proc/devices").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Domain:
    """Mock IMEX daemons for the nodes of one node list, each with its own configuration."""

    def __init__(self, tmp: Path, addresses: list[str]) -> None:
        self.tmp, self.server_port = tmp, _free_port()
        self.nodes_file = tmp / "nodes.cfg"
        self.write_nodes(addresses)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.configs: dict[str, Path] = {}
        for address in addresses:
            cfg = tmp / f"{address}.cfg"
            cfg.write_text(
                "# as NVIDIA's template writes it\n"
                f"SERVER_PORT={self.server_port}\nIMEX_CMD_PORT={_free_port()}\nIMEX_CMD_ENABLED=1\n"
                f"IMEX_CMD_BIND_INTERFACE_IP=127.0.0.1\nIMEX_NODE_CONFIG_FILE={self.nodes_file}\n"
            )
            self.configs[address] = cfg

    def write_nodes(self, addresses: list[str]) -> None:
        self.nodes_file.write_text("".join(f"{a}\n" for a in addresses))

    def start(self, address: str) -> None:
        log = (self.tmp / f"{address}.log").open("ab")
        self.procs[address] = subprocess.Popen([str(IMEX), "-c", str(self.configs[address])], stdout=log, stderr=log)
        # each takes the first free listed address: wait until this one holds its own
        self.wait(lambda: f"is #{self.index(address)} {address}" in self.log(address), f"{address} listening")

    def index(self, address: str) -> int:
        return self.nodes_file.read_text().split().index(address)

    def log(self, address: str) -> str:
        return (self.tmp / f"{address}.log").read_text()

    def stop(self, address: str) -> None:
        proc = self.procs.pop(address)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0

    def ctl(self, address: str, flag: str) -> str:
        out = subprocess.run([str(CTL), "-c", str(self.configs[address]), flag], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def wait(self, check, what: str, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"{what} within {timeout} s"
            time.sleep(0.1)

    def close(self) -> None:
        for address in list(self.procs):
            self.stop(address)


@pytest.fixture
def domain(tmp_path: Path) -> Iterator[Domain]:
    d = Domain(tmp_path, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    yield d
    d.close()


def test_ready_only_when_every_node_is_connected(domain: Domain) -> None:
    domain.start("127.0.0.2")
    domain.start("127.0.0.3")
    time.sleep(1.5)
    assert domain.ctl("127.0.0.2", "-q") == "NOT_READY\n"  # .4 has no daemon yet
    domain.start("127.0.0.4")
    for address in domain.procs:
        domain.wait(lambda a=address: domain.ctl(a, "-q") == "READY\n", f"{address} READY")  # type: ignore[misc]
    table = domain.ctl("127.0.0.3", "-N")
    assert "Node #1 - 127.0.0.3 - 127.0.0.3 - READY (this node)" in table
    assert "Node #2 - 127.0.0.4 - 127.0.0.4 - READY\n" in table and table.endswith("Domain State: UP\n")


def test_a_lost_peer_is_reported_and_readiness_returns(domain: Domain) -> None:
    for address in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        domain.start(address)
    for address in domain.procs:
        domain.wait(lambda a=address: domain.ctl(a, "-q") == "READY\n", f"{address} READY")  # type: ignore[misc]
    domain.procs["127.0.0.3"].kill()  # no goodbye: the others notice the silence
    domain.procs.pop("127.0.0.3").wait()
    for address in ("127.0.0.2", "127.0.0.4"):
        domain.wait(lambda a=address: domain.ctl(a, "-q") == "NOT_READY\n", f"{address} NOT_READY", 6)  # type: ignore[misc]
    table = domain.ctl("127.0.0.4", "-N")
    assert "Node #1 - 127.0.0.3 - 127.0.0.3 - UNAVAILABLE (connection lost)" in table
    assert table.endswith("Domain State: DEGRADED\n")
    assert "node #1 127.0.0.3 (127.0.0.3) lost" in domain.log("127.0.0.2")
    domain.start("127.0.0.3")
    for address in domain.procs:
        domain.wait(lambda a=address: domain.ctl(a, "-q") == "READY\n", f"{address} READY again")  # type: ignore[misc]


def test_sigusr1_reads_the_node_list_again(tmp_path: Path) -> None:
    d = Domain(tmp_path, ["127.0.0.2"])
    try:
        d.start("127.0.0.2")
        d.wait(lambda: d.ctl("127.0.0.2", "-q") == "READY\n", "a domain of one READY")
        d.write_nodes(["127.0.0.2", "127.0.0.5"])  # a node joins, as the compute-domain daemon writes it
        d.procs["127.0.0.2"].send_signal(signal.SIGUSR1)
        d.wait(lambda: d.ctl("127.0.0.2", "-q") == "NOT_READY\n", "NOT_READY with a silent new node")
        assert "SIGUSR1: reading" in d.log("127.0.0.2")
        assert "Node #1 - 127.0.0.5 - 127.0.0.5 - UNAVAILABLE (never connected)" in d.ctl("127.0.0.2", "-N")
    finally:
        d.close()


def test_bad_input_gets_one_line(tmp_path: Path) -> None:
    out = subprocess.run([str(IMEX), "-c", str(tmp_path / "missing.cfg")], capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "missing.cfg" in out.stderr
    cfg = tmp_path / "c.cfg"
    cfg.write_text(f"IMEX_CMD_PORT={_free_port()}\n")
    out = subprocess.run([str(CTL), "-c", str(cfg), "-q"], capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "does not answer" in out.stderr
    out = subprocess.run([str(CTL), "-x"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "-x" in out.stderr
