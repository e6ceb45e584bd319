"""The plugin process's log: one line per event on stderr, ``time pid LEVEL source: message``.

The standard ``logging`` module (with the traceback, threading and tokenizer modules it
imports) costs the plugin about 6 ms of start-up, while containerd creates containers without
it, and several microseconds per line on the path of every container; the plugin needs none
of its configurability. Each line is one write(2), so the lines of the supervisor and its
plugin processes, which share stderr, never interleave.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

__all__ = ["DEBUG", "ERROR", "INFO", "WARNING", "Logger", "set_level"]

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}
_level = INFO


def set_level(level: int) -> None:
    global _level
    _level = level


def _write(level: int, source: str, message: str) -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    line = f"{stamp},{int(now % 1 * 1000):03d} {os.getpid()} {_NAMES[level]} {source}: {message}\n"
    with contextlib.suppress(OSError):  # nowhere to log to: the plugin carries on
        os.write(2, line.encode(errors="replace"))


class Logger:
    """``Logger("mokka.plugin").info("%s: %d", a, b)``: %-style formatting, only when logged."""

    __slots__ = ("source",)

    def __init__(self, source: str) -> None:
        self.source = source

    def enabled(self, level: int) -> bool:
        return level >= _level

    def _log(self, level: int, message: str, args: tuple[object, ...]) -> None:
        if level >= _level:
            _write(level, self.source, message % args if args else message)

    def debug(self, message: str, *args: object) -> None:
        self._log(DEBUG, message, args)

    def info(self, message: str, *args: object) -> None:
        self._log(INFO, message, args)

    def warning(self, message: str, *args: object) -> None:
        self._log(WARNING, message, args)

    def error(self, message: str, *args: object) -> None:
        self._log(ERROR, message, args)

    def exception(self, message: str, *args: object) -> None:
        """``error`` with the traceback of the exception being handled."""
        import traceback

        text = message % args if args else message
        _write(ERROR, self.source, text + "\n" + "".join(traceback.format_exception(*sys.exc_info())).rstrip())
