"""The NRI plugin stub: connection, registration, configuration and dispatch, on a poll loop.

Like containerd/nri's ``pkg/stub``, the stub knows nothing of decisions. It serves one
plugin object (``Plugin``) and hands it the raw bytes of each request; the plugin answers
with the raw bytes of the reply. Nothing is decoded that the plugin does not ask for:
Synchronize, however large, is answered without being parsed.

Connection: a plugin started by containerd from its plugin directory finds its socket's fd
in ``NRI_PLUGIN_SOCKET`` (normally 3) and its name and index in ``NRI_PLUGIN_NAME`` /
``NRI_PLUGIN_IDX``; it serves that connection until it closes, then ``run`` returns.
Otherwise the stub dials ``socket_path`` and, whenever the socket is absent or the
connection drops (containerd restarting), dials again every ``retry`` seconds.

Registration is ``Runtime.RegisterPlugin`` on mux conn 2; containerd then calls
``Configure`` (answered with the plugin's event mask) and, for plugins that connected
themselves, ``Synchronize``. Once that is done and the loop is idle, ``plugin.warm_up()``
runs: a plugin registers first and loads what it needs after.

One file, though long: the connection, registration and dispatch share one poll loop and its
state, as containerd/nri's ``pkg/stub`` keeps them in one file.
"""

from __future__ import annotations

import os
import re
import socket
import time
from array import array
from collections.abc import Callable, Mapping

from nri_mokka.log import Logger
from nri_mokka.nri import loop as poll_loop
from nri_mokka.nri import ttrpc, wire
from nri_mokka.nri.mux import MAX_FRAME_PAYLOAD, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, FrameDecoder, MuxError
from nri_mokka.nri.mux import encode_frames as _frames

__all__ = [
    "DEFAULT_SOCKET",
    "ENV_IDX",
    "ENV_NAME",
    "ENV_SOCKET",
    "EVENTS",
    "PLUGIN_METHODS",
    "PLUGIN_SERVICE",
    "RUNTIME_METHODS",
    "RUNTIME_SERVICE",
    "PluginError",
    "Stub",
    "event_mask",
]

# typing is not imported at run time (mypy reads TYPE_CHECKING as true): the plugin starts faster.
TYPE_CHECKING = False

log = Logger("mokka.nri")

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
ENV_SOCKET = "NRI_PLUGIN_SOCKET"
ENV_NAME = "NRI_PLUGIN_NAME"
ENV_IDX = "NRI_PLUGIN_IDX"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# The RPCs Mokka serves and calls, with their argument and reply messages (the services of
# NRI's api.proto; tests/test_nri_wire.py checks this table against the official file).
PLUGIN_METHODS = {
    "Configure": ("ConfigureRequest", "ConfigureResponse"),
    "Synchronize": ("SynchronizeRequest", "SynchronizeResponse"),
    "Shutdown": ("Empty", "Empty"),
    "CreateContainer": ("CreateContainerRequest", "CreateContainerResponse"),
    "StopContainer": ("StopContainerRequest", "StopContainerResponse"),
    "StateChange": ("StateChangeEvent", "Empty"),
}
RUNTIME_METHODS = {"RegisterPlugin": ("RegisterPluginRequest", "Empty")}

# NRI's Event enum (api.proto), for the subscription mask.
EVENTS = {
    "RUN_POD_SANDBOX": 1,
    "STOP_POD_SANDBOX": 2,
    "REMOVE_POD_SANDBOX": 3,
    "CREATE_CONTAINER": 4,
    "POST_CREATE_CONTAINER": 5,
    "START_CONTAINER": 6,
    "POST_START_CONTAINER": 7,
    "UPDATE_CONTAINER": 8,
    "POST_UPDATE_CONTAINER": 9,
    "STOP_CONTAINER": 10,
    "REMOVE_CONTAINER": 11,
}
LAST_EVENT = 12

HANDLING_SAMPLES = 1024  # the ring of recent CreateContainer handling times


class PluginError(Exception):
    """Raised by a plugin handler to answer the request with an error status.

    For CreateContainer this fails the container in containerd (with this message), where
    any other exception lets it start unadjusted.
    """


