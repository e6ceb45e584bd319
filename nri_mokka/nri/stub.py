"""The NRI plugin stub: connection, registration, configuration and event dispatch.

Like containerd/nri's ``pkg/stub``, the stub knows nothing of decisions. A plugin is any
object; it handles an event by defining the matching coroutine method, and the stub
subscribes exactly to the events it defines::

    async def configure(self, config: str, runtime_name: str, runtime_version: str) -> None
    async def synchronize(self, pods: list[PodSandbox], containers: list[Container]) -> None
    async def shutdown(self) -> None
    async def create_container(self, pod: PodSandbox, container: Container) -> ContainerAdjustment | None
    async def run_pod_sandbox(self, pod)            # also stop_pod_sandbox, remove_pod_sandbox
    async def start_container(self, pod, container) # also post_create_container, post_start_container,
                                                    # post_update_container, remove_container

``configure``, ``synchronize`` and ``shutdown`` are optional and subscribe to nothing. A handler
that raises ``PluginError`` makes the stub answer with an error status: for CreateContainer,
containerd then fails that container with the error's message. Any other exception is logged
and answered as if the handler had asked for nothing (an empty adjustment).

Connection: a plugin started by containerd from its plugin directory finds its socket's fd
in ``NRI_PLUGIN_SOCKET`` (normally 3) and its name and index in ``NRI_PLUGIN_NAME`` /
``NRI_PLUGIN_IDX``; it serves that connection until it closes, then ``run`` returns. Otherwise
the stub dials ``socket_path`` and, whenever the socket is absent or the connection drops
(containerd restarting), dials again with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, cast

from nri_mokka.nri import ttrpc
from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as api
from nri_mokka.nri._pb.nri.pkg.api.v1alpha1 import (
    ConfigureRequest,
    ConfigureResponse,
    Container,
    ContainerAdjustment,
    CreateContainerRequest,
    CreateContainerResponse,
    Empty,
    Event,
    KeyValue,
    LinuxContainer,
    LinuxContainerAdjustment,
    LinuxDevice,
    Mount,
    OptionalFileMode,
    PluginBase,
    PodSandbox,
    RegisterPluginRequest,
    StateChangeEvent,
    SynchronizeRequest,
    SynchronizeResponse,
)
from nri_mokka.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux

__all__ = [
    "DEFAULT_SOCKET",
    "ENV_IDX",
    "ENV_NAME",
    "ENV_SOCKET",
    "PLUGIN_SERVICE",
    "RUNTIME_SERVICE",
    "Container",
    "ContainerAdjustment",
    "Event",
    "KeyValue",
    "LinuxContainer",
    "LinuxContainerAdjustment",
    "LinuxDevice",
    "Mount",
    "OptionalFileMode",
    "PluginError",
    "PodSandbox",
    "Stub",
    "api",
    "event_mask",
    "run",
]

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
ENV_SOCKET = "NRI_PLUGIN_SOCKET"
ENV_NAME = "NRI_PLUGIN_NAME"
ENV_IDX = "NRI_PLUGIN_IDX"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# Handlers the stub dispatches, by the event each subscribes to. UpdateContainer and
# StopContainer have RPCs of their own, which Mokka does not declare.
POD_EVENTS = {
    "run_pod_sandbox": Event.RUN_POD_SANDBOX,
    "stop_pod_sandbox": Event.STOP_POD_SANDBOX,
    "remove_pod_sandbox": Event.REMOVE_POD_SANDBOX,
}
CONTAINER_EVENTS = {
    "post_create_container": Event.POST_CREATE_CONTAINER,
    "start_container": Event.START_CONTAINER,
    "post_start_container": Event.POST_START_CONTAINER,
    "post_update_container": Event.POST_UPDATE_CONTAINER,
    "remove_container": Event.REMOVE_CONTAINER,
}
HANDLED_EVENTS = {"create_container": Event.CREATE_CONTAINER, **POD_EVENTS, **CONTAINER_EVENTS}


class PluginError(Exception):
    """Raised by a plugin handler to answer the request with an error status.

    For CreateContainer this fails the container in containerd (with this message), where
    any other exception would let it start unadjusted.
    """


def event_mask(events: Iterable[int]) -> int:
    """Return NRI's subscription mask: bit ``1 << (event - 1)`` for each event."""
    mask = 0
    for event in events:
        if not Event.UNKNOWN < event < Event.LAST:
            raise ValueError(f"not a subscribable event: {event!r}")
        mask |= 1 << (event - 1)
    return mask


