"""NVIDIA's GPU Feature Discovery run once on a mock node: its command line and its output.

GFD one-shot writes the labels it computes (from NVML, the PCI sysfs entries and the machine's
DMI product name) to a file of ``key=value`` lines; the local cluster's real nodes and every
virtual pool's template (:mod:`virtualfleet.template`) get their GPU labels this way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["oneshot_argv", "parse_labels"]


def oneshot_argv(binary: Path, output: Path, driver_root: Path, mig_strategy: str = "none") -> list[str]:
    """GFD labelling once into ``output``, the mock driver at ``driver_root`` (NVML from the
    library path its caller sets), without NFD's API (the caller applies the labels)."""
    return [
        str(binary),
        "--oneshot",
        "--no-timestamp",
        "--use-node-feature-api=false",
        f"--output-file={output}",
        f"--driver-root-ctr-path={driver_root}",
        f"--mig-strategy={mig_strategy}",
    ]


def parse_labels(text: str) -> dict[str, str]:
    """GFD's output file: one ``key=value`` per line."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key:
            labels[key] = value
    return labels
