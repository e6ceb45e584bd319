"""One line per step on stderr, with how long it took: ``[3/7] what: ok (1.23s); notes``.

On a terminal the line shows a spinner and the running time while the step works; elsewhere
(CI logs) a step that takes longer than :data:`QUIET_SECONDS` first prints ``[3/7] what ...``
so a long build is never silent, and quick steps stay one line.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

import click

__all__ = ["Progress"]

QUIET_SECONDS = 2.0


class Progress:
    """Numbered steps; ``with progress.step("title") as note: ... note("detail")``."""

    def __init__(self, total: int, *, prefix: str = "") -> None:
        self.total = total
        self.done = 0
        self.prefix = prefix
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[Callable[[str], None]]:
        self.done += 1
        label = f"{self.prefix}[{self.done}/{self.total}] {title}"
        t0 = time.monotonic()
        notes: list[str] = []
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(label, t0, stop), daemon=True)
        watcher.start()
        ok = False
        try:
            yield notes.append
            ok = True
        finally:
            stop.set()
            watcher.join()
            took = time.monotonic() - t0
            status = click.style("ok", fg="green") if ok else click.style("failed", fg="red")
            detail = "; " + "; ".join(notes) if notes else ""
            if self.tty:
                click.echo(f"\r{label} {status} ({took:.2f}s){detail}\x1b[K", err=True)
            else:
                click.echo(f"{label}: {status} ({took:.2f}s){detail}", err=True)

    def _watch(self, label: str, t0: float, stop: threading.Event) -> None:
        """A spinner on a terminal; elsewhere one ``label ...`` line once the step runs long."""
        if not self.tty:
            if not stop.wait(QUIET_SECONDS):
                click.echo(f"{label} ...", err=True)
            return
        frames = "|/-\\"
        i = 0
        while not stop.wait(0.1):
            click.echo(f"\r{label} {frames[i % 4]} {time.monotonic() - t0:.1f}s", nl=False, err=True)
            i += 1
