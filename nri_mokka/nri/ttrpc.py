"""ttrpc, containerd's small RPC protocol: message framing and the request/response envelope.

A message is ``u32 length | u32 stream_id | u8 type | u8 flags | payload`` (big-endian; the
length counts the payload only, at most 4 MiB). A unary call is a request (type 1, flags 0)
carrying a ``ttrpc.Request`` envelope; the answer is a response (type 2) with the same stream
id carrying a ``ttrpc.Response``: a ``google.rpc.Status``-shaped status (absent or code 0 when
the call succeeded) and the reply's bytes. Clients number their calls with odd stream ids,
from 1 and +2 per call; a server refuses even or non-increasing ids, as ttrpc's Go server does.

Pure functions; the envelopes are read and written field by field (``wire``) so the
transport needs no message classes. ``stub`` runs this over the mux. Streaming calls are
not supported (NRI uses none).
"""

from __future__ import annotations

import struct

from nri_mokka.nri import wire

__all__ = [
    "CODE_NAMES",
    "FLAG_NO_DATA",
    "FLAG_REMOTE_CLOSED",
    "FLAG_REMOTE_OPEN",
    "MAX_MESSAGE",
    "Code",
    "Message",
    "MessageDecoder",
    "MessageType",
    "ProtocolError",
    "Request",
    "TtrpcError",
    "decode_request",
    "decode_response",
    "encode_message",
    "encode_request",
    "encode_response",
]

HEADER = struct.Struct(">IIBB")
MAX_MESSAGE = 4 << 20
FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4


class Code:
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


CODE_NAMES = {v: k for k, v in vars(Code).items() if k.isupper()}


class MessageType:
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class ProtocolError(Exception):
    """The peer sent something that is not a ttrpc message stream."""


class TtrpcError(Exception):
    """A call answered with a non-OK status; a server handler may raise it to send one."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        self.message = message
        name = CODE_NAMES.get(self.code, str(self.code))
        super().__init__(f"ttrpc error {name}: {message}" if message else f"ttrpc error {name}")


class Message:
    """One ttrpc message."""

    __slots__ = ("flags", "payload", "stream_id", "type")

    def __init__(self, stream_id: int, type_: int, flags: int, payload: bytes) -> None:
        self.stream_id = stream_id
        self.type = type_
        self.flags = flags
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and (self.stream_id, self.type, self.flags, self.payload) == (
            other.stream_id,
            other.type,
            other.flags,
            other.payload,
        )

    def __hash__(self) -> int:
        return hash((self.stream_id, self.type, self.flags, self.payload))

    def __repr__(self) -> str:
        return f"Message(stream_id={self.stream_id}, type={self.type}, flags={self.flags}, {len(self.payload)} bytes)"


def encode_message(stream_id: int, type_: int, flags: int, payload: bytes) -> bytes:
    """Return one framed ttrpc message."""
    if len(payload) > MAX_MESSAGE:
        raise ValueError(f"ttrpc message of {len(payload)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class MessageDecoder:
    """Split a byte stream, fed in arbitrary pieces, into ttrpc messages.

    A large message (Synchronize on a busy node: megabytes) arrives in many pieces; they are
    collected as they come and joined once, so reassembly is linear in its size.
    """

    __slots__ = ("_buf", "_collected", "_parts", "_want")

    def __init__(self) -> None:
        self._buf = bytearray()  # the start of the stream: header(s) and small messages
        self._parts: list[bytes] = []  # pieces of the one large message being collected
        self._collected = 0  # their size
        self._want = 0  # bytes still missing from that message

    @property
    def pending(self) -> int:
        """Bytes held back, waiting for the rest of their message."""
        return len(self._buf) + self._collected

    def feed(self, data: bytes) -> list[Message]:
        if self._want:
            if len(data) < self._want:
                self._parts.append(data)
                self._collected += len(data)
                self._want -= len(data)
                return []
            self._parts.append(data[: self._want])
            data = data[self._want :]
            self._want = self._collected = 0
            whole = memoryview(b"".join(self._parts))
            self._parts = []
            _, stream_id, type_, flags = HEADER.unpack_from(whole)
            out = [Message(stream_id, type_, flags, bytes(whole[10:]))]
            if data:
                out += self.feed(data)
            return out
        buf = self._buf
        buf += data
        out = []
        pos = 0
        size = len(buf)
        while size - pos >= 10:
            length, stream_id, type_, flags = HEADER.unpack_from(buf, pos)
            if length > MAX_MESSAGE:
                raise ProtocolError(f"stream {stream_id}: message of {length} bytes exceeds {MAX_MESSAGE}")
            end = pos + 10 + length
            if end > size:
                if length > 65536:  # large: collect the rest piece by piece
                    self._parts = [bytes(buf[pos:])]
                    self._collected = size - pos
                    self._want = end - size
                    pos = size
                break
            out.append(Message(stream_id, type_, flags, bytes(buf[pos + 10 : end])))
            pos = end
        if pos:
            del buf[:pos]
        return out


class Request:
    """A ``ttrpc.Request`` envelope: which method, and the argument's raw bytes."""

    __slots__ = ("method", "payload", "service", "timeout_nano")

    def __init__(self, service: str, method: str, payload: bytes, timeout_nano: int = 0) -> None:
        self.service = service
        self.method = method
        self.payload = payload
        self.timeout_nano = timeout_nano