if TYPE_CHECKING:
    from typing import Protocol

    class Plugin(Protocol):
        """What the stub serves. Every payload is the raw protobuf of NRI's message."""

        events: int  # subscription mask (``event_mask``); never 0, which would mean all events

        def configure(self, config: str, runtime_name: str, runtime_version: str) -> None: ...

        def create_container(self, request: bytes) -> bytes:
            """The encoded CreateContainerResponse for an encoded CreateContainerRequest."""
            ...

        def warm_up(self) -> None:
            """Load what answering needs; called once registered, when the loop is idle."""
            ...

        # Optional: ``replied()``, called after each CreateContainer answer has been sent: the
        # place for what containerd need not wait for (the plugin's log line).
        #
        # Optional: ``container_event(event, payload)``, called for the other container events
        # the plugin subscribes to, after they have been answered (nothing the plugin does can
        # change or delay them): ``event`` is NRI's Event number; ``payload`` the raw
        # StateChangeEvent (pod = 2, container = 3) or, for STOP_CONTAINER, the raw
        # StopContainerRequest (pod = 1, container = 2). StopContainer is answered without
        # container updates.


def event_mask(events: list[int] | tuple[int, ...]) -> int:
    """Return NRI's subscription mask: bit ``1 << (event - 1)`` for each event."""
    mask = 0
    for event in events:
        if not 0 < event < LAST_EVENT:
            raise ValueError(f"not a subscribable event: {event!r}")
        mask |= 1 << (event - 1)
    return mask


