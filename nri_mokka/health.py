"""/healthz and /readyz over plain HTTP/1.1, served from the plugin's poll loop.

/healthz: the process answers (200) with its figures; /readyz: 200 once registered with the
runtime and a node layout is loaded, else 503. The listening socket may be inherited (the
supervisor binds it once, so a replaced plugin process answers on the same port at once).
"""

from __future__ import annotations

import os
import socket

from nri_mokka.nri import loop as poll_loop
from nri_mokka.nri.stub import Stub
from nri_mokka.plugin import MokkaPlugin

__all__ = ["Health", "listen"]

REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}
CLIENT_TIMEOUT = 5.0


def listen(address: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT`` (``:PORT`` for every address)."""
    host, _, port = address.rpartition(":")
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"--health-addr {address!r}: expected HOST:PORT") from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]") or "0.0.0.0", port_number))
    except OSError as exc:
        sock.close()
        raise ValueError(f"--health-addr {address!r}: {exc.strerror}") from None
    sock.listen(16)
    return sock


class Health:
    def __init__(self, stub: Stub, plugin: MokkaPlugin, listener: socket.socket) -> None:
        self.stub = stub
        self.plugin = plugin
        self.listener = listener
        listener.setblocking(False)
        self._clients: dict[int, tuple[socket.socket, bytearray, poll_loop.Timer]] = {}
        stub.loop.watch(listener.fileno(), poll_loop.READ, self._accept)

    def status(self, path: str) -> tuple[int, dict[str, object]]:
        stub = self.stub
        body: dict[str, object] = {
            "pid": os.getpid(),
            "registered": stub.registered,
            "synchronized": stub.synchronized,
            "registrations": stub.connections,
            "started_at": stub.started_at,  # time.monotonic() values: comparable on this host
            "registered_at": stub.registered_at,
            "ready_at": stub.ready_at,
            "sync_ms": round(stub.sync_seconds * 1000, 3),
            "sync_receive_ms": round(stub.sync_receive_seconds * 1000, 3),
            "sync_bytes": stub.sync_bytes,
            "layout": self.plugin.answers is not None,
            "gpus": self.plugin.layout_gpus,
            "warm": self.plugin.warm,
            "decisions": stub.decisions,
        }
        if times := stub.recent_handling():
            recent = sorted(times)
            first = stub.decisions - len(times)  # the number of the oldest one kept
            slowest = sorted(range(len(times)), key=times.__getitem__)[-5:]
            body["handling_ms"] = {
                "median": round(recent[len(recent) // 2] * 1000, 3),
                "p99": round(recent[min(len(recent) - 1, int(len(recent) * 0.99))] * 1000, 3),
                "max": round(recent[-1] * 1000, 3),
                "samples": len(recent),
                "slowest": [[first + i + 1, round(times[i] * 1000, 3)] for i in reversed(slowest)],  # [n, ms]
            }
        if path == "/healthz":
            return 200, body
        if path == "/readyz":
            ready = stub.registered and self.plugin.answers is not None
            return (200 if ready else 503), body
        return 404, {"error": f"no such endpoint {path}"}

    def _accept(self, revents: int) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:  # another process took it, or the client gave up
            return
        client.setblocking(False)
        fd = client.fileno()
        timer = self.stub.loop.call_later(CLIENT_TIMEOUT, lambda: self._drop(fd))
        self._clients[fd] = (client, bytearray(), timer)
        self.stub.loop.watch(fd, poll_loop.READ, lambda ev: self._read(fd))

    def _read(self, fd: int) -> None:
        client, buf, _ = self._clients[fd]
        try:
            data = client.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buf += data
        if b"\r\n\r\n" in buf or b"\n\n" in buf or not data or len(buf) > 16384:
            parts = buf.split(None, 2)
            path = parts[1].decode(errors="replace") if len(parts) > 1 else "/"
            import json

            code, body = self.status(path)
            payload = json.dumps(body).encode()
            head = (
                f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            try:
                client.setblocking(True)
                client.settimeout(1.0)
                client.sendall(head.encode() + payload)
            except OSError:
                pass
            self._drop(fd)

    def _drop(self, fd: int) -> None:
        entry = self._clients.pop(fd, None)
        if entry is not None:
            client, _, timer = entry
            timer.cancel()
            self.stub.loop.unwatch(fd)
            client.close()