def _handler(plugin: object, name: str) -> Callable[..., Awaitable[Any]] | None:
    fn = getattr(plugin, name, None)
    if fn is None:
        return None
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{type(plugin).__name__}.{name} must be an async method")
    return cast(Callable[..., Awaitable[Any]], fn)


class Encoded:
    """A response already serialized: ttrpc sends ``bytes(response)``, which this returns as is."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __bytes__(self) -> bytes:
        return self.data


class _PluginService(PluginBase):
    """NRI's Plugin service, answered on the stub's behalf (mux conn 1)."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        # Plugins often hand back the same (cached) adjustment object for many containers;
        # protobuf encoding is the costly part of an answer, so encode each object once.
        self._encoded: dict[int, tuple[ContainerAdjustment, Encoded]] = {}

    def _response(self, adjust: ContainerAdjustment) -> Encoded:
        hit = self._encoded.get(id(adjust))
        if hit is not None and hit[0] is adjust:
            return hit[1]
        encoded = Encoded(bytes(CreateContainerResponse(adjust=adjust)))
        if len(self._encoded) >= 256:
            self._encoded.clear()
        self._encoded[id(adjust)] = (adjust, encoded)
        return encoded

    async def _invoke(self, what: str, call: Awaitable[Any]) -> Any:
        """Await a plugin handler: PluginError -> error status; other errors -> None."""
        try:
            return await call
        except PluginError as exc:
            log.warning("%s: plugin refused: %s", what, exc)
            raise ttrpc.TtrpcError(ttrpc.Code.UNKNOWN, str(exc) or "plugin error") from exc
        except Exception:
            log.exception("%s: plugin handler failed; answering with no changes", what)
            return None

    async def configure(self, configure_request: ConfigureRequest) -> ConfigureResponse:
        req = configure_request
        self.stub.runtime = (req.runtime_name, req.runtime_version)
        self.stub.config = req.config
        log.info("configured by %s %s (events 0x%x)", req.runtime_name, req.runtime_version, self.stub.events)
        if fn := _handler(self.stub.plugin, "configure"):
            await self._invoke("Configure", fn(req.config, req.runtime_name, req.runtime_version))
        return ConfigureResponse(events=self.stub.events)

    async def synchronize(self, synchronize_request: SynchronizeRequest) -> SynchronizeResponse:
        req = synchronize_request
        log.info("synchronize: %d pods, %d containers", len(req.pods), len(req.containers))
        if fn := _handler(self.stub.plugin, "synchronize"):
            await self._invoke("Synchronize", fn(list(req.pods), list(req.containers)))
        self.stub.synchronized.set()
        return SynchronizeResponse()

    async def shutdown(self, empty: Empty) -> Empty:
        log.info("runtime is shutting down")
        if fn := _handler(self.stub.plugin, "shutdown"):
            await self._invoke("Shutdown", fn())
        return Empty()

    async def create_container(  # type: ignore[override]  # ttrpc sends bytes(response): Encoded is one
        self, create_container_request: CreateContainerRequest
    ) -> CreateContainerResponse | Encoded:
        req = create_container_request
        adjust: ContainerAdjustment | None = None
        if fn := _handler(self.stub.plugin, "create_container"):
            what = f"CreateContainer {req.pod.namespace}/{req.pod.name}/{req.container.name}"
            adjust = await self._invoke(what, fn(req.pod, req.container))
            if adjust is not None and not isinstance(adjust, ContainerAdjustment):
                log.error("%s: handler returned %s, not a ContainerAdjustment; no changes", what, type(adjust))
                adjust = None
        if adjust is None:
            return CreateContainerResponse(adjust=ContainerAdjustment())
        return self._response(adjust)

    async def state_change(self, state_change_event: StateChangeEvent) -> Empty:
        req = state_change_event
        event = Event(req.event)
        names = {v: k for k, v in HANDLED_EVENTS.items()}
        if (name := names.get(event)) and (fn := _handler(self.stub.plugin, name)):
            call = fn(req.pod) if event in POD_EVENTS.values() else fn(req.pod, req.container)
            await self._invoke(f"StateChange {event.name}", call)
        return Empty()


