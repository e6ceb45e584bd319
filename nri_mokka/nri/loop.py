"""A plain poll(2) loop: file descriptors with callbacks, and timers.

The plugin waits on a handful of descriptors (the NRI socket, the health listener and its
clients, the supervisor's pipe); this is all the event machinery it needs, without asyncio's
tasks, futures and their imports.
"""

from __future__ import annotations

import heapq
import select
import time
from collections.abc import Callable

__all__ = ["ERROR", "READ", "WRITE", "Loop", "Timer"]

READ = select.POLLIN | select.POLLPRI
WRITE = select.POLLOUT
ERROR = select.POLLERR | select.POLLHUP | select.POLLNVAL


class Timer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: Timer) -> bool:
        return self.when < other.when


class Loop:
    """``watch`` descriptors, ``call_later`` timers, ``run`` until ``stop``."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._handlers: dict[int, Callable[[int], None]] = {}
        self._timers: list[Timer] = []
        self._stopped = False

    def watch(self, fd: int, events: int, handler: Callable[[int], None]) -> None:
        """Call ``handler(revents)`` whenever ``fd`` is ready for ``events`` (or failed)."""
        if fd in self._handlers:
            self._poll.modify(fd, events)
        else:
            self._poll.register(fd, events)
        self._handlers[fd] = handler

    def unwatch(self, fd: int) -> None:
        if self._handlers.pop(fd, None) is not None:
            self._poll.unregister(fd)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + delay, callback)
        heapq.heappush(self._timers, timer)
        return timer

    def stop(self) -> None:
        self._stopped = True

    def run(self) -> None:
        """Dispatch until ``stop()`` (also one called before); a callback's exception ends the loop with it."""
        timers = self._timers
        handlers = self._handlers
        poll = self._poll.poll
        try:
            while not self._stopped:
                while timers and timers[0].cancelled:
                    heapq.heappop(timers)
                timeout = None
                if timers:
                    timeout = max(0, int((timers[0].when - time.monotonic()) * 1000 + 0.999))
                for fd, revents in poll(timeout):
                    handler = handlers.get(fd)
                    if handler is not None:
                        handler(revents)
                now = time.monotonic()
                while timers and (timers[0].cancelled or timers[0].when <= now) and not self._stopped:
                    timer = heapq.heappop(timers)
                    if not timer.cancelled:
                        timer.callback()
        finally:
            self._stopped = False
