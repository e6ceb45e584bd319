"""The cluster's network namespace: every process of the cluster (control plane, nodes, pods) lives
in it, so nothing the cluster does — kube-proxy's netfilter rules, the pods' bridge, IP forwarding
— touches the host's network. The host reaches the cluster through :mod:`.forward` (the API server
and the plugins' health ports, on the host's loopback).

The holder (``python -m localcluster.netns BRIDGE PREFIX READY PORTS GATEWAY NODE_IP...``, run
under ``unshare --net``) brings up loopback and the pods' bridge with its gateway address (the API
server advertises that address: it is where the ``kubernetes`` Service and the cluster DNS lead)
and each node's own address (kubelet's node IP), reserves the cluster's chosen ports (PORTS,
comma-separated: the kernel never hands one of them to a socket bound to port 0, such as
containerd's stream server, before its component binds it), turns
on forwarding (this namespace's own sysctl), writes READY and waits for SIGTERM. The namespace,
its bridge and its rules end when the holder and the processes in it are gone.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def setup(bridge: str, prefix: str, addresses: list[str], reserved: str = "") -> None:
    if reserved:
        Path("/proc/sys/net/ipv4/ip_local_reserved_ports").write_text(reserved + "\n")
    _ip("link", "set", "lo", "up")
    _ip("link", "add", bridge, "type", "bridge")
    for address in addresses:
        _ip("addr", "add", f"{address}/{prefix}", "dev", bridge)
    _ip("link", "set", bridge, "up")
    # This namespace's own: pods of the bridge reach Services (DNAT) and each other through it.
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    Path("/proc/sys/net/ipv4/conf/all/route_localnet").write_text("1\n")
    # A Service's traffic goes in and out of the bridge: no redirects that would send pods past it.
    Path("/proc/sys/net/ipv4/conf/all/send_redirects").write_text("0\n")


def _stop(_signum: int, _frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: list[str]) -> int:
    bridge, prefix, ready, reserved, addresses = argv[0], argv[1], Path(argv[2]), argv[3], argv[4:]
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        setup(bridge, prefix, addresses, reserved)
    except OSError as exc:
        print(f"netns: {exc}", file=sys.stderr, flush=True)
        return 1
    ready.write_text("ready\n")
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
