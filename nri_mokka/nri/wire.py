"""Protocol buffers on the wire, field by field, without message objects.

The project's messages are betterproto classes (``_pb/``), generated from ``proto/``. The
plugin's hot path does not build them: it reads the few fields a decision needs straight
from a request's raw bytes and answers with bytes encoded once. This module is that
reading and the little writing the transport needs before betterproto is imported (the
ttrpc envelope, registration): varints and length-delimited fields, nothing else.
``tests/test_nri_wire.py`` checks it against betterproto and the official protos.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "LEN",
    "VARINT",
    "WireError",
    "encode_bytes",
    "encode_varint",
    "encode_varint_field",
    "fields",
    "first",
    "read_varint",
]

VARINT = 0
I64 = 1
LEN = 2
I32 = 5


class WireError(ValueError):
    """The bytes are not a valid protobuf encoding."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    byte = data[pos]  # IndexError for a truncated buffer: callers turn it into WireError
    if byte < 0x80:
        return byte, pos + 1
    result = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def fields(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(number, wire type, a, b)`` for each field of the message in ``data[start:end]``.

    For length-delimited fields ``data[a:b]`` is the value; for varints ``a`` is the value
    and ``b`` 0; fixed-width fields give their byte range. Nothing is copied or decoded.
    """
    pos = start
    stop = len(data) if end is None else end
    try:
        while pos < stop:
            key, pos = read_varint(data, pos)
            kind = key & 7
            if kind == LEN:
                size, pos = read_varint(data, pos)
                if pos + size > stop:
                    raise WireError(f"field {key >> 3} runs past the end of its message")
                yield key >> 3, LEN, pos, pos + size
                pos += size
            elif kind == VARINT:
                value, pos = read_varint(data, pos)
                yield key >> 3, VARINT, value, 0
            elif kind == I64:
                yield key >> 3, I64, pos, pos + 8
                pos += 8
            elif kind == I32:
                yield key >> 3, I32, pos, pos + 4
                pos += 4
            else:
                raise WireError(f"unsupported wire type {kind} (field {key >> 3})")
    except IndexError:
        raise WireError("truncated message") from None
    if pos != stop:
        raise WireError("truncated message")


def first(data: bytes, number: int, start: int = 0, end: int | None = None) -> tuple[int, int] | None:
    """The byte range of the first length-delimited field ``number``, or None."""
    for n, kind, a, b in fields(data, start, end):
        if n == number and kind == LEN:
            return a, b
    return None


def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64 negatives are ten-byte two's complement
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_bytes(number: int, value: bytes) -> bytes:
    """A length-delimited field (string, bytes, message); proto3 omits an empty one."""
    if not value:
        return b""
    return encode_varint(number << 3 | LEN) + encode_varint(len(value)) + value


def encode_varint_field(number: int, value: int) -> bytes:
    """A varint field (int32, int64, enum, bool); proto3 omits zero."""
    if not value:
        return b""
    return encode_varint(number << 3 | VARINT) + encode_varint(value)
