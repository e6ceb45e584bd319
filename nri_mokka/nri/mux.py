"""NRI's connection multiplexer: several byte streams over one unix socket (the trunk).

Every frame is ``u32 conn_id | u32 payload_len | payload``, big-endian, with
``payload_len <= 1 << 24``. Conn 0 is reserved; on conn 1 the plugin serves NRI's
``Plugin`` service, on conn 2 the runtime serves ``Runtime``. Frames for connections
nobody opened are dropped.

Frame boundaries carry no meaning: each connection is a byte stream, and the ttrpc
messages inside it may be split over frames anywhere. The Go peer reads each frame into
a 4096-byte buffer and loses larger frames, so outgoing data is cut into frames of at
most ``MAX_FRAME_PAYLOAD`` bytes.

``encode_frames`` and ``FrameDecoder`` are pure; ``Mux`` runs them over an asyncio stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct

__all__ = [
    "MAX_FRAME_PAYLOAD",
    "MAX_PAYLOAD",
    "PLUGIN_SERVICE_CONN",
    "RUNTIME_SERVICE_CONN",
    "FrameDecoder",
    "Mux",
    "MuxConn",
    "MuxError",
    "encode_frames",
]

log = logging.getLogger(__name__)

HEADER = struct.Struct(">II")
MAX_PAYLOAD = 1 << 24  # the largest payload a frame may announce
MAX_FRAME_PAYLOAD = 4096  # the largest payload Mokka sends in one frame
RESERVED_CONN = 0
PLUGIN_SERVICE_CONN = 1  # runtime is the ttrpc client, plugin serves nri...Plugin
RUNTIME_SERVICE_CONN = 2  # plugin is the ttrpc client, runtime serves nri...Runtime


class MuxError(Exception):
    """The trunk carried something that is not a valid frame stream."""


def encode_frames(conn_id: int, data: bytes, max_payload: int = MAX_FRAME_PAYLOAD) -> list[bytes]:
    """Return ``data`` for ``conn_id`` as frames of at most ``max_payload`` payload bytes.

    Empty ``data`` gives no frame (an empty frame carries nothing on a byte stream).
    """
    if not 0 < conn_id <= 0xFFFFFFFF:
        raise ValueError(f"invalid mux conn id {conn_id}")
    if not 0 < max_payload <= MAX_PAYLOAD:
        raise ValueError(f"invalid frame payload limit {max_payload}")
    view = memoryview(data)
    return [
        HEADER.pack(conn_id, len(chunk)) + bytes(chunk)
        for chunk in (view[i : i + max_payload] for i in range(0, len(view), max_payload))
    ]


class FrameDecoder:
    """Split a trunk byte stream, fed in arbitrary pieces, into ``(conn_id, payload)`` frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add ``data``; return every frame now complete, in order."""
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            conn_id, length = HEADER.unpack_from(self._buf)
            if length > MAX_PAYLOAD:
                raise MuxError(f"frame for conn {conn_id} announces {length} bytes (limit {MAX_PAYLOAD})")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append((conn_id, bytes(self._buf[HEADER.size : end])))
            del self._buf[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes held back, waiting for the rest of their frame."""
        return len(self._buf)


class MuxConn:
    """One multiplexed connection: a byte stream in each direction."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self.mux = mux
        self.conn_id = conn_id
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._closed = False

    async def read(self) -> bytes:
        """Return the next piece of incoming data; ``b""`` once the trunk is closed."""
        if self._closed and self._chunks.empty():
            return b""
        chunk = await self._chunks.get()
        if not chunk:
            self._closed = True
            self._chunks.put_nowait(b"")  # every later read sees the end too
        return chunk

    async def write(self, data: bytes) -> None:
        """Send ``data`` (split into frames of at most ``MAX_FRAME_PAYLOAD`` payload bytes)."""
        await self.mux.send(self.conn_id, data)

    def _deliver(self, data: bytes) -> None:
        if data and not self._closed:
            self._chunks.put_nowait(data)

    def _close(self) -> None:
        self._chunks.put_nowait(b"")


class Mux:
    """Frames over one asyncio stream pair. ``run()`` reads until the trunk closes."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame_payload: int = MAX_FRAME_PAYLOAD,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max = max_frame_payload
        self._conns: dict[int, MuxConn] = {}
        self._decoder = FrameDecoder()
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()

    def open(self, conn_id: int) -> MuxConn:
        """Return the connection ``conn_id`` (created on first use)."""
        if conn_id == RESERVED_CONN:
            raise ValueError("mux conn 0 is reserved")
        if conn_id not in self._conns:
            self._conns[conn_id] = conn = MuxConn(self, conn_id)
            if self.closed.is_set():
                conn._close()
        return self._conns[conn_id]

    async def send(self, conn_id: int, data: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionResetError("mux trunk closed")
        frames = encode_frames(conn_id, data, self._max)
        async with self._write_lock:  # keep one message's frames together and in order
            self._writer.write(b"".join(frames))
            await self._writer.drain()

    async def run(self) -> None:
        """Read frames and hand each to its connection until EOF or a broken trunk."""
        try:
            while data := await self._reader.read(65536):
                for conn_id, payload in self._decoder.feed(data):
                    if conn := self._conns.get(conn_id):
                        conn._deliver(payload)
                    else:
                        log.debug("dropping %d bytes for unknown mux conn %d", len(payload), conn_id)
        except (ConnectionError, MuxError) as exc:
            log.info("mux trunk failed: %s", exc)
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the trunk; every connection's reader sees EOF."""
        if self.closed.is_set():
            return
        self.closed.set()
        for conn in self._conns.values():
            conn._close()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
