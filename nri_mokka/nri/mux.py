"""NRI's connection multiplexer: several byte streams over one unix socket (the trunk).

Every frame is ``u32 conn_id | u32 payload_len | payload``, big-endian, with
``payload_len <= 1 << 24``. Conn 0 is reserved; on conn 1 the plugin serves NRI's
``Plugin`` service, on conn 2 the runtime serves ``Runtime``. Frames for connections
nobody opened are dropped.

Frame boundaries carry no meaning: each connection is a byte stream, and the ttrpc
messages inside it may be split over frames anywhere. The Go peer reads each frame into
a 4096-byte buffer and loses larger frames, so outgoing data is cut into frames of at
most ``MAX_FRAME_PAYLOAD`` bytes.

Pure functions only; ``stub`` runs them over the socket.
"""

from __future__ import annotations

import struct

__all__ = [
    "MAX_FRAME_PAYLOAD",
    "MAX_PAYLOAD",
    "PLUGIN_SERVICE_CONN",
    "RUNTIME_SERVICE_CONN",
    "FrameDecoder",
    "MuxError",
    "encode_frames",
]

HEADER = struct.Struct(">II")
MAX_PAYLOAD = 1 << 24  # the largest payload a frame may announce
MAX_FRAME_PAYLOAD = 4096  # the largest payload Mokka sends in one frame
RESERVED_CONN = 0
PLUGIN_SERVICE_CONN = 1  # runtime is the ttrpc client, plugin serves nri...Plugin
RUNTIME_SERVICE_CONN = 2  # plugin is the ttrpc client, runtime serves nri...Runtime


class MuxError(Exception):
    """The trunk carried something that is not a valid frame stream."""


def encode_frames(conn_id: int, data: bytes, max_payload: int = MAX_FRAME_PAYLOAD) -> bytes:
    """``data`` for ``conn_id`` as consecutive frames of at most ``max_payload`` payload bytes.

    Empty ``data`` gives no frame (an empty frame carries nothing on a byte stream).
    """
    if not 0 < conn_id <= 0xFFFFFFFF:
        raise ValueError(f"invalid mux conn id {conn_id}")
    if not 0 < max_payload <= MAX_PAYLOAD:
        raise ValueError(f"invalid frame payload limit {max_payload}")
    size = len(data)
    if size <= max_payload:  # the common case: one frame
        return HEADER.pack(conn_id, size) + data if size else b""
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    for i in range(0, size, max_payload):
        chunk = view[i : i + max_payload]
        parts.append(HEADER.pack(conn_id, len(chunk)))
        parts.append(chunk)
    return b"".join(parts)


class FrameDecoder:
    """Split a trunk byte stream, fed in arbitrary pieces, into ``(conn_id, payload)`` frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add ``data``; return every frame now complete, in order."""
        buf = self._buf
        buf += data
        frames = []
        pos = 0
        size = len(buf)
        view = memoryview(buf)
        try:
            while size - pos >= 8:
                conn_id, length = HEADER.unpack_from(view, pos)
                if length > MAX_PAYLOAD:
                    raise MuxError(f"frame for conn {conn_id} announces {length} bytes (limit {MAX_PAYLOAD})")
                end = pos + 8 + length
                if end > size:
                    break
                frames.append((conn_id, bytes(view[pos + 8 : end])))
                pos = end
        finally:
            view.release()  # a bytearray with a view cannot be resized
        if pos:
            del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        """Bytes held back, waiting for the rest of their frame."""
        return len(self._buf)
