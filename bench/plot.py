"""The benches' plots: each figure beside its peer's, as an SVG (matplotlib, drawn without a display).

``bars`` draws one grouped bar chart: a group per setting (a containerd version, a GPU count), a
bar per side (Mokka, its peer, the baseline), each labelled with its value, and a note of the
machine and the time under the title, so that a plot taken out of its page still says where it
was measured.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["bars", "machine"]


def machine() -> str:
    """Where and when: the CPU count, the kernel, the host's name and the UTC time."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{os.cpu_count()} CPUs, Linux {platform.release()}, {platform.node()}, {when}"


def bars(path: Path, title: str, unit: str, groups: Mapping[str, Mapping[str, float]], note: str = "") -> Path:
    """Write the grouped bar chart of ``groups`` (setting -> side -> value in ``unit``) to ``path``."""
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable, the reader's font
    import matplotlib.pyplot as plt

    sides = list(dict.fromkeys(side for values in groups.values() for side in values))
    width = 0.8 / max(1, len(sides))
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(groups) * max(1, len(sides)) * 0.6, 3.6))
    for i, side in enumerate(sides):
        xs = [g + (i - (len(sides) - 1) / 2) * width for g in range(len(groups))]
        values = [values.get(side, float("nan")) for values in groups.values()]
        drawn = ax.bar(xs, values, width, label=side)
        ax.bar_label(drawn, labels=[f"{v:.3g}" if v == v else "" for v in values], fontsize=7, padding=2)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.15)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.text(0.01, 0.01, note or machine(), fontsize=6, color="0.4")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    return path
