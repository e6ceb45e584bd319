"""``python -m nri_mokka`` (what ``mokka nri-plugin`` runs): the plugin's command line.

It imports neither the click CLI nor pydantic, cffi or betterproto before the plugin has
registered: start-up time is time containerd creates containers without the plugin.
"""

from __future__ import annotations

import argparse
import os
import sys

from nri_mokka.nri.stub import DEFAULT_SOCKET, ENV_SOCKET

__all__ = ["main", "parser"]

PROG = "mokka nri-plugin"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Bad input: one line, exit 2 (argparse would print its usage first)."""
        sys.stderr.write(f"mokka: error: {message} (see `{PROG} --help`)\n")
        sys.exit(2)


def health_address(value: str) -> str:
    """``HOST:PORT``, ``:PORT`` (every address) or ``[IPv6]:PORT``, PORT 1..65535; argparse names
    the option when this raises."""
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535 or " " in host or (":" in host and not bracketed):
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. :8080 or 127.0.0.1:8080; PORT 1..65535)")
    return value


def plugin_index(value: str) -> str:
    """Two digits: the plugin's place among NRI plugins."""
    if not (len(value) == 2 and value.isdigit()):
        raise argparse.ArgumentTypeError(f"{value!r} is not two digits (e.g. 10)")
    return value


def plugin_name(value: str) -> str:
    if not value or "/" in value:
        raise argparse.ArgumentTypeError(f"{value!r} is not a usable plugin name (no '/', not empty)")
    return value


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog=PROG,
        description="The Mokka NRI plugin: containers gain the node's mock GPUs at creation. One log line "
        "per decision. Runs under its own supervisor (a plugin process that dies or is stopped is replaced "
        "within milliseconds) unless --no-supervisor. Started by containerd from its plugin directory it "
        "serves the connection on fd 3; otherwise it dials --socket and dials again whenever containerd "
        "restarts. A plugin config string from containerd (YAML: mode, excludeNamespaces, cdiDevices, "
        "allocator) overrides the options.",
    )
    ap.add_argument(
        "--socket",
        dest="socket_path",
        metavar="PATH",
        default=DEFAULT_SOCKET,
        help=f"containerd's NRI socket ({DEFAULT_SOCKET}); dialled unless started by containerd",
    )
    ap.add_argument(
        "--idx", default="10", type=plugin_index, help="plugin index: two digits, the order among NRI plugins (10)"
    )
    ap.add_argument("--name", default="mokka", type=plugin_name, help="plugin name (mokka)")
    ap.add_argument(
        "--root", default="/var/lib/mokka", help="root staged by `mokka host setup` (/var/lib/mokka; reads node.json)"
    )
    ap.add_argument(
        "--health-addr",
        metavar="HOST:PORT",
        type=health_address,
        help="serve /healthz and /readyz (e.g. :8080, 127.0.0.1:8080, [::1]:8080; PORT 1..65535)",
    )
    ap.add_argument(
        "--allocator",
        choices=("nri", "external"),
        default="nri",
        help="who hands out GPUs: nri (default): Mokka, every selected container gets the node's GPUs; "
        "external: a device plugin or DRA driver, containers get exactly what it allocated, others nothing",
    )
    ap.add_argument(
        "--mode",
        choices=("all", "opt-in"),
        default="all",
        help="allocator nri: all (default): every container except opted-out pods and excluded namespaces; "
        "opt-in: only pods annotated mokka.io/inject=true",
    )
    ap.add_argument(
        "--exclude-namespace",
        dest="exclude",
        action="append",
        metavar="NAMESPACE",
        help="allocator nri: a namespace left alone (repeatable; default kube-system)",
    )
    ap.add_argument(
        "--cdi-devices",
        action="store_true",
        help="hand GPUs over as CDI device references (containerd >= 2.1, with a spec from `mokka cdi generate`)",
    )
    ap.add_argument("--no-supervisor", action="store_true", help="run the plugin process alone")
    ap.add_argument("--log-file", metavar="PATH", help="append the log to this file instead of stderr")
    ap.add_argument(
        "--print-systemd-unit",
        action="store_true",
        help="print a systemd unit running the plugin with these options, and exit",
    )
    ap.add_argument(
        "--print-prelaunch-script",
        action="store_true",
        help="print a script for containerd's plugin directory (/opt/nri/plugins/<idx>-<name>) that runs the "
        "plugin with these options, and exit",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from nri_mokka import service

    settings: dict[str, object] = {
        "mode": args.mode,
        "excludeNamespaces": args.exclude if args.exclude is not None else ["kube-system"],
        "cdiDevices": args.cdi_devices,
        "allocator": args.allocator,
    }
    opts = service.Options(
        socket_path=args.socket_path,
        idx=args.idx,
        name=args.name,
        root=args.root,
        health_addr=args.health_addr,
        settings=settings,
    )
    if args.print_systemd_unit or args.print_prelaunch_script:
        from nri_mokka import units

        argv_out = units.plugin_argv(args)
        print(units.systemd_unit(argv_out) if args.print_systemd_unit else units.prelaunch_script(argv_out), end="")
        return 0

    if args.log_file:
        try:
            out = os.open(args.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            _fail(f"--log-file {args.log_file}: {exc.strerror}")
        os.dup2(out, 2)
        os.close(out)
    from nri_mokka import log

    log.set_level(log.DEBUG if args.verbose else log.INFO)
    fd = None
    if fd_text := os.environ.get(ENV_SOCKET):
        try:
            fd = int(fd_text)
        except ValueError:
            _fail(f"{ENV_SOCKET}={fd_text!r}: not a file descriptor")
    listener = None
    if args.health_addr:
        from nri_mokka.health import listen

        try:
            listener = listen(args.health_addr)
        except ValueError as exc:
            _fail(str(exc))
    if args.no_supervisor:
        return service.run(opts, listener=listener, fd=fd)
    from nri_mokka.supervisor import Supervisor

    if fd is not None and os.fork():
        # Launched by containerd, which kills the process it launched once that process's
        # connection closes (NRI >= 0.7): the supervisor lives on in a fork of its own, so that
        # a crashed plugin process is replaced. containerd does not wait for the launched one.
        os._exit(0)
    if fd is not None:
        os.setsid()
    return Supervisor(opts, listener, fd).run()


def _fail(message: str) -> None:
    sys.stderr.write(f"mokka: error: {message}\n")
    sys.exit(2)
