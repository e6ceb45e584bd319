"""NVIDIA's device plugin v0.18.0 (the real binary, built from the Go module proxy) marks exactly
the faulted GPU unhealthy after `mokka fault xid 79 --gpu 3`, seen through its gRPC API
(ListAndWatch), as the kubelet sees it.

The plugin runs in a private mount namespace (its socket directory, /var/lib/kubelet/
device-plugins, is a directory of the test's there, also on a machine without /var/lib/kubelet;
the driver root's usr and dev are bind-mounted where its --driver-root points). The test plays
the kubelet's device manager: it answers the plugin's Registration and opens ListAndWatch on
the plugin's socket. v0.18.0 never marks a device healthy again while it runs ("there is no way
to recover from the Unhealthy state"), so after `clear` health comes back only with a restarted
plugin; and while a GPU is lost the plugin cannot start (its device discovery fails on the lost
GPU's handle, as on a real node).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpumodel import profile
from hostsetup import node as hostnode

pytestmark = [pytest.mark.root, pytest.mark.slow]

VERSION = "v0.18.0"
SOCKET = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock"


def plugin_binary() -> Path:
    """The cluster's build of the device plugin (built first when .ci/setup did not)."""
    from cluster_fixtures import ensure_binaries

    from fetch.kube import binaries, versions

    assert versions.DEVICE_PLUGIN == VERSION
    ensure_binaries()
    built = binaries.cached()
    assert built is not None
    return built.device_plugin / "nvidia-device-plugin"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    import deviceplugin_api

    return deviceplugin_api.generate(tmp_path_factory.mktemp("deviceplugin-api"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace and device nodes: needs root")
    root = tmp_path / "node"
    hostnode.apply(hostnode.plan(profile.load("h100").with_count(4), hostnode.Options(root=root)))
    yield root
    hostnode.cleanup(root)


class Plugin:
    """The device plugin in its own mount namespace (:mod:`containers.mounts`), registering at our kubelet
    socket: an empty directory of its own at /var/lib/kubelet (a fresh machine has none), the
    node's usr and dev where its --driver-root points."""

    count = 0

    def __init__(self, binary: Path, node: Path, kubelet_socket: Path, log: Path) -> None:
        Plugin.count += 1
        kubelet_dir = log.parent / f"kubelet-{Plugin.count}"
        (kubelet_dir / "device-plugins").mkdir(parents=True)
        driver_root = node.parent / "driver-root"
        for part in ("usr", "dev"):
            (driver_root / part).mkdir(parents=True, exist_ok=True)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH": str(driver_root / "usr" / "lib64")}
        binds = [(kubelet_dir, "/var/lib/kubelet"), (node / "driver" / "usr", driver_root / "usr")]
        binds.append((node / "dev", driver_root / "dev"))
        argv = [sys.executable, "-m", "containers.mounts", *(f"--bind={s}:{t}" for s, t in binds), "--"]
        argv += [str(binary), "--kubelet-socket", str(kubelet_socket), "--driver-root", str(driver_root)]
        argv += ["--dev-root", str(driver_root), "--device-list-strategy", "envvar", "--device-id-strategy", "uuid"]
        argv += ["--fail-on-init-error=true"]
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out)

    async def registered(self, queue: asyncio.Queue[str], timeout: float) -> str:
        """The plugin's registration; fails at once, with its log, when the plugin exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the device plugin exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(queue.get(), 0.5)
        pytest.fail(f"the device plugin did not register in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    @property
    def socket(self) -> str:
        return f"/proc/{self.proc.pid}/root{SOCKET}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


@asynccontextmanager
async def kubelet(api: ModuleType, socket: Path) -> AsyncIterator[asyncio.Queue[str]]:
    """The kubelet's Registration service: each plugin that registers is put on the queue."""
    from grpclib.server import Server

    registered: asyncio.Queue[str] = asyncio.Queue()

    class Registration(api.RegistrationBase):  # type: ignore[misc, name-defined]
        async def register(self, request: Any) -> Any:
            await registered.put(f"{request.resource_name} {request.endpoint}")
            return api.Empty()

    server = Server([Registration()])
    await server.start(path=str(socket))
    try:
        yield registered
    finally:
        server.close()
        await server.wait_closed()


async def health_stream(api: ModuleType, plugin: Plugin) -> AsyncIterator[dict[str, str]]:
    from grpclib.client import Channel

    channel = Channel(path=plugin.socket)
    try:
        async for response in api.DevicePluginStub(channel).list_and_watch(api.Empty()):
            yield {d.id: d.health for d in response.devices}
    finally:
        channel.close()


def fault(root: Path, *args: str) -> None:
    argv = [sys.executable, "-m", "mokka.cli", "fault", *args, "--root", str(root)]
    subprocess.run(argv, check=True, capture_output=True, text=True)


def test_xid_79_marks_exactly_that_gpu_unhealthy(api: ModuleType, node: Path, tmp_path: Path) -> None:
    binary = plugin_binary()
    uuids = [d.uuid for d in profile.load("h100").with_count(4).devices()]
    log = tmp_path / "plugin.log"

    async def scenario() -> None:
        async with kubelet(api, tmp_path / "kubelet.sock") as registered:
            plugin = Plugin(binary, node, tmp_path / "kubelet.sock", log)
            try:
                assert await plugin.registered(registered, 120) == "nvidia.com/gpu nvidia-gpu.sock"
                stream = health_stream(api, plugin)
                assert await asyncio.wait_for(anext(stream), 60) == dict.fromkeys(uuids, "Healthy")
                fault(node, "xid", "13", "--gpu", "2")  # an application Xid: the plugin ignores it
                fault(node, "xid", "79", "--gpu", "3")
                after = await asyncio.wait_for(anext(stream), 120)
                assert after == {**dict.fromkeys(uuids[:3], "Healthy"), uuids[3]: "Unhealthy"}, log.read_text()
                await stream.aclose()
            finally:
                plugin.stop()

            # While GPU 3 is lost a fresh plugin cannot even list the GPUs (v0.18.0 exits).
            lost = Plugin(binary, node, tmp_path / "kubelet.sock", log)
            assert lost.proc.wait(timeout=120) != 0
            assert "error getting device handle for index '3'" in log.read_text()

            # `clear`, then a restarted plugin: all four healthy again.
            fault(node, "clear", "--gpu", "3")
            again = Plugin(binary, node, tmp_path / "kubelet.sock", log)
            try:
                await again.registered(registered, 120)
                stream = health_stream(api, again)
                assert await asyncio.wait_for(anext(stream), 60) == dict.fromkeys(uuids, "Healthy")
                await stream.aclose()
            finally:
                again.stop()

    asyncio.run(scenario())
    assert "XidCriticalError: Xid=79 on Device=" + uuids[3] in log.read_text()
    skipped = [line for line in log.read_text().splitlines() if "Skipping event" in line]
    assert len(skipped) == 1 and "EventData:13 " in skipped[0]
