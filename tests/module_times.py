"""Wall time per test module (setup, call and teardown of its tests), printed after the run.

pytest's ``--durations`` names single phases; what CI time is made of is modules (each one's
clusters, images and nodes), so the summary adds them up and prints the slowest.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

SHOWN = 25

_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    total = sum(_seconds.values())
    terminalreporter.section(f"slowest {min(SHOWN, len(_seconds))} modules (of {total:.0f} s in tests)")
    for path, secs in sorted(_seconds.items(), key=lambda kv: -kv[1])[:SHOWN]:
        terminalreporter.write_line(f"{secs:8.1f}s {100 * secs / total:5.1f}%  {path}")
