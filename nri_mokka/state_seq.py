"""The node state's update counter, read straight from the mapped file: has anything changed?

Every update of the live state (a MIG instance created through NVML, a metric rewritten)
publishes through the state's latch and moves its ``seq`` counter (native/mokka_state.h,
native/common/latch.h). Asking NVML for the MIG layout walks every GPU (tens of microseconds
per GPU); reading the counter is one load from a mapped page. The plugin asks NVML again only
when the counter moved.

The header's layout is the C header's: the offsets below are checked against it (through
cffi, at test time: tests/test_mig_nri.py); the plugin process itself loads no cffi.
"""

from __future__ import annotations

import mmap
import os
import struct

__all__ = ["SEQ_OFFSET", "StateSeq"]

STATE_MAGIC = 0x41544B4F4B4B4F4D  # MOKKA_STATE_MAGIC: a state file starts with it
TRAILER_MAGIC = 0x4C5254414B4B4F4D  # MOKKA_TRAILER_MAGIC: a library carrying the state ends with a trailer
TRAILER = struct.Struct("=QQQ")  # mokka_trailer_t: state_offset, state_size, magic
SEQ_OFFSET = 28  # offsetof(mokka_header_t, seq)
SEQ = struct.Struct("=I")


class StateSeq:
    """``StateSeq(path).read()``: the latch counter of the state in ``path`` (a state file or a
    library carrying one)."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            offset = 0
            if size < 8 or int.from_bytes(os.pread(fd, 8, 0), "little") != STATE_MAGIC:
                if size < TRAILER.size:
                    raise ValueError(f"{path}: no state")
                state_offset, _, magic = TRAILER.unpack(os.pread(fd, TRAILER.size, size - TRAILER.size))
                if magic != TRAILER_MAGIC or state_offset + SEQ_OFFSET + SEQ.size > size:
                    raise ValueError(f"{path}: no state")
                offset = state_offset
            self._map = mmap.mmap(fd, SEQ_OFFSET + SEQ.size, mmap.MAP_SHARED, mmap.PROT_READ, offset=offset)
        finally:
            os.close(fd)

    def read(self) -> int:
        return int(SEQ.unpack_from(self._map, SEQ_OFFSET)[0])

    def close(self) -> None:
        self._map.close()
