"""How a node runs the plugin: a systemd unit, or a script containerd launches from its plugin directory.

Both run ``python -m nri_mokka`` (under its supervisor) with the options they were printed with.
"""

from __future__ import annotations

import argparse
import shlex
import sys

__all__ = ["plugin_argv", "prelaunch_script", "systemd_unit"]


def plugin_argv(args: argparse.Namespace) -> list[str]:
    """The command line that runs the plugin with ``args`` (absolute interpreter: no PATH needed)."""
    argv = [sys.executable, "-m", "nri_mokka", "--socket", args.socket_path, "--idx", args.idx, "--name", args.name]
    argv += ["--root", args.root, "--allocator", args.allocator, "--mode", args.mode]
    for namespace in args.exclude if args.exclude is not None else []:
        argv += ["--exclude-namespace", namespace]
    if args.cdi_devices:
        argv.append("--cdi-devices")
    if args.health_addr:
        argv += ["--health-addr", args.health_addr]
    if args.log_file:
        argv += ["--log-file", args.log_file]
    if args.no_supervisor:
        argv.append("--no-supervisor")
    if args.verbose:
        argv.append("--verbose")
    return argv


def systemd_unit(argv: list[str]) -> str:
    """A unit that keeps the plugin running: its supervisor replaces a plugin process within
    milliseconds, systemd restarts the supervisor at once should it die itself."""
    return (
        "[Unit]\n"
        "Description=Mokka NRI plugin: mock NVIDIA GPUs for containerd's containers\n"
        "After=local-fs.target\n"
        "Before=kubelet.service\n"
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        f"ExecStart={shlex.join(argv)}\n"
        "Restart=always\n"
        "RestartSec=0\n"
        "KillMode=mixed\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def prelaunch_script(argv: list[str]) -> str:
    """A script for containerd's plugin directory, named ``<idx>-<name>``: containerd starts it
    with only NRI_PLUGIN_NAME, NRI_PLUGIN_IDX and NRI_PLUGIN_SOCKET=3 in its environment."""
    return (
        "#!/bin/sh\n"
        "# Mokka's NRI plugin, launched by containerd from its plugin directory; the connection is fd 3.\n"
        f"exec {shlex.join(argv)}\n"
    )