class _Connection:
    """One trunk: mux frames, ttrpc on conn 1 (we serve) and conn 2 (we call)."""

    def __init__(self, stub: Stub, sock: socket.socket, inherited: bool) -> None:
        self.stub = stub
        self.inherited = inherited  # handed over by containerd (pre-launched), not dialled
        self.sock = sock
        self.fd = sock.fileno()
        sock.setblocking(False)
        self.frames = FrameDecoder()
        self.requests = ttrpc.MessageDecoder()  # conn 1: the runtime's calls
        self.replies = ttrpc.MessageDecoder()  # conn 2: answers to ours
        self.out = bytearray()
        self.last_request_id = 0
        self.message_started = 0.0  # when the first piece of the conn-1 message in progress came
        self.closed = False
        self.registered = False
        self.register_timer: poll_loop.Timer | None = None

    # -- socket --

    def on_ready(self, revents: int) -> None:
        if revents & poll_loop.WRITE:
            self.flush()
        if revents & (poll_loop.READ | poll_loop.ERROR) and not self.closed:
            try:
                data = self.sock.recv(262144)
            except BlockingIOError:
                return
            except OSError as exc:
                self.close(f"read failed: {exc}")
                return
            if not data:
                self.close("closed by the runtime")
                return
            try:
                self.receive(data)
            except (MuxError, ttrpc.ProtocolError, wire.WireError) as exc:
                self.close(f"protocol error: {exc}")

    def send(self, conn_id: int, message: bytes) -> None:
        data = _frames(conn_id, message, MAX_FRAME_PAYLOAD)
        if self.out:
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self.close(f"write failed: {exc}")
            return
        if sent < len(data):
            self.out += data[sent:]
            self.stub.loop.watch(self.fd, poll_loop.READ | poll_loop.WRITE, self.on_ready)

    def flush(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self.close(f"write failed: {exc}")
            return
        del self.out[:sent]
        if not self.out:
            self.stub.loop.watch(self.fd, poll_loop.READ, self.on_ready)

    def close(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.register_timer is not None:
            self.register_timer.cancel()
        self.stub.loop.unwatch(self.fd)
        self.sock.close()
        self.stub.connection_closed(self, why)

    # -- mux and ttrpc --

    def receive(self, data: bytes) -> None:
        for conn_id, payload in self.frames.feed(data):
            if conn_id == PLUGIN_SERVICE_CONN:
                if not self.requests.pending:
                    self.message_started = time.perf_counter()
                for msg in self.requests.feed(payload):
                    self.serve(msg)
                    if self.closed:
                        return
                    self.message_started = time.perf_counter()  # for a next message in the same piece
            elif conn_id == RUNTIME_SERVICE_CONN:
                for msg in self.replies.feed(payload):
                    self.reply(msg)
            # frames for other conns are dropped, as by the Go multiplexer

    def call(self, method: str, payload: bytes, timeout: float) -> None:
        """Call ``Runtime.method`` (stream 1: the one call a plugin makes, RegisterPlugin)."""
        envelope = ttrpc.encode_request(RUNTIME_SERVICE, method, payload, int(timeout * 1e9))
        self.send(RUNTIME_SERVICE_CONN, ttrpc.encode_message(1, ttrpc.MessageType.REQUEST, 0, envelope))

    def reply(self, msg: ttrpc.Message) -> None:
        if msg.type != ttrpc.MessageType.RESPONSE or msg.stream_id != 1 or self.registered:
            log.debug("ignoring ttrpc message type %d on stream %d of conn 2", msg.type, msg.stream_id)
            return
        if self.register_timer is not None:
            self.register_timer.cancel()
        try:
            ttrpc.decode_response(msg.payload)
        except ttrpc.TtrpcError as exc:
            self.close(f"registration refused: {exc}")
            return
        self.registered = True
        self.stub.on_registered(self)

    def answer(self, stream_id: int, code: int, message: str = "", payload: bytes = b"") -> None:
        envelope = ttrpc.encode_response(payload, code, message)
        self.send(PLUGIN_SERVICE_CONN, ttrpc.encode_message(stream_id, ttrpc.MessageType.RESPONSE, 0, envelope))

    def serve(self, msg: ttrpc.Message) -> None:
        sid = msg.stream_id
        if sid % 2 != 1:
            self.answer(sid, ttrpc.Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
            return
        if msg.type != ttrpc.MessageType.REQUEST:
            if msg.type == ttrpc.MessageType.DATA:
                self.answer(sid, ttrpc.Code.INVALID_ARGUMENT, "StreamID is no longer active")
            return
        if sid <= self.last_request_id:
            self.answer(sid, ttrpc.Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
            return
        self.last_request_id = sid
        try:
            request = ttrpc.decode_request(msg.payload)
        except (wire.WireError, UnicodeDecodeError) as exc:
            self.answer(sid, ttrpc.Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            return
        method = request.method
        if request.service != PLUGIN_SERVICE:
            self.answer(sid, ttrpc.Code.UNIMPLEMENTED, f"service {request.service}")
        elif method == "CreateContainer":
            # timed from here: the message is whole (its pieces may have come apart, as the
            # runtime wrote them), so what is timed is the plugin's own handling
            self.stub.create_container(self, sid, request.payload, time.perf_counter())
        elif method not in PLUGIN_METHODS:
            self.answer(sid, ttrpc.Code.UNIMPLEMENTED, f"method {method}")
        else:
            self.stub.other_call(self, sid, method, request.payload, self.message_started, time.perf_counter())


class Stub:
    """Connects a plugin object to NRI: ``Stub(plugin, name=..., idx=...).run()``."""

    def __init__(
        self,
        plugin: Plugin,
        *,
        name: str | None = None,
        idx: str | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        retry: float = 0.02,
        registration_timeout: float = 5.0,
        env: Mapping[str, str] | None = None,
        loop: poll_loop.Loop | None = None,
        fd: int | None = None,
        reconnect: bool = True,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """``name``/``idx`` default to ``NRI_PLUGIN_NAME``/``NRI_PLUGIN_IDX``; a pre-connected
        socket (``fd``, else ``NRI_PLUGIN_SOCKET``) takes precedence over ``socket_path``.
        Without ``reconnect``, a dialled connection is served like a pre-connected one: once
        registered, its end ends ``run`` (containerd will launch its plugins afresh).
        ``on_ready`` is called each time registration is complete."""
        env = os.environ if env is None else env
        self.plugin = plugin
        self.name = name or env.get(ENV_NAME, "")
        self.idx = idx or env.get(ENV_IDX, "")
        if not self.name:
            raise ValueError("plugin name is empty")
        if not re.fullmatch(r"[0-9]{2}", self.idx):
            raise ValueError(f"plugin index must be exactly two digits, not {self.idx!r}")
        self.fd = fd
        if self.fd is None and (fd_text := env.get(ENV_SOCKET)):
            try:
                self.fd = int(fd_text)
            except ValueError:
                raise ValueError(f"invalid {ENV_SOCKET}={fd_text!r}: not a file descriptor") from None
        self.socket_path = os.fspath(socket_path or DEFAULT_SOCKET)
        self.retry = retry
        self.registration_timeout = registration_timeout
        events = getattr(plugin, "events", 0)
        if not isinstance(events, int) or events <= 0:
            raise ValueError(f"{type(plugin).__name__} subscribes to no NRI event (and mask 0 would mean all)")
        self.events = events
        self._replied: Callable[[], None] | None = getattr(plugin, "replied", None)
        self._container_event: Callable[[int, bytes], None] | None = getattr(plugin, "container_event", None)
        self.loop = loop or poll_loop.Loop()
        self.reconnect = reconnect
        self.on_ready = on_ready
        self.runtime: tuple[str, str] | None = None  # (name, version) from the last Configure
        self.config = ""  # config string from the last Configure
        self.connections = 0  # registrations so far
        self.registered = False  # registered on the current connection
        self.synchronized = False  # Synchronize answered on the current connection
        self.started_at = time.monotonic()
        self.registered_at = 0.0  # time.monotonic() of the last registration
        self.ready_at = 0.0  # ... and when it was complete (configured, synchronized where asked)
        self.sync_seconds = 0.0  # handling of the last Synchronize: whole request -> answered
        self.sync_receive_seconds = 0.0  # ... and its arrival: first byte -> whole
        self.sync_bytes = 0
        self.decisions = 0
        self.handling = array("d", bytes(8 * HANDLING_SAMPLES))  # seconds per CreateContainer (ring)
        self._conn: _Connection | None = None
        self._warm_timer: poll_loop.Timer | None = None
        self._reported = ""
        self._stopping = False

    @property
    def full_name(self) -> str:
        """The name containerd registers the plugin under: ``<idx>-<name>``."""
        return f"{self.idx}-{self.name}"

    def recent_handling(self) -> list[float]:
        """The recent CreateContainer handling times, in seconds (oldest first)."""
        n = min(self.decisions, HANDLING_SAMPLES)
        start = self.decisions - n
        return [self.handling[i % HANDLING_SAMPLES] for i in range(start, self.decisions)]

    # -- life cycle --

    def run(self) -> None:
        """Serve NRI until ``stop()``; a pre-connected plugin also returns when its connection ends."""
        self._stopping = False
        if self.fd is not None:
            log.info("%s: using pre-connected socket fd %d", self.full_name, self.fd)
            fd, self.fd = self.fd, None  # a connection lost is not reused
            self._open(socket.socket(fileno=fd), inherited=True)
        else:
            self._dial()
        self.loop.run()

    def stop(self) -> None:
        """Close the connection and make ``run`` return."""
        self._stopping = True
        if self._conn is not None:
            self._conn.close("plugin stopping")
        self.loop.stop()

    def _dial(self) -> None:
        if self._stopping:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            if not self.reconnect:
                log.info("%s: cannot connect to %s (%s); exiting", self.full_name, self.socket_path, exc)
                self.loop.stop()
                return
            if str(exc) != self._reported:
                log.info("%s: cannot connect to %s (%s); retrying", self.full_name, self.socket_path, exc)
                self._reported = str(exc)
            self.loop.call_later(self.retry, self._dial)
            return
        self._reported = ""
        self._open(sock, inherited=False)

    def _open(self, sock: socket.socket, inherited: bool) -> None:
        conn = _Connection(self, sock, inherited)
        self._conn = conn
        self.loop.watch(conn.fd, poll_loop.READ, conn.on_ready)
        request = wire.encode_bytes(1, self.name.encode()) + wire.encode_bytes(2, self.idx.encode())
        conn.register_timer = self.loop.call_later(self.registration_timeout, lambda: self._register_timeout(conn))
        conn.call("RegisterPlugin", request, self.registration_timeout)

    def _register_timeout(self, conn: _Connection) -> None:
        log.warning("%s: registration not answered within %g s", self.full_name, self.registration_timeout)
        conn.close("registration timed out")

    def on_registered(self, conn: _Connection) -> None:
        self.connections += 1
        self.registered = True
        self.registered_at = time.monotonic()
        since = f", {(self.registered_at - self.started_at) * 1000:.1f} ms after start" if self.connections == 1 else ""
        log.info("%s: registered (pid %d%s)", self.full_name, os.getpid(), since)

    def connection_closed(self, conn: _Connection, why: str) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        was = self.registered
        self.registered = self.synchronized = False
        if self._warm_timer is not None:
            self._warm_timer.cancel()
        if self._stopping:
            return
        if conn.inherited or (was and not self.reconnect):
            log.info("%s: connection %s; exiting (containerd launches its plugins afresh)", self.full_name, why)
            self.loop.stop()
            return
        if was or why != "registration timed out":
            log.info("%s: connection to %s %s; reconnecting", self.full_name, self.socket_path, why)
        self.loop.call_later(self.retry if was else max(self.retry, 0.1), self._dial)

    def _ready(self) -> None:
        self.ready_at = time.monotonic()
        if self.on_ready is not None:
            self.on_ready()
        if self._warm_timer is not None:
            self._warm_timer.cancel()
        self._warm_timer = self.loop.call_later(0, self._warm_up)

    def _warm_up(self) -> None:
        self._warm_timer = None
        try:
            self.plugin.warm_up()
        except Exception:  # warm-up is an optimisation: the first request loads lazily instead
            log.exception("%s: warm-up failed", self.full_name)

    # -- calls from the runtime --

    def create_container(self, conn: _Connection, sid: int, payload: bytes, started: float) -> None:
        try:
            reply = self.plugin.create_container(payload)
        except PluginError as exc:
            conn.answer(sid, ttrpc.Code.UNKNOWN, str(exc) or "plugin error")
        except Exception:  # fail open: a bug here must never block a container
            log.exception("CreateContainer: plugin failed; answering with no changes")
            conn.answer(sid, ttrpc.Code.OK)
        else:
            conn.answer(sid, ttrpc.Code.OK, payload=reply)
        self.handling[self.decisions % HANDLING_SAMPLES] = time.perf_counter() - started
        self.decisions += 1
        if self._replied is not None:
            self._replied()

    def other_call(
        self, conn: _Connection, sid: int, method: str, payload: bytes, first_byte: float, whole: float
    ) -> None:
        """``first_byte``, ``whole``: when the request began to arrive, and when it was complete."""
        if method == "Configure":
            config = name = version = ""
            for number, kind, a, b in wire.fields(payload):
                if kind == wire.LEN:
                    text = payload[a:b].decode(errors="replace")
                    if number == 1:
                        config = text
                    elif number == 2:
                        name = text
                    elif number == 3:
                        version = text
            self.runtime = (name, version)
            self.config = config
            try:
                self.plugin.configure(config, name, version)
            except PluginError as exc:
                conn.answer(sid, ttrpc.Code.UNKNOWN, str(exc) or "plugin error")
                return
            except Exception:
                log.exception("Configure: plugin failed; continuing with its previous configuration")
            conn.answer(sid, ttrpc.Code.OK, payload=wire.encode_varint_field(2, self.events))
            log.info("%s: configured by %s %s (events 0x%x)", self.full_name, name, version, self.events)
            if conn.inherited:
                self._ready()  # NRI 0.6 synchronizes only plugins that connected themselves
            else:
                self._warm_timer = self.loop.call_later(0.05, self._warm_up)  # unless Synchronize comes first
        elif method == "Synchronize":
            # Nothing in it matters to Mokka: answered without decoding, whatever its size.
            conn.answer(sid, ttrpc.Code.OK)
            self.sync_seconds = time.perf_counter() - whole
            self.sync_receive_seconds = whole - first_byte
            self.sync_bytes = len(payload)
            self.synchronized = True
            self._ready()
            log.info(
                "%s: synchronized (%d bytes: %.2f ms to arrive, %.2f ms to answer)",
                self.full_name,
                self.sync_bytes,
                self.sync_receive_seconds * 1000,
                self.sync_seconds * 1000,
            )
        elif method == "Shutdown":
            log.info("%s: runtime is shutting down", self.full_name)
            conn.answer(sid, ttrpc.Code.OK)
        elif method in ("StateChange", "StopContainer"):
            conn.answer(sid, ttrpc.Code.OK)  # Empty; a StopContainerResponse without updates
            if self._container_event is None:
                return
            event = EVENTS["STOP_CONTAINER"]
            try:
                if method == "StateChange":
                    event = next((a for n, kind, a, _ in wire.fields(payload) if n == 1 and kind == wire.VARINT), 0)
                self._container_event(event, payload)
            except Exception as exc:  # an event is a notification: nothing to fail
                log.error("%s: plugin failed on event %d: %s: %s", method, event, type(exc).__name__, exc)
        else:
            conn.answer(sid, ttrpc.Code.OK)
