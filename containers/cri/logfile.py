"""Read a container log file as CRI runtimes write it (what ``kubectl logs`` shows).

Each line is ``<RFC 3339 time> <stdout|stderr> <P|F> <text>``: ``P`` marks a partial line
whose text continues on the next one, ``F`` a full line (its newline was dropped).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["parse", "read"]


def parse(text: str, streams: tuple[str, ...] = ("stdout", "stderr")) -> str:
    """The container's output in ``text`` (CRI log format), the lines of ``streams`` in order."""
    out: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3 or parts[1] not in streams:
            continue
        content = parts[3] if len(parts) == 4 else ""
        out.append(content if parts[2] == "P" else content + "\n")
    return "".join(out)


def read(path: Path, streams: tuple[str, ...] = ("stdout", "stderr")) -> str:
    """The container's output from log file ``path`` ("" while it does not exist)."""
    try:
        return parse(path.read_text(errors="replace"), streams)
    except FileNotFoundError:
        return ""
