"""Keep one plugin process serving: replace it within milliseconds when it dies or is stopped.

The supervisor forks the plugin process and waits. When the plugin dies (a crash, SIGKILL)
or is stopped (SIGSTOP: a stopped plugin holds up every container creation on the node
until containerd's request timeout), the supervisor kills what is left and forks a new one
at once. Forks come from the supervisor's own warm copy of the plugin (modules imported,
node layout loaded, common answers encoded), so a replacement registers in milliseconds.
The first plugin process is forked before that warm-up, so the first registration is not
delayed by it either.

Pre-launched by containerd (``NRI_PLUGIN_SOCKET``), the first plugin process serves the
inherited connection; replacements dial the NRI socket. When containerd itself closes the
connection (it is stopping), everything exits: containerd launches its plugins afresh.

A plugin that keeps dying before it registers is restarted with a growing delay (up to 5 s);
exit code 2 (bad configuration) is final.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time

from nri_mokka import service
from nri_mokka.log import Logger
from nri_mokka.plugin import MokkaPlugin

__all__ = ["Supervisor"]

log = Logger("mokka.supervisor")

QUICK_FAILURES = 3  # plugin processes dying unregistered before restarts are delayed
MAX_DELAY = 5.0
WARM_UP_AFTER = 1.0  # seconds to let the first plugin register before warming the template up


class Supervisor:
    def __init__(self, opts: service.Options, listener: socket.socket | None = None, fd: int | None = None) -> None:
        self.opts = opts
        self.listener = listener
        self.fd = fd  # the pre-connected socket, for the first plugin process only
        self.prelaunched = fd is not None
        self.template = MokkaPlugin(opts.root, opts.settings)
        self.child = 0
        self.child_started = 0.0
        self.child_ready = False
        self.quick_failures = 0
        self.restart_at: float | None = None
        self.stopping: str | None = None
        self.exit_code = 0
        self._alive_w = -1  # our end of the pipe whose closing tells the plugin we are gone
        self._ready_r = -1  # the plugin's reports: one line each time it has registered
        self._ready_buf = b""

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._terminate)
        started = time.monotonic()
        warm = False
        self._spawn(wake_r, wake_w)
        while True:
            if self.stopping is not None and not self.child:
                return self.exit_code
            now = time.monotonic()
            if not self.child and self.stopping is None and self.restart_at is not None and now >= self.restart_at:
                self._spawn(wake_r, wake_w)
            if not warm and (self.child_ready or now - started > WARM_UP_AFTER):
                warm = True
                self._warm_up()
                continue
            waits = [t for t in (self.restart_at if not self.child else None,) if t is not None]
            if not warm:
                waits.append(started + WARM_UP_AFTER)
            timeout = max(0.0, min(waits) - time.monotonic()) if waits else None
            fds = [wake_r] + ([self._ready_r] if self._ready_r >= 0 else [])
            try:
                readable, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                readable = []
            if wake_r in readable:
                try:
                    while os.read(wake_r, 256):
                        pass
                except BlockingIOError:
                    pass
            if self._ready_r in readable:
                self._read_ready()
            self._reap()

    # -- plugin processes --

    def _spawn(self, wake_r: int, wake_w: int) -> None:
        self.restart_at = None
        alive_r, alive_w = os.pipe()
        ready_r, ready_w = os.pipe()
        fd, self.fd = self.fd, None
        # No signal handler of ours may run between the fork and the child's bookkeeping:
        # a SIGTERM there would miss the new plugin process (parent) or act on the
        # supervisor's state (child). The child unblocks once its own handlers are in place.
        stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        pid = os.fork()
        if pid == 0:  # the plugin process
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                for sig in stop_signals:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                for unused in (wake_r, wake_w, alive_w, ready_r, self._alive_w, self._ready_r):
                    if unused >= 0:
                        os.close(unused)
                code = service.run(
                    self.opts,
                    plugin=self.template,
                    listener=self.listener,
                    fd=fd,
                    reconnect=not self.prelaunched,
                    parent_fd=alive_r,
                    ready_fd=ready_w,
                )
            except BaseException:
                log.exception("plugin process failed")
            finally:
                os._exit(code)
        os.close(alive_r)
        os.close(ready_w)
        if fd is not None:
            os.close(fd)  # the plugin process holds the connection now: its end is containerd's signal
        for old in (self._alive_w, self._ready_r):
            if old >= 0:
                os.close(old)
        self._alive_w, self._ready_r, self._ready_buf = alive_w, ready_r, b""
        self.child = pid
        self.child_started = time.monotonic()
        self.child_ready = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)

    def _read_ready(self) -> None:
        try:
            data = os.read(self._ready_r, 65536)
        except OSError:
            data = b""
        if not data:
            os.close(self._ready_r)
            self._ready_r = -1
            return
        self._ready_buf += data
        *lines, self._ready_buf = self._ready_buf.split(b"\n")
        import json

        for line in lines:
            self.child_ready = True
            self.quick_failures = 0
            try:
                report = json.loads(line)
                if self.prelaunched and report["config"].strip():
                    # containerd configures only the connection it handed over; a replacement
                    # that dials gets no config string, and takes this one instead
                    self.template.launch_config = report["config"]
                self.template.configure(report["config"], *report["runtime"])
            except (ValueError, KeyError, TypeError):
                pass

    def _warm_up(self) -> None:
        try:
            self.template.warm_up()
        except Exception:  # the plugin processes warm up themselves then
            log.exception("warming up the plugin template failed")

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if os.WIFSTOPPED(status):
                if pid == self.child:
                    sig = signal.Signals(os.WSTOPSIG(status)).name
                    log.warning("plugin pid %d stopped by %s: it would hold up containerd; replacing it", pid, sig)
                    os.kill(pid, signal.SIGKILL)
                continue
            if pid == self.child:
                self._exited(pid, status)

    def _exited(self, pid: int, status: int) -> None:
        lived = time.monotonic() - self.child_started
        self.child = 0
        if os.WIFSIGNALED(status):
            how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            code = -1
        else:
            code = os.waitstatus_to_exitcode(status)
            how = f"exited with {code}"
        if self.stopping is not None:
            log.info("plugin pid %d %s", pid, how)
            return
        if code == 0 and self.prelaunched:
            log.info("plugin pid %d %s: containerd closed its connection; exiting", pid, how)
            self.stopping = "runtime gone"
            return
        if code == 2:
            log.error("plugin pid %d %s (bad configuration); not restarting it", pid, how)
            self.stopping = "configuration error"
            self.exit_code = 2
            return
        self.quick_failures = 0 if self.child_ready else self.quick_failures + 1
        delay = 0.0
        if self.quick_failures >= QUICK_FAILURES:
            delay = min(MAX_DELAY, 0.1 * 2 ** (self.quick_failures - QUICK_FAILURES))
        log.warning(
            "plugin pid %d %s after %.2f s; %s",
            pid,
            how,
            lived,
            f"restarting in {delay:.1f} s" if delay else "replacing it",
        )
        self.restart_at = time.monotonic() + delay

    def _terminate(self, signum: int, frame: object) -> None:
        self.stopping = signal.Signals(signum).name
        if self.child:
            try:
                os.kill(self.child, signal.SIGTERM)
                os.kill(self.child, signal.SIGCONT)  # a stopped one must see it too
            except ProcessLookupError:
                pass
