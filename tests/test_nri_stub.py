"""The NRI plugin stub against a fake runtime built from the same framing (unit level).

The fake plays containerd's part with plain blocking sockets: it listens on a unix socket
(or hands a socketpair end over as a pre-launched plugin's fd), answers
``Runtime.RegisterPlugin`` on mux conn 2 and calls the plugin's service on conn 1. The stub
runs its poll loop in a thread. The real containerd is exercised by test_e2e_nri.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_mokka.nri import loop as poll_loop
from nri_mokka.nri import mux, ttrpc
from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as api
from nri_mokka.nri.stub import PLUGIN_SERVICE, RUNTIME_SERVICE, PluginError, Stub, event_mask


class Session:
    """One plugin connection, seen from the runtime (blocking, with a timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(5)
        self.frames = mux.FrameDecoder()
        self.decoders = {1: ttrpc.MessageDecoder(), 2: ttrpc.MessageDecoder()}
        self.inbox: dict[int, list[ttrpc.Message]] = {1: [], 2: []}
        self.frame_sizes: list[int] = []
        self.next_id = 1
        self.registration = self._registered()

    def _receive(self, conn: int) -> ttrpc.Message:
        while not self.inbox[conn]:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("plugin closed the connection")
            for c, payload in self.frames.feed(data):
                self.frame_sizes.append(len(payload))
                self.inbox[c] += self.decoders[c].feed(payload)
        return self.inbox[conn].pop(0)

    def _registered(self) -> api.RegisterPluginRequest:
        msg = self._receive(2)
        req = ttrpc.decode_request(msg.payload)
        assert (req.service, req.method) == (RUNTIME_SERVICE, "RegisterPlugin")
        assert msg.stream_id == 1 and req.timeout_nano > 0
        reply = ttrpc.encode_message(msg.stream_id, ttrpc.MessageType.RESPONSE, 0, ttrpc.encode_response(b""))
        self.sock.sendall(mux.encode_frames(2, reply))
        return api.RegisterPluginRequest().parse(req.payload)

    def send_raw(self, stream_id: int, type_: int, envelope: bytes, frame: int = 4096) -> None:
        self.sock.sendall(mux.encode_frames(1, ttrpc.encode_message(stream_id, type_, 0, envelope), frame))

    def raw_call(
        self, method: str, payload: bytes, stream_id: int | None = None, service: str = PLUGIN_SERVICE
    ) -> bytes:
        """Send a request; return the reply's payload (TtrpcError for an error status)."""
        if stream_id is None:
            stream_id, self.next_id = self.next_id, self.next_id + 2
        self.send_raw(stream_id, ttrpc.MessageType.REQUEST, ttrpc.encode_request(service, method, payload, 2 * 10**9))
        reply = self._receive(1)
        assert (reply.stream_id, reply.type) == (stream_id, ttrpc.MessageType.RESPONSE)
        return ttrpc.decode_response(reply.payload)

    def configure(self, config: str = "") -> api.ConfigureResponse:
        req = api.ConfigureRequest(config=config, runtime_name="fake-containerd", runtime_version="v1.7.24")
        return api.ConfigureResponse().parse(self.raw_call("Configure", bytes(req)))

    def create(self, pod: api.PodSandbox, container: api.Container) -> api.CreateContainerResponse:
        req = api.CreateContainerRequest(pod=pod, container=container)
        return api.CreateContainerResponse().parse(self.raw_call("CreateContainer", bytes(req)))

    def close(self) -> None:
        self.sock.close()


class FakeRuntime:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(4)
        self.server.settimeout(5)

    def next_session(self) -> Session:
        sock, _ = self.server.accept()
        return Session(sock)

    def stop(self) -> None:
        self.server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class Recorder:
    """A plugin that records what it is given and answers a fixed adjustment."""

    events = event_mask([api.Event.CREATE_CONTAINER, api.Event.START_CONTAINER])

    def __init__(self) -> None:
        self.configs: list[tuple[str, str, str]] = []
        self.created: list[api.CreateContainerRequest] = []
        self.warm_ups = 0
        self.fail: BaseException | None = None
        self.reply = bytes(
            api.CreateContainerResponse(
                adjust=api.ContainerAdjustment(
                    annotations={"mokka.dev/gpus": "0,3"},
                    env=[api.KeyValue(key="NVIDIA_VISIBLE_DEVICES", value="0,3")],
                    linux=api.LinuxContainerAdjustment(
                        devices=[
                            api.LinuxDevice(
                                path="/dev/nvidia0", type="c", major=120, file_mode=api.OptionalFileMode(value=0o666)
                            )
                        ]
                    ),
                )
            )
        )

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        self.configs.append((config, runtime_name, runtime_version))

    def create_container(self, payload: bytes) -> bytes:
        self.created.append(api.CreateContainerRequest().parse(payload))
        if self.fail is not None:
            raise self.fail
        return self.reply

    def warm_up(self) -> None:
        self.warm_ups += 1


POD = api.PodSandbox(id="pod1", name="trainer", namespace="ml", annotations={"a": "b"})
CONTAINER = api.Container(id="c1", pod_sandbox_id="pod1", name="main", env=["PATH=/bin"])


@contextlib.contextmanager
def running(stub: Stub) -> Iterator[threading.Thread]:
    """The stub's loop in a thread; stopped (from inside the loop) on exit."""
    r, w = os.pipe()
    stub.loop.watch(r, poll_loop.READ, lambda revents: stub.stop())
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        os.write(w, b"x")
        thread.join(5)
        os.close(r)
        os.close(w)
        assert not thread.is_alive()


def wait_for(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_register_configure_synchronize_create(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    plugin = Recorder()
    ready: list[float] = []
    stub = Stub(
        plugin, name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={}, on_ready=lambda: ready.append(1)
    )
    with running(stub):
        session = runtime.next_session()
        assert (session.registration.plugin_name, session.registration.plugin_idx) == ("mokka", "10")
        configured = session.configure("allocator: external\n")
        assert configured.events == event_mask([4, 6]) == (1 << 3) | (1 << 5)
        assert plugin.configs == [("allocator: external\n", "fake-containerd", "v1.7.24")]
        assert stub.config == "allocator: external\n" and stub.runtime == ("fake-containerd", "v1.7.24")
        # Synchronize is answered without being decoded, whatever its size (1 MB here).
        big = api.PodSandbox(id="p2", annotations={"big": "x" * 1_000_000})
        sync = api.SynchronizeRequest(pods=[POD, big] * 2, containers=[CONTAINER] * 500)
        assert len(bytes(sync)) > 1_000_000
        assert session.raw_call("Synchronize", bytes(sync)) == b""
        wait_for(lambda: stub.synchronized and plugin.warm_ups >= 1 and bool(ready))
        assert stub.sync_bytes == len(bytes(sync)) and stub.sync_seconds > 0
        reply = session.create(POD, CONTAINER)
        assert bytes(reply) == plugin.reply
        assert plugin.created[0].pod.annotations == {"a": "b"} and plugin.created[0].container.env == ["PATH=/bin"]
        wait_for(lambda: stub.decisions == 1 and len(stub.recent_handling()) == 1)
        event = api.StateChangeEvent(event=api.Event.START_CONTAINER, pod=POD, container=CONTAINER)
        assert session.raw_call("StateChange", bytes(event)) == b""
        assert session.raw_call("Shutdown", b"") == b""
        session.close()
    runtime.stop()


def test_large_messages_cross_frames_both_ways(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    plugin = Recorder()
    plugin.reply = bytes(
        api.CreateContainerResponse(
            adjust=api.ContainerAdjustment(env=[api.KeyValue(key=f"K{i}", value="v" * 200) for i in range(100)])
        )
    )
    stub = Stub(plugin, name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={})
    with running(stub):
        session = runtime.next_session()
        session.configure()
        container = api.Container(id="c1", env=[f"E{i}=" + "x" * 200 for i in range(100)])  # ~20 KB
        req = bytes(api.CreateContainerRequest(pod=POD, container=container))
        session.send_raw(
            1 + 2 * 1, ttrpc.MessageType.REQUEST, ttrpc.encode_request(PLUGIN_SERVICE, "CreateContainer", req), 7
        )
        session.next_id = 5
        reply = session._receive(1)
        adjust = api.CreateContainerResponse().parse(ttrpc.decode_response(reply.payload)).adjust
        assert len(adjust.env) == 100 and adjust.env[99].key == "K99"
        assert max(session.frame_sizes) <= 4096
        assert sum(session.frame_sizes) > 20_000
        assert len(plugin.created[0].container.env) == 100
        session.close()
    runtime.stop()


def test_errors_and_stream_rules(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    plugin = Recorder()
    stub = Stub(plugin, name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={})
    with running(stub):
        session = runtime.next_session()
        session.configure()
        req = bytes(api.CreateContainerRequest(pod=POD, container=CONTAINER))
        plugin.fail = KeyError("bug in the decision")
        assert session.raw_call("CreateContainer", req) == b""  # empty adjustment: the container starts unchanged
        plugin.fail = PluginError("GPU 7 does not exist on this node")
        with pytest.raises(ttrpc.TtrpcError) as err:
            session.raw_call("CreateContainer", req)
        assert (err.value.code, err.value.message) == (ttrpc.Code.UNKNOWN, "GPU 7 does not exist on this node")
        plugin.fail = None
        assert session.raw_call("CreateContainer", req) == plugin.reply  # still serving

        def status(call: Callable[[], bytes]) -> tuple[int, str]:
            with pytest.raises(ttrpc.TtrpcError) as err:
                call()
            return err.value.code, err.value.message

        assert status(lambda: session.raw_call("UpdateContainer", b"")) == (12, "method UpdateContainer")
        assert status(lambda: session.raw_call("Configure", b"", service=RUNTIME_SERVICE)) == (
            12,
            f"service {RUNTIME_SERVICE}",
        )
        assert status(lambda: session.raw_call("Shutdown", b"", stream_id=1)) == (
            3,
            "StreamID cannot be re-used and must increment",
        )
        assert status(lambda: session.raw_call("Shutdown", b"", stream_id=100)) == (
            3,
            "StreamID must be odd for client initiated streams",
        )
        session.send_raw(101, ttrpc.MessageType.DATA, b"")
        reply = session._receive(1)
        assert reply.stream_id == 101 and status(lambda: ttrpc.decode_response(reply.payload))[0] == 3
        session.send_raw(103, ttrpc.MessageType.REQUEST, b"\x0a\x30broken")
        reply = session._receive(1)
        assert status(lambda: ttrpc.decode_response(reply.payload))[0] == 3
        session.next_id = 105
        assert session.raw_call("CreateContainer", req) == plugin.reply
        session.close()
    runtime.stop()


def test_reconnects_when_runtime_restarts_and_waits_for_absent_socket(tmp_path: Path) -> None:
    path = tmp_path / "nri.sock"
    stub = Stub(Recorder(), name="mokka", idx="10", socket_path=path, env={}, retry=0.01)
    with running(stub) as thread:
        time.sleep(0.2)  # socket absent: the stub keeps trying
        assert thread.is_alive() and stub.connections == 0
        runtime = FakeRuntime(path)
        session = runtime.next_session()
        session.configure()
        assert stub.connections == 1
        session.close()  # containerd goes away ...
        runtime.stop()
        wait_for(lambda: not stub.registered)
        runtime = FakeRuntime(path)  # ... and comes back
        session = runtime.next_session()
        assert session.configure().events == event_mask([4, 6])
        assert session.create(POD, CONTAINER).adjust.annotations
        assert stub.connections == 2
        session.close()
        runtime.stop()


def test_prelaunched_plugin_uses_inherited_fd_and_ends_with_it() -> None:
    ours, theirs = socket.socketpair()
    fd = os.dup(theirs.fileno())
    theirs.close()
    env = {"NRI_PLUGIN_SOCKET": str(fd), "NRI_PLUGIN_NAME": "mokka", "NRI_PLUGIN_IDX": "05"}
    plugin = Recorder()
    stub = Stub(plugin, socket_path="/nonexistent/unused.sock", env=env)
    assert stub.full_name == "05-mokka"
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    session = Session(ours)
    assert (session.registration.plugin_name, session.registration.plugin_idx) == ("mokka", "05")
    session.configure()
    wait_for(lambda: plugin.warm_ups == 1)  # NRI 0.6 sends pre-launched plugins no Synchronize
    assert session.create(POD, CONTAINER).adjust.env
    session.close()
    thread.join(5)  # pre-launched: run() ends with its connection
    assert not thread.is_alive()


def test_without_reconnect_a_lost_connection_ends_the_plugin(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    stub = Stub(Recorder(), name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={}, reconnect=False)
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    session = runtime.next_session()
    session.configure()
    session.close()
    thread.join(5)
    assert not thread.is_alive() and stub.connections == 1
    runtime.stop()
    stub = Stub(Recorder(), name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={}, reconnect=False)
    stub.run()  # nothing to dial: returns at once
    assert stub.connections == 0


def test_registration_without_answer_is_retried(tmp_path: Path) -> None:
    path = tmp_path / "nri.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(5)
    stub = Stub(Recorder(), name="mokka", idx="10", socket_path=path, env={}, registration_timeout=0.1)
    silent = []
    with running(stub):
        for _ in range(2):
            silent.append(server.accept()[0])  # a second dial proves the first timed out
        assert stub.connections == 0
    server.close()
    for s in silent:
        s.close()


def test_stub_validates_its_inputs() -> None:
    class Nothing:
        events = 0

        def configure(self, config: str, runtime_name: str, runtime_version: str) -> None: ...

        def create_container(self, request: bytes) -> bytes:
            return b""

        def warm_up(self) -> None: ...

    with pytest.raises(ValueError, match="two digits"):
        Stub(Recorder(), name="mokka", idx="1", env={})
    with pytest.raises(ValueError, match="name"):
        Stub(Recorder(), idx="10", env={})
    with pytest.raises(ValueError, match="no NRI event"):
        Stub(Nothing(), name="mokka", idx="10", env={})
    with pytest.raises(ValueError, match="NRI_PLUGIN_SOCKET"):
        Stub(Recorder(), name="mokka", idx="10", env={"NRI_PLUGIN_SOCKET": "three"})
    with pytest.raises(ValueError, match="not a subscribable event"):
        event_mask([12])
    stub = Stub(Recorder(), env={"NRI_PLUGIN_NAME": "mokka", "NRI_PLUGIN_IDX": "42"})
    assert (stub.full_name, stub.fd, stub.socket_path) == ("42-mokka", None, "/var/run/nri/nri.sock")
    assert Stub(Recorder(), name="x", idx="10", env={"NRI_PLUGIN_IDX": "42"}).idx == "10"


def test_loop_timers_and_watches() -> None:
    loop = poll_loop.Loop()
    seen: list[str] = []
    late = loop.call_later(10, lambda: seen.append("never"))
    late.cancel()
    loop.call_later(0.02, lambda: seen.append("second"))
    loop.call_later(0.0, lambda: seen.append("first"))
    r, w = os.pipe()

    def readable(revents: int) -> None:
        seen.append(os.read(r, 10).decode())
        loop.unwatch(r)
        loop.call_later(0.01, loop.stop)

    loop.call_later(0.03, lambda: os.write(w, b"pipe"))
    loop.watch(r, poll_loop.READ, readable)
    loop.run()
    assert seen == ["first", "second", "pipe"]
    os.close(r)
    os.close(w)