# ttrpc.Request: 1 service, 2 method, 3 payload, 4 timeout_nano, 5 metadata.
# ttrpc.Response: 1 status (google.rpc.Status: 1 code, 2 message, 3 details), 2 payload.


def decode_request(data: bytes) -> Request:
    """Read a ``ttrpc.Request`` envelope (metadata is skipped); raise ``wire.WireError`` if malformed."""
    service = method = ""
    payload = b""
    timeout = 0
    for number, kind, a, b in wire.fields(data):
        if kind == wire.LEN:
            if number == 3:
                payload = data[a:b]
            elif number == 2:
                method = data[a:b].decode()
            elif number == 1:
                service = data[a:b].decode()
        elif number == 4 and kind == wire.VARINT:
            timeout = a - (1 << 64) if a >= 1 << 63 else a
    return Request(service, method, payload, timeout)


def encode_request(service: str, method: str, payload: bytes, timeout_nano: int = 0) -> bytes:
    return (
        wire.encode_bytes(1, service.encode())
        + wire.encode_bytes(2, method.encode())
        + wire.encode_bytes(3, payload)
        + wire.encode_varint_field(4, timeout_nano)
    )


def encode_response(payload: bytes = b"", code: int = Code.OK, message: str = "") -> bytes:
    """Return a ``ttrpc.Response`` envelope: OK with ``payload``, or an error status."""
    if code == Code.OK:
        return wire.encode_bytes(2, payload)
    status = wire.encode_varint_field(1, int(code)) + wire.encode_bytes(2, message.encode())
    # An error status is always written, even where it encodes to nothing.
    return (
        wire.encode_varint(1 << 3 | wire.LEN) + wire.encode_varint(len(status)) + status + wire.encode_bytes(2, payload)
    )


def decode_response(data: bytes) -> bytes:
    """Return the payload of a ``ttrpc.Response``; raise ``TtrpcError`` for a non-OK status."""
    code = 0
    message = ""
    payload = b""
    for number, kind, a, b in wire.fields(data):
        if number == 2 and kind == wire.LEN:
            payload = data[a:b]
        elif number == 1 and kind == wire.LEN:
            for n, k, x, y in wire.fields(data, a, b):
                if n == 1 and k == wire.VARINT:
                    code = x - (1 << 64) if x >= 1 << 63 else x
                elif n == 2 and k == wire.LEN:
                    message = data[x:y].decode(errors="replace")
    if code != Code.OK:
        raise TtrpcError(code, message)
    return payload
