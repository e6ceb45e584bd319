"""The host's way into the cluster's network namespace: TCP ports on the host's loopback forwarded
to the same ports on the namespace's loopback (the API server, for kubectl and every client on the
host; the NRI plugins' health ports). Nothing else of the namespace is reachable from the host.

``python -m localcluster.forward NETNS PORT...`` (NETNS: ``/proc/<holder>/ns/net``) listens on
127.0.0.1:PORT here; each connection is joined to a socket made inside NETNS (a socket belongs to
the network namespace it was made in: the process enters NETNS for the ``socket()`` call alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class Namespaces:
    def __init__(self, netns: str) -> None:
        self.inside = os.open(netns, os.O_RDONLY)
        self.here = os.open("/proc/self/ns/net", os.O_RDONLY)

    def _enter(self, fd: int) -> None:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns: {os.strerror(ctypes.get_errno())}")

    def socket_inside(self) -> socket.socket:
        self._enter(self.inside)
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            self._enter(self.here)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def serve(netns: str, ports: list[int]) -> None:
    spaces = Namespaces(netns)

    def handler(port: int):  # type: ignore[no-untyped-def]
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = spaces.socket_inside()
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            except OSError:
                sock.close()
                writer.close()
                return
            inner_reader, inner_writer = await asyncio.open_connection(sock=sock)
            await asyncio.gather(_pipe(reader, inner_writer), _pipe(inner_reader, writer))

        return handle

    servers = [await asyncio.start_server(handler(p), "127.0.0.1", p, reuse_address=True) for p in ports]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("forwarding " + " ".join(str(p) for p in ports), flush=True)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str]) -> int:
    netns, ports = argv[0], [int(p) for p in argv[1:]]
    try:
        asyncio.run(serve(netns, ports))
    except OSError as exc:
        print(f"forward: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
