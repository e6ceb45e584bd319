"""`mokka fault ib-port-down | ib-link-errors | ib-traffic | ib-clear`: InfiniBand port faults (and traffic)
on a staged node.

The adapters' ports live in the node's sysfs tree (gpumodel/ib_ports.py changes them), which
containers see through the sysfs shim; these commands change the port's files in place, so the
next `ibstat`, `ibstatus` or counter read anywhere on the node shows the fault.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .fault import _cluster_node_root, cluster_node_options, fault
from .root import fail


def _where(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = cluster_node_options(fn)
    fn = click.option(
        "--root",
        type=click.Path(path_type=Path),
        default=None,
        help="The node staged by `mokka host setup` (default /var/lib/mokka).",
    )(fn)
    fn = click.option("--port", type=click.IntRange(1, 2), default=1, show_default=True, help="The adapter's port.")(fn)
    return click.option("--hca", type=click.IntRange(0), required=True, metavar="N", help="The adapter: mlx5_N.")(fn)


def _root(root: Path | None, node: str | None, cluster_dir: Path) -> Path:
    if node is not None and root is not None:
        fail("give one of --root and --node")
    if node is not None:
        return Path(_cluster_node_root(node, cluster_dir))
    from hostsetup.node import DEFAULT_ROOT

    return root or DEFAULT_ROOT


def _run(change: Callable[[], str], node: str | None = None, cluster_dir: Path | None = None) -> None:
    """Apply ``change``; on a node of the local cluster, every node's view of the subnet follows."""
    from gpumodel.ib_ports import PortFaultError

    try:
        click.echo(change())
        if node is not None and cluster_dir is not None:
            from localcluster.cluster import Cluster
            from localcluster.gpustack import sync_fabric

            sync_fabric([n.layout for n in Cluster.load(cluster_dir).nodes])
    except PortFaultError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename}: {exc.strerror}")


@fault.command("ib-port-down")
@_where
def ib_port_down(hca: int, port: int, root: Path | None, node: str | None, cluster_dir: Path) -> None:
    """Take an InfiniBand port's link down: state Down, physical state Disabled, no LID, and
    LinkDownedCounter up by one (ibstat, ibstatus, perfquery's counters)."""
    from gpumodel import ib_ports

    where = _root(root, node, cluster_dir)
    _run(lambda: ib_ports.set_link(where, hca, port, up=False), node, cluster_dir)


@fault.command("ib-link-errors")
@_where
@click.option("--count", type=int, default=100, show_default=True, help="Symbol errors to add.")
def ib_link_errors(hca: int, port: int, root: Path | None, node: str | None, cluster_dir: Path, count: int) -> None:
    """Errors on a live link: COUNT symbol errors (SymbolErrorCounter), the receive errors they
    cause (PortRcvErrors) and one link error recovery; the link stays up."""
    from gpumodel import ib_ports

    where = _root(root, node, cluster_dir)
    _run(lambda: ib_ports.add_link_errors(where, hca, port, count), node, cluster_dir)


@fault.command("ib-traffic")
@_where
@click.option(
    "--bytes", "octets", type=int, default=1 << 30, show_default=True, help="Octets sent, and as many received."
)
def ib_traffic(hca: int, port: int, root: Path | None, node: str | None, cluster_dir: Path, octets: int) -> None:
    """Traffic through a live port (no data path is simulated: the counters say it passed): BYTES
    sent and as many received, counted as the port counts them: PortXmitData and PortRcvData in
    4-octet words, PortXmitPkts, PortRcvPkts and their unicast counters in 4096-octet packets
    (perfquery, perfquery -x, the counters/ files)."""
    from gpumodel import ib_ports

    where = _root(root, node, cluster_dir)
    _run(lambda: ib_ports.add_traffic(where, hca, port, octets), node, cluster_dir)


@fault.command("ib-clear")
@_where
def ib_clear(hca: int, port: int, root: Path | None, node: str | None, cluster_dir: Path) -> None:
    """The port as staged: link up (Active, LinkUp, its LID back) and every counter 0."""
    from gpumodel import ib_ports

    where = _root(root, node, cluster_dir)
    _run(lambda: ib_ports.clear_port(where, hca, port), node, cluster_dir)
