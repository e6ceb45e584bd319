"""Making containerd read its config again: ``systemctl restart`` where it runs as a systemd
unit, else a hint for whoever started it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigError

UNIT = "containerd.service"
SYSTEMD_RUN_DIR = Path("/run/systemd/system")
Runner = Callable[..., subprocess.CompletedProcess[str]]


def under_systemd(unit: str = UNIT, run: Runner = subprocess.run) -> bool:
    """True when systemd is PID 1 here and ``unit`` is active."""
    if not SYSTEMD_RUN_DIR.is_dir():
        return False
    try:
        res = run(["systemctl", "is-active", "--quiet", unit], capture_output=True, text=True, check=False)
    except OSError:
        return False
    return res.returncode == 0


def restart_hint(config: Path, unit: str = UNIT) -> str:
    """What to do to make containerd read ``config`` again."""
    return (
        f"containerd does not run as systemd unit {unit} here: restart it yourself so it reads {config} "
        f"(stop it, then start `containerd --config {config}` again)"
    )


def restart(config: Path, unit: str = UNIT, run: Runner = subprocess.run) -> str:
    """Restart ``unit`` through systemctl when containerd runs under systemd; else return the hint."""
    if not under_systemd(unit, run):
        return restart_hint(config, unit)
    res = run(["systemctl", "restart", unit], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ConfigError(f"systemctl restart {unit} failed: {res.stderr.strip() or f'exit {res.returncode}'}")
    return f"restarted {unit}"
