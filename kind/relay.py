"""A TCP relay from the host's loopback into another network namespace: how a program on the host
(the kubernetes client, helm, kubectl) reaches the API server of a kind cluster whose nodes live in
:class:`kind.provider.KindEnvironment`'s private network namespace, without a route, a link or a
firewall rule in the host's.

A dialer thread enters the private namespace (``setns(2)`` moves only the calling thread; a socket
keeps the namespace it was made in), makes the upstream connections there and hands them to the
host side, which listens on ``127.0.0.1`` and copies bytes both ways. TLS passes through untouched:
kind's API server certificate names ``127.0.0.1``, which is where the relay listens too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import queue
import socket
import threading
from pathlib import Path

__all__ = ["Relay", "RelayError"]

CLONE_NEWNET = 0x40000000
CHUNK = 65536


class RelayError(RuntimeError):
    """The relay could not enter the namespace or reach its target (one line)."""


class Relay:
    """``127.0.0.1:<port>`` on the host relayed to ``host:target`` in the namespace at ``netns``."""

    def __init__(self, netns: Path, target: int, host: str = "127.0.0.1") -> None:
        self.netns = netns
        self.target = (host, target)
        self.port = 0
        self._listener: socket.socket | None = None
        self._dials: queue.Queue[queue.Queue[socket.socket | OSError] | None] = queue.Queue()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def start(self) -> int:
        """Enter the namespace (in the dialer thread), listen on the host; the host port."""
        entered: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._dialer, args=(entered,), name="relay-dialer", daemon=True).start()
        why = entered.get(timeout=10)
        if why:
            raise RelayError(f"cannot enter the network namespace {self.netns}: {why}")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self._listener = listener
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()
        return self.port

    def close(self) -> None:
        """Stop listening, end every relayed connection and the dialer."""
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        self._dials.put(None)
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    # ---- threads ---------------------------------------------------------------------------

    def _dialer(self, entered: queue.Queue[str]) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        try:
            fd = os.open(self.netns, os.O_RDONLY)
        except OSError as exc:
            entered.put(exc.strerror or str(exc))
            return
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                entered.put(os.strerror(ctypes.get_errno()))
                return
        finally:
            os.close(fd)
        entered.put("")
        while (reply := self._dials.get()) is not None:
            try:
                reply.put(socket.create_connection(self.target, timeout=10))
            except OSError as exc:
                reply.put(exc)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            reply: queue.Queue[socket.socket | OSError] = queue.Queue()
            self._dials.put(reply)
            upstream = reply.get()
            if isinstance(upstream, OSError):
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            done = threading.Semaphore(0)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, done), name="relay-pump", daemon=True).start()
            threading.Thread(target=self._end, args=(client, upstream, done), name="relay-end", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        done.release()

    def _end(self, a: socket.socket, b: socket.socket, done: threading.Semaphore) -> None:
        """Close a connection's two sockets once both directions have ended."""
        done.acquire()
        done.acquire()
        with self._lock:
            self._open -= {a, b}
        a.close()
        b.close()