class Stub:
    """Connects a plugin object to NRI. ``await Stub(plugin, name=..., idx=...).run()``."""

    def __init__(
        self,
        plugin: object,
        *,
        name: str | None = None,
        idx: str | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        backoff: tuple[float, float] = (0.05, 1.0),
        registration_timeout: float = 5.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``name``/``idx`` default to ``NRI_PLUGIN_NAME``/``NRI_PLUGIN_IDX``; ``NRI_PLUGIN_SOCKET``
        (an inherited fd) takes precedence over ``socket_path`` (default ``DEFAULT_SOCKET``)."""
        env = os.environ if env is None else env
        self.plugin = plugin
        self.name = name or env.get(ENV_NAME, "")
        self.idx = idx or env.get(ENV_IDX, "")
        if not self.name:
            raise ValueError("plugin name is empty")
        if not re.fullmatch(r"[0-9]{2}", self.idx):
            raise ValueError(f"plugin index must be exactly two digits, not {self.idx!r}")
        self.fd: int | None = None
        if fd_text := env.get(ENV_SOCKET):
            try:
                self.fd = int(fd_text)
            except ValueError:
                raise ValueError(f"invalid {ENV_SOCKET}={fd_text!r}: not a file descriptor") from None
        self.socket_path = os.fspath(socket_path or DEFAULT_SOCKET)
        self.backoff = backoff
        self.registration_timeout = registration_timeout
        handled = [event for method, event in HANDLED_EVENTS.items() if _handler(plugin, method)]
        for method in ("configure", "synchronize", "shutdown"):
            _handler(plugin, method)  # type check only
        if not handled:
            raise ValueError(f"{type(plugin).__name__} handles no NRI event (and mask 0 would mean all)")
        self.events = event_mask(handled)
        self.runtime: tuple[str, str] | None = None  # (name, version) from the last Configure
        self.config = ""  # config string from the last Configure
        self.connections = 0  # registrations so far
        self.registered = asyncio.Event()  # set while registered, cleared when the connection ends
        self.synchronized = asyncio.Event()  # set after Synchronize, cleared when the connection ends
        self._stopping = asyncio.Event()

    @property
    def full_name(self) -> str:
        """The name containerd registers the plugin under: ``<idx>-<name>``."""
        return f"{self.idx}-{self.name}"

    def stop(self) -> None:
        """Make ``run`` return (closing the connection)."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve NRI until ``stop()``; a pre-launched plugin also returns when its connection ends."""
        if self.fd is not None:
            log.info("%s: using pre-connected socket fd %d", self.full_name, self.fd)
            sock = socket.socket(fileno=self.fd)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            await self.serve(reader, writer)
            return
        first, cap = self.backoff
        delay = first
        reported = ""
        while not self._stopping.is_set():
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as exc:
                if str(exc) != reported:
                    log.info("%s: cannot connect to %s (%s); retrying", self.full_name, self.socket_path, exc)
                    reported = str(exc)
            else:
                reported = ""
                if await self.serve(reader, writer):
                    delay = first
                if not self._stopping.is_set():
                    log.info("%s: connection to %s lost; reconnecting", self.full_name, self.socket_path)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, cap)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Register over an open connection and answer the runtime until it closes.

        Returns whether registration succeeded.
        """
        mux = Mux(reader, writer)
        server = ttrpc.Server(mux.open(PLUGIN_SERVICE_CONN), [_PluginService(self)])
        client = ttrpc.Client(mux.open(RUNTIME_SERVICE_CONN))
        tasks = [asyncio.create_task(mux.run(), name="nri-mux"), asyncio.create_task(server.serve(), name="nri-serve")]
        registered = False
        try:
            request = RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.idx)
            await client.call(RUNTIME_SERVICE, "RegisterPlugin", request, Empty, timeout=self.registration_timeout)
            registered = True
            self.connections += 1
            self.registered.set()
            log.info("%s: registered", self.full_name)
            stopping = asyncio.create_task(self._stopping.wait())
            closed = asyncio.create_task(mux.closed.wait())
            try:
                await asyncio.wait([stopping, closed], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                closed.cancel()
        except (ttrpc.TtrpcError, TimeoutError, ConnectionError) as exc:
            log.warning("%s: registration failed: %s", self.full_name, exc or type(exc).__name__)
        finally:
            self.registered.clear()
            self.synchronized.clear()
            await mux.close()
            await client.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return registered


async def run(
    plugin: object,
    socket_path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    idx: str | None = None,
) -> None:
    """Serve ``plugin`` over NRI until cancelled (see ``Stub``)."""
    await Stub(plugin, name=name, idx=idx, socket_path=socket_path).run()
