"""The NRI plugin stub against a fake runtime built on the same transport (unit level).

The fake plays containerd's part: it listens on a unix socket (or hands a socketpair end
over as a pre-launched plugin's fd), serves ``Runtime.RegisterPlugin`` on mux conn 2 and
calls the plugin's service on conn 1. The real containerd is exercised elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nri_mokka.nri import mux, ttrpc
from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as api
from nri_mokka.nri.stub import PLUGIN_SERVICE, PluginError, Stub, event_mask

Scenario = Callable[[], Awaitable[None]]


def run(scenario: Scenario, timeout: float = 15) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout))


class _RuntimeService(api.RuntimeBase):
    def __init__(self, session: Session) -> None:
        self.session = session

    async def register_plugin(self, register_plugin_request: api.RegisterPluginRequest) -> api.Empty:
        if not self.session.registered.done():
            self.session.registered.set_result(register_plugin_request)
        return api.Empty()


class Session:
    """One plugin connection, seen from the runtime."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.mux = mux.Mux(reader, writer)
        self.frames = _RecordingDecoder()
        self.mux._decoder = self.frames
        self.registered: asyncio.Future[api.RegisterPluginRequest] = asyncio.get_running_loop().create_future()
        self.client = ttrpc.Client(self.mux.open(mux.PLUGIN_SERVICE_CONN))
        server = ttrpc.Server(self.mux.open(mux.RUNTIME_SERVICE_CONN), [_RuntimeService(self)])
        self.tasks = [asyncio.create_task(self.mux.run()), asyncio.create_task(server.serve())]

    async def call(self, method: str, request: Any, reply: type[Any]) -> Any:
        return await self.client.call(PLUGIN_SERVICE, method, request, reply, timeout=5)

    async def configure(self, config: str = "") -> api.ConfigureResponse:
        req = api.ConfigureRequest(config=config, runtime_name="fake-containerd", runtime_version="v1.7.24")
        response: api.ConfigureResponse = await self.call("Configure", req, api.ConfigureResponse)
        return response

    async def create(self, pod: api.PodSandbox, container: api.Container) -> api.CreateContainerResponse:
        req = api.CreateContainerRequest(pod=pod, container=container)
        response: api.CreateContainerResponse = await self.call("CreateContainer", req, api.CreateContainerResponse)
        return response

    async def close(self) -> None:
        await self.client.close()
        await self.mux.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class _RecordingDecoder(mux.FrameDecoder):
    """Records the payload size of every frame the plugin sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        frames = super().feed(data)
        self.sizes += [len(p) for _, p in frames]
        return frames


class FakeRuntime:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sessions: asyncio.Queue[Session] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._accept, str(self.path))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.sessions.put(Session(reader, writer))

    async def next_session(self) -> Session:
        session = await asyncio.wait_for(self.sessions.get(), 5)
        await asyncio.wait_for(session.registered, 5)
        return session

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.asynccontextmanager
async def running(stub: Stub) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(stub.run())
    try:
        yield task
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)


class Recorder:
    """A plugin that records what it is given and answers a fixed adjustment."""

    def __init__(self) -> None:
        self.configs: list[tuple[str, str, str]] = []
        self.synced: list[tuple[list[api.PodSandbox], list[api.Container]]] = []
        self.created: list[tuple[api.PodSandbox, api.Container]] = []
        self.started: list[str] = []
        self.shutdowns = 0
        self.fail: BaseException | None = None

    async def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        self.configs.append((config, runtime_name, runtime_version))

    async def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        self.synced.append((pods, containers))

    async def shutdown(self) -> None:
        self.shutdowns += 1

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        self.created.append((pod, container))
        if self.fail is not None:
            raise self.fail
        return api.ContainerAdjustment(
            annotations={"mokka.dev/gpus": "0,3"},
            env=[api.KeyValue(key="NVIDIA_VISIBLE_DEVICES", value="0,3")],
            mounts=[
                api.Mount(
                    destination="/usr/bin/nvidia-smi",
                    type="bind",
                    source="/var/lib/mokka/root/usr/bin/nvidia-smi",
                    options=["ro", "nosuid", "nodev", "bind"],
                )
            ],
            linux=api.LinuxContainerAdjustment(
                devices=[
                    api.LinuxDevice(
                        path="/dev/nvidia0", type="c", major=120, minor=0, file_mode=api.OptionalFileMode(value=0o666)
                    )
                ]
            ),
        )

    async def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.started.append(container.id)


POD = api.PodSandbox(id="pod1", name="trainer", namespace="ml", annotations={"a": "b"})
CONTAINER = api.Container(
    id="c1",
    pod_sandbox_id="pod1",
    name="main",
    env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
    annotations={"mokka.dev/gpus": "2"},
    linux=api.LinuxContainer(devices=[api.LinuxDevice(path="/dev/fuse", type="c", major=10, minor=229)]),
)


def test_register_configure_synchronize_create(tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = FakeRuntime(tmp_path / "nri.sock")
        await runtime.start()
        plugin = Recorder()
        stub = Stub(plugin, name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={})
        async with running(stub):
            session = await runtime.next_session()
            reg = session.registered.result()
            assert (reg.plugin_name, reg.plugin_idx) == ("mokka", "10")
            configured = await session.configure("profile: h100\n")
            want = event_mask([api.Event.CREATE_CONTAINER, api.Event.START_CONTAINER])
            assert configured.events == want == (1 << 3) | (1 << 5)
            assert plugin.configs == [("profile: h100\n", "fake-containerd", "v1.7.24")]
            assert stub.config == "profile: h100\n"
            assert stub.runtime == ("fake-containerd", "v1.7.24")
            sync = api.SynchronizeRequest(pods=[POD], containers=[CONTAINER])
            assert bytes(await session.call("Synchronize", sync, api.SynchronizeResponse)) == b""
            assert stub.synchronized.is_set()
            assert [p.id for p in plugin.synced[0][0]] == ["pod1"]
            reply = await session.create(POD, CONTAINER)
            adj = reply.adjust
            assert adj.annotations == {"mokka.dev/gpus": "0,3"}
            assert [(e.key, e.value) for e in adj.env] == [("NVIDIA_VISIBLE_DEVICES", "0,3")]
            assert adj.mounts[0].options == ["ro", "nosuid", "nodev", "bind"]
            dev = adj.linux.devices[0]
            assert (dev.path, dev.type, dev.major, dev.minor, dev.file_mode.value) == (
                "/dev/nvidia0",
                "c",
                120,
                0,
                0o666,
            )
            pod, container = plugin.created[0]
            assert (pod.namespace, pod.name, pod.annotations) == ("ml", "trainer", {"a": "b"})
            assert container.env == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
            assert container.linux.devices[0].path == "/dev/fuse"
            event = api.StateChangeEvent(event=api.Event.START_CONTAINER, pod=POD, container=CONTAINER)
            await session.call("StateChange", event, api.Empty)
            assert plugin.started == ["c1"]
            await session.call("Shutdown", api.Empty(), api.Empty)
            assert plugin.shutdowns == 1
            await session.close()
        await runtime.stop()

    run(scenario)


def test_large_messages_cross_frames_both_ways(tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = FakeRuntime(tmp_path / "nri.sock")
        await runtime.start()

        class Big:
            async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
                return api.ContainerAdjustment(env=[api.KeyValue(key=f"K{i}", value="v" * 200) for i in range(100)])

        stub = Stub(Big(), name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={})
        async with running(stub):
            session = await runtime.next_session()
            await session.configure()
            container = api.Container(id="c1", env=[f"E{i}=" + "x" * 200 for i in range(100)])  # ~20 KB
            reply = await session.create(POD, container)
            assert len(reply.adjust.env) == 100 and reply.adjust.env[99].key == "K99"
            assert max(session.frames.sizes) <= 4096
            assert sum(session.frames.sizes) > 20_000
            await session.close()
        await runtime.stop()

    run(scenario)


def test_handler_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        runtime = FakeRuntime(tmp_path / "nri.sock")
        await runtime.start()
        plugin = Recorder()
        stub = Stub(plugin, name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={})
        async with running(stub):
            session = await runtime.next_session()
            await session.configure()
            plugin.fail = KeyError("bug in the decision")
            reply = await session.create(POD, CONTAINER)
            assert bytes(reply) == b"" and bytes(reply.adjust) == b""  # empty adjustment: start unchanged
            plugin.fail = PluginError("GPU 7 does not exist on this node")
            with pytest.raises(ttrpc.TtrpcError) as err:
                await session.create(POD, CONTAINER)
            assert err.value.code == ttrpc.Code.UNKNOWN
            assert err.value.message == "GPU 7 does not exist on this node"
            plugin.fail = None
            assert (await session.create(POD, CONTAINER)).adjust.env[0].value == "0,3"  # still serving
            with pytest.raises(ttrpc.TtrpcError) as err:
                await session.call("UpdateContainer", api.Empty(), api.Empty)
            assert err.value.code == ttrpc.Code.UNIMPLEMENTED
            await session.close()
        await runtime.stop()

    run(scenario)


def test_reconnects_when_runtime_restarts_and_waits_for_absent_socket(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "nri.sock"
        plugin = Recorder()
        stub = Stub(plugin, name="mokka", idx="10", socket_path=path, env={}, backoff=(0.01, 0.1))
        async with running(stub) as task:
            await asyncio.sleep(0.3)  # socket absent: the stub keeps trying
            assert not task.done() and stub.connections == 0
            runtime = FakeRuntime(path)
            await runtime.start()
            session = await runtime.next_session()
            await session.configure()
            assert stub.connections == 1
            await session.close()  # containerd goes away ...
            await runtime.stop()
            await asyncio.sleep(0.2)
            assert not stub.registered.is_set()
            runtime = FakeRuntime(path)  # ... and comes back
            await runtime.start()
            session = await runtime.next_session()
            assert (await session.configure()).events == event_mask([4, 6])
            assert (await session.create(POD, CONTAINER)).adjust.annotations
            assert stub.connections == 2
            await session.close()
            await runtime.stop()

    run(scenario)


def test_prelaunched_plugin_uses_inherited_fd(tmp_path: Path) -> None:
    async def scenario() -> None:
        ours, theirs = socket.socketpair()
        fd = os.dup(theirs.fileno())
        theirs.close()
        env = {"NRI_PLUGIN_SOCKET": str(fd), "NRI_PLUGIN_NAME": "mokka", "NRI_PLUGIN_IDX": "05"}
        stub = Stub(Recorder(), socket_path=tmp_path / "unused.sock", env=env)
        assert stub.full_name == "05-mokka"
        task = asyncio.create_task(stub.run())
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        session = Session(reader, writer)
        reg = await asyncio.wait_for(session.registered, 5)
        assert (reg.plugin_name, reg.plugin_idx) == ("mokka", "05")
        await session.configure()
        assert (await session.create(POD, CONTAINER)).adjust.env
        await session.close()
        await asyncio.wait_for(task, 5)  # pre-launched: run() ends with its connection

    run(scenario)


def test_registration_without_answer_is_retried(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "nri.sock"
        silent: list[asyncio.StreamWriter] = []

        async def accept_and_ignore(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            silent.append(writer)

        server = await asyncio.start_unix_server(accept_and_ignore, str(path))
        stub = Stub(Recorder(), name="mokka", idx="10", socket_path=path, env={}, registration_timeout=0.1)
        async with running(stub):
            await asyncio.sleep(0.5)
            assert len(silent) >= 2 and stub.connections == 0
        server.close()
        for w in silent:
            w.close()

    run(scenario)


def test_stub_validates_its_inputs() -> None:
    class Nothing:
        pass

    class Blocking:
        def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
            return None

    with pytest.raises(ValueError, match="two digits"):
        Stub(Recorder(), name="mokka", idx="1", env={})
    with pytest.raises(ValueError, match="name"):
        Stub(Recorder(), idx="10", env={})
    with pytest.raises(ValueError, match="no NRI event"):
        Stub(Nothing(), name="mokka", idx="10", env={})
    with pytest.raises(TypeError, match="async"):
        Stub(Blocking(), name="mokka", idx="10", env={})
    with pytest.raises(ValueError, match="NRI_PLUGIN_SOCKET"):
        Stub(Recorder(), name="mokka", idx="10", env={"NRI_PLUGIN_SOCKET": "three"})
    stub = Stub(Recorder(), env={"NRI_PLUGIN_NAME": "mokka", "NRI_PLUGIN_IDX": "42"})
    assert (stub.full_name, stub.fd, stub.socket_path) == ("42-mokka", None, "/var/run/nri/nri.sock")
    assert Stub(Recorder(), name="x", idx="10", env={"NRI_PLUGIN_IDX": "42"}).idx == "10"
