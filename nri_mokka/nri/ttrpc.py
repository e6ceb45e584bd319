"""ttrpc, containerd's small RPC protocol, over one byte stream (a mux connection).

A message is ``u32 length | u32 stream_id | u8 type | u8 flags | payload`` (big-endian; the
length counts the payload only, at most 4 MiB). A unary call is a request (type 1, flags 0)
carrying a ``ttrpc.Request`` envelope; the answer is a response (type 2) with the same stream
id carrying a ``ttrpc.Response``: a ``google.rpc.Status``-shaped status (absent or code 0 when
the call succeeded) and the reply's bytes. Clients number their calls with odd stream ids,
from 1 and +2 per call; a server refuses even or non-increasing ids, as ttrpc's Go server does.

``encode_message``/``MessageDecoder`` are pure. ``Client`` makes unary calls; ``Server`` answers
them with the handlers of betterproto-generated service classes (``...Base``), looked up by
service and method name. Streaming calls are not supported (NRI uses none).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import betterproto
import grpclib
import grpclib.const

from nri_mokka.nri._pb import ttrpc as pb
from nri_mokka.nri.mux import MuxConn

__all__ = [
    "FLAG_NO_DATA",
    "FLAG_REMOTE_CLOSED",
    "FLAG_REMOTE_OPEN",
    "MAX_MESSAGE",
    "Client",
    "Code",
    "Message",
    "MessageDecoder",
    "MessageType",
    "ProtocolError",
    "Servable",
    "Server",
    "TtrpcError",
    "decode_response",
    "encode_message",
    "encode_response",
]

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
MAX_MESSAGE = 4 << 20
FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4


class Code(enum.IntEnum):
    """gRPC status codes, as ttrpc carries them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


M = TypeVar("M", bound=betterproto.Message)


class Servable(Protocol):
    """A betterproto-generated service base (``...Base``): its path -> handler table."""

    def __mapping__(self) -> Mapping[str, grpclib.const.Handler]: ...


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class ProtocolError(Exception):
    """The peer sent something that is not a ttrpc message stream."""


class TtrpcError(Exception):
    """A call answered with a non-OK status; a server handler may raise it to send one."""

    def __init__(self, code: Code | int, message: str = "") -> None:
        try:
            self.code: Code | int = Code(code)
        except ValueError:
            self.code = code
        self.message = message
        name = self.code.name if isinstance(self.code, Code) else str(self.code)
        super().__init__(f"ttrpc error {name}: {message}" if message else f"ttrpc error {name}")


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes


