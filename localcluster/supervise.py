"""Keep a node's daemon running as a node's service manager does: ``python -m localcluster.supervise
PROGRAM ARGS...`` runs the program and starts it again whenever it exits (systemd's
``Restart=always``, which containerd's unit has). NVIDIA's container toolkit operand restarts
containerd after it changes its configuration by sending it SIGHUP, on which containerd 2.x exits:
on a real node systemd starts it again, here this does.

SIGTERM or SIGINT is passed to the program and ends the supervision once it has exited; a program
that exits five times within ten seconds is given up (systemd's start limit), with its status.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import deque

RESTART_DELAY = 1.0  # seconds between an exit and the next start
BURST, INTERVAL = 5, 10.0  # starts within INTERVAL seconds before giving up


def supervise(argv: list[str]) -> int:
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    starts: deque[float] = deque(maxlen=BURST)
    while True:
        starts.append(time.monotonic())
        child = subprocess.Popen(argv)
        status = child.wait()
        if stopping:
            return status
        if len(starts) == BURST and starts[-1] - starts[0] < INTERVAL:
            print(f"supervise: {argv[0]} exited {BURST} times within {INTERVAL:g}s; giving up", flush=True)
            return status or 1
        print(f"supervise: {argv[0]} exited with status {status}; starting it again", flush=True)
        time.sleep(RESTART_DELAY)
        if stopping:
            return status


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m localcluster.supervise PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    return supervise(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
