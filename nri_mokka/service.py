"""One plugin process: the NRI stub, the health endpoints and the supervisor's pipes on one loop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket

from nri_mokka.log import Logger
from nri_mokka.nri import loop as poll_loop
from nri_mokka.nri.stub import Stub
from nri_mokka.plugin import MokkaPlugin

__all__ = ["Options", "run"]

log = Logger("mokka.plugin")


class Options:
    """The command line, validated (``nri_mokka.main``). A plain class: dataclasses would
    cost the plugin start-up time before it registers."""

    def __init__(
        self,
        socket_path: str = "/var/run/nri/nri.sock",
        idx: str = "10",
        name: str = "mokka",
        root: str = "/var/lib/mokka",
        health_addr: str | None = None,
        settings: dict[str, object] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.idx = idx
        self.name = name
        self.root = root
        self.health_addr = health_addr
        self.settings = settings or {}  # decision.Config's keys: mode, excludeNamespaces, cdiDevices, allocator


def run(
    opts: Options,
    *,
    plugin: MokkaPlugin | None = None,
    listener: socket.socket | None = None,
    fd: int | None = None,
    reconnect: bool = True,
    parent_fd: int | None = None,
    ready_fd: int | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, the end of a pre-connected (``fd``) connection, or, under a
    supervisor, the end of its ``parent_fd`` pipe. Returns the exit code.

    ``listener``: the health socket, bound by a supervisor (else ``opts.health_addr`` is bound
    here); ``ready_fd``: where to report, one JSON line each time, that registration completed
    (with the configuration containerd gave).
    """
    from nri_mokka.health import Health, listen

    loop = poll_loop.Loop()
    plugin = plugin or MokkaPlugin(opts.root, opts.settings)

    def ready() -> None:
        if ready_fd is not None:  # the supervisor configures its template likewise
            import json

            report = json.dumps({"config": stub.config, "runtime": list(stub.runtime or ("", ""))})
            with contextlib.suppress(OSError):
                os.write(ready_fd, report.encode() + b"\n")

    stub = Stub(
        plugin,
        name=opts.name,
        idx=opts.idx,
        socket_path=opts.socket_path,
        env={},
        loop=loop,
        fd=fd,
        reconnect=reconnect,
        on_ready=ready,
    )
    if listener is None and opts.health_addr:
        listener = listen(opts.health_addr)
    if listener is not None:
        Health(stub, plugin, listener)
    if parent_fd is not None:

        def parent_gone(revents: int) -> None:
            log.info("%s: supervisor gone; exiting", stub.full_name)
            stub.stop()

        loop.watch(parent_fd, poll_loop.READ, parent_gone)
    # SIGTERM/SIGINT stop the loop from inside it: the handler only notes the signal (raising
    # from a handler would be swallowed where it lands in a logging call), and the wakeup
    # pipe makes poll() return even when the signal came just before it was entered.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)

    def woken(revents: int) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(wake_r, 512)
        if received:
            log.info(
                "%s: stopping on %s after %d decisions",
                stub.full_name,
                signal.Signals(received[0]).name,
                stub.decisions,
            )
            stub.stop()

    loop.watch(wake_r, poll_loop.READ, woken)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})  # blocked across a fork
    try:
        stub.run()
    finally:
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)
    return 0