def encode_message(stream_id: int, type_: int, flags: int, payload: bytes) -> bytes:
    """Return one framed ttrpc message."""
    if len(payload) > MAX_MESSAGE:
        raise ValueError(f"ttrpc message of {len(payload)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class MessageDecoder:
    """Split a byte stream, fed in arbitrary pieces, into ttrpc messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            length, stream_id, type_, flags = HEADER.unpack_from(self._buf)
            if length > MAX_MESSAGE:
                raise ProtocolError(f"stream {stream_id}: message of {length} bytes exceeds {MAX_MESSAGE}")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            out.append(Message(stream_id, type_, flags, bytes(self._buf[HEADER.size : end])))
            del self._buf[:end]
        return out


def encode_response(payload: bytes = b"", code: Code | int = Code.OK, message: str = "") -> bytes:
    """Return a ``ttrpc.Response`` envelope: OK with ``payload``, or an error status."""
    if int(code) == Code.OK:
        return bytes(pb.Response(payload=payload))
    return bytes(pb.Response(status=pb.Status(code=int(code), message=message), payload=payload))


def decode_response(data: bytes) -> bytes:
    """Return the payload of a ``ttrpc.Response``; raise ``TtrpcError`` for a non-OK status."""
    resp = pb.Response().parse(data)
    if resp.status.code != Code.OK:
        raise TtrpcError(resp.status.code, resp.status.message)
    return resp.payload


class Client:
    """Unary ttrpc calls over one connection (odd, increasing stream ids)."""

    def __init__(self, conn: MuxConn) -> None:
        self._conn = conn
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._decoder = MessageDecoder()
        self._reader: asyncio.Task[None] | None = None
        self._closed: BaseException | None = None

    def _ensure_reader(self) -> None:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_loop(), name=f"ttrpc-client-{self._conn.conn_id}")

    async def call(
        self,
        service: str,
        method: str,
        request: betterproto.Message,
        response_type: type[M],
        *,
        timeout: float | None = None,
    ) -> M:
        """Call ``service/method``; return the decoded reply or raise ``TtrpcError``.

        ``timeout`` bounds the wait (``TimeoutError``) and is sent as the request's deadline.
        A closed connection raises ``ConnectionResetError``.
        """
        if self._closed is not None:
            raise ConnectionResetError(f"ttrpc connection closed: {self._closed}")
        self._ensure_reader()
        stream_id = self._next_id
        self._next_id += 2
        envelope = pb.Request(service=service, method=method, payload=bytes(request))
        if timeout is not None:
            envelope.timeout_nano = int(timeout * 1e9)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            await self._conn.write(encode_message(stream_id, MessageType.REQUEST, 0, bytes(envelope)))
            reply = await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(stream_id, None)
        return response_type().parse(decode_response(reply.payload))

    async def _read_loop(self) -> None:
        reason: BaseException = EOFError("end of stream")
        try:
            while chunk := await self._conn.read():
                for msg in self._decoder.feed(chunk):
                    future = self._pending.get(msg.stream_id)
                    if msg.type != MessageType.RESPONSE or future is None or future.done():
                        log.debug("ttrpc client: ignoring %s for stream %d", msg.type, msg.stream_id)
                        continue
                    future.set_result(msg)
        except ProtocolError as exc:
            reason = exc
            log.warning("ttrpc client: %s", exc)
        finally:
            self._closed = reason
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionResetError(f"ttrpc connection closed: {reason}"))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class _UnaryStream:
    """What a betterproto-generated ``__rpc_*`` handler needs of a grpclib stream."""

    def __init__(self, request: betterproto.Message) -> None:
        self.request = request
        self.response: betterproto.Message | None = None

    async def recv_message(self) -> betterproto.Message:
        return self.request

    async def send_message(self, message: betterproto.Message, **_: Any) -> None:
        self.response = message


class Server:
    """Answers unary ttrpc calls on one connection with betterproto service handlers.

    Each service (a generated ``...Base`` subclass) maps ``/package.Service/Method`` to a handler; a request for
    another service or method gets UNIMPLEMENTED, as from ttrpc's Go server. A handler
    raising ``TtrpcError`` or ``grpclib.GRPCError`` sends that status; any other exception
    sends UNKNOWN with the exception's text.
    """

    def __init__(self, conn: MuxConn, services: Iterable[Servable]) -> None:
        self._conn = conn
        self._handlers: dict[tuple[str, str], grpclib.const.Handler] = {}
        self._services: set[str] = set()
        for svc in services:
            for path, handler in svc.__mapping__().items():
                _, service, method = path.split("/")
                self._handlers[service, method] = handler
                self._services.add(service)
        self._last_stream_id = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        """Answer requests until the connection ends; then cancel calls still running."""
        decoder = MessageDecoder()
        try:
            while chunk := await self._conn.read():
                for msg in decoder.feed(chunk):
                    await self._receive(msg)
        except ProtocolError as exc:
            log.warning("ttrpc server: %s", exc)
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _receive(self, msg: Message) -> None:
        if msg.stream_id % 2 != 1:
            await self._reply(msg.stream_id, Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
        elif msg.type == MessageType.DATA:
            await self._reply(msg.stream_id, Code.INVALID_ARGUMENT, "StreamID is no longer active")
        elif msg.type == MessageType.REQUEST:
            if msg.stream_id <= self._last_stream_id:
                await self._reply(msg.stream_id, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
                return
            self._last_stream_id = msg.stream_id
            task = asyncio.create_task(self._call(msg), name=f"ttrpc-call-{msg.stream_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            log.debug("ttrpc server: ignoring message type %d on stream %d", msg.type, msg.stream_id)

    async def _reply(self, stream_id: int, code: Code | int, message: str = "", payload: bytes = b"") -> None:
        data = encode_message(stream_id, MessageType.RESPONSE, 0, encode_response(payload, code, message))
        try:
            await self._conn.write(data)
        except ConnectionError as exc:
            log.info("ttrpc server: cannot answer stream %d: %s", stream_id, exc)

    async def _call(self, msg: Message) -> None:
        try:
            request = pb.Request().parse(msg.payload)
        except Exception as exc:
            await self._reply(msg.stream_id, Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "ttrpc server: stream %d: %s/%s, %d bytes",
                msg.stream_id,
                request.service,
                request.method,
                len(request.payload),
            )
        handler = self._handlers.get((request.service, request.method))
        if handler is None:
            what = f"method {request.method}" if request.service in self._services else f"service {request.service}"
            await self._reply(msg.stream_id, Code.UNIMPLEMENTED, what)
            return
        try:
            argument = handler.request_type().parse(request.payload)
        except Exception as exc:
            await self._reply(msg.stream_id, Code.INTERNAL, f"ttrpc: error unmarshalling payload: {exc}")
            return
        stream = _UnaryStream(argument)
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        try:
            async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                await handler.func(cast(Any, stream))
        except TimeoutError:
            await self._reply(msg.stream_id, Code.DEADLINE_EXCEEDED, "handler exceeded the request's deadline")
            return
        except TtrpcError as exc:
            await self._reply(msg.stream_id, exc.code, exc.message)
            return
        except grpclib.GRPCError as exc:
            await self._reply(msg.stream_id, exc.status.value, exc.message or "")
            return
        except Exception as exc:
            log.exception("ttrpc server: %s/%s failed", request.service, request.method)
            await self._reply(msg.stream_id, Code.UNKNOWN, str(exc) or type(exc).__name__)
            return
        response = stream.response if stream.response is not None else handler.reply_type()
        await self._reply(msg.stream_id, Code.OK, payload=bytes(response))
