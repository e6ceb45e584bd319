"""`mokka dra-plugin`: the DRA kubelet plugin for the node's mock GPUs and InfiniBand adapters."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .root import KUBECONFIG_OPTION, fail, main

if TYPE_CHECKING:
    from gpumodel.nodelayout import NodeLayout


def hca_cdi_spec(layout: NodeLayout, kind: str) -> dict[str, Any] | None:
    """The CDI spec of the node's InfiniBand adapters as its sysfs lists them (what the DRA plugin's
    NIC driver hands out), or None on a node without adapters; raises ``cdi.CdiError``."""
    import cdi as cdi_pkg
    from k8snode.dra import nics

    adapters = nics.read(layout.sysfs)
    if not adapters:
        return None
    return cdi_pkg.render_adapters(layout, [(a.name, a.device_nodes) for a in adapters], kind=kind)


@main.command("dra-plugin")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/mokka"),
    show_default=True,
    help="Root staged by `mokka host setup` (read: node.json; the GPUs come from its libnvidia-ml.so).",
)
@click.option(
    "--node-name",
    default=None,
    help="This node's name in the cluster (default: $NODE_NAME, else the host name).",
)
@click.option("--driver-name", default="gpu.nvidia.com", show_default=True, help="DRA driver name (NVIDIA's).")
@click.option(
    "--kubelet-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/kubelet"),
    show_default=True,
    help="kubelet's root directory: sockets go to plugins/<driver>/ and plugins_registry/.",
)
@KUBECONFIG_OPTION
@click.option(
    "--cdi-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/run/cdi"),
    show_default=True,
    help="Where the container runtime reads CDI specs; the spec (`mokka cdi generate`) is refreshed there.",
)
@click.option("--cdi-kind", default="nvidia.com/gpu", show_default=True, help="CDI kind of the project's spec.")
@click.option(
    "--nic-driver-name",
    default="nic.mokka.io",
    show_default=True,
    help="DRA driver name of the node's InfiniBand adapters, served beside the GPUs when the node has "
    "any; empty: the GPUs alone.",
)
@click.option("--nic-cdi-kind", default="mokka.io/hca", show_default=True, help="CDI kind of the adapters' spec.")
@click.option(
    "--write-cdi-spec/--no-write-cdi-spec",
    default=True,
    show_default=True,
    help="Write the CDI spec at start (as `mokka cdi generate --root R --output DIR` would); without it the "
    "spec must be there already.",
)
@click.option(
    "--device-class/--no-device-class",
    default=True,
    show_default=True,
    help="Create the DeviceClasses <driver-name> (as NVIDIA's chart does) and <nic-driver-name>, unless the "
    "cluster has them.",
)
@click.option(
    "--unpublish",
    is_flag=True,
    help="Instead of serving: delete this node's ResourceSlices of both drivers and exit (the chart's preStop "
    "does, so that a node left by the plugin advertises no devices).",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (gRPC and HTTP).")
def dra_plugin(
    root: Path,
    node_name: str | None,
    driver_name: str,
    kubelet_dir: Path,
    kubeconfig: Path | None,
    cdi_dir: Path,
    cdi_kind: str,
    nic_driver_name: str,
    nic_cdi_kind: str,
    write_cdi_spec: bool,
    device_class: bool,
    unpublish: bool,
    verbose: bool,
) -> None:
    """Run the DRA kubelet plugin: the node's mock GPUs, allocated by the scheduler through DRA.

    Publishes the node's GPUs as one ResourceSlice (resource.k8s.io/v1) under the names of
    NVIDIA's GPU DRA driver: driver gpu.nvidia.com, devices gpu-<minor>, attributes productName,
    uuid, index, minor, architecture, brand, cudaComputeCapability, driverVersion,
    cudaDriverVersion, pcieBusID, addressingMode, resource.kubernetes.io/pcieRoot and capacity
    memory; so DeviceClasses and ResourceClaims written for a real cluster select them unchanged.
    It registers with kubelet (plugins_registry/) and answers NodePrepareResources with the CDI
    devices nvidia.com/gpu=<UUID> of the project's CDI spec; prepared claims are checkpointed
    under plugins/<driver>/, so repeated calls, unprepare and restarts are idempotent.

    On a node with InfiniBand adapters it serves them too, as a second driver (nic.mokka.io):
    devices mlx5-<n> with the standard attribute resource.kubernetes.io/pcieRoot, which a GPU and
    the adapter on its PCIe switch share (a claim's matchAttribute pairs them), each prepared as
    the CDI device mokka.io/hca=mlx5_<n> (its /dev/infiniband nodes) of the adapters' spec.

    Logs one line per prepare/unprepare (claim, devices, CDI IDs, or why not). Needs root (kubelet's
    directories) and API access to ResourceSlices, ResourceClaims (read) and DeviceClasses.
    Stops on SIGTERM/SIGINT, removing its sockets; the ResourceSlice stays for the next run
    (--unpublish deletes it).
    """
    import asyncio
    import logging

    import cdi as cdi_pkg
    from gpumodel import nodelayout

    node = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
    if unpublish:
        _unpublish(kubeconfig, node, [name for name in (driver_name, nic_driver_name) if name])
        return
    try:
        from k8snode.dra import api, cluster, plugin  # noqa: F401 - api fails here without the bindings
    except ImportError as exc:  # the generated kubelet API bindings are missing
        fail(str(exc))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        for noisy in ("kubernetes", "urllib3", "grpclib", "hpack", "h2"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        layout = nodelayout.NodeLayout.load(root)
    except FileNotFoundError:
        fail(f"{root}/node.json not found: run `mokka host setup --root {root}` first")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        fail(f"cannot read {root}/node.json: {exc}")
    # Everything is checked before anything is written: bad input changes nothing.
    specs = []  # (spec, its path in cdi_dir)
    try:
        spec = cdi_pkg.render(layout, kind=cdi_kind)
        specs.append((spec, cdi_dir / cdi_pkg.file_name(spec)))
        hca_spec = hca_cdi_spec(layout, nic_cdi_kind) if nic_driver_name else None
        if hca_spec is not None:
            specs.append((hca_spec, cdi_dir / cdi_pkg.file_name(hca_spec)))
    except cdi_pkg.CdiError as exc:
        fail(str(exc))
    for _, path in specs:
        if not write_cdi_spec and not path.is_file():
            fail(
                f"no CDI spec {path}: run `mokka cdi generate --root {root} --output {cdi_dir}` "
                "or drop --no-write-cdi-spec"
            )
    drivers = [(driver_name, plugin.GPUS, cdi_kind)] + (
        [(nic_driver_name, plugin.NICS, nic_cdi_kind)] if hca_spec is not None else []
    )
    try:
        client = cluster.load_client(str(kubeconfig) if kubeconfig else None)
        kubes = [cluster.Cluster(client, node, name) for name, _, _ in drivers]
    except cluster.ClusterError as exc:
        fail(str(exc))
    if write_cdi_spec:
        try:
            specs = [(spec, cdi_pkg.write(spec, cdi_dir)) for spec, _ in specs]
        except cdi_pkg.CdiError as exc:
            fail(str(exc))
    configs = [
        plugin.Config(
            root=root,
            node=node,
            driver=name,
            devices=devices,
            kubelet_dir=kubelet_dir,
            cdi_kind=kind,
            cdi_spec=path,
            device_class=device_class,
        )
        for (name, devices, kind), (_, path) in zip(drivers, specs, strict=True)
    ]
    try:
        asyncio.run(plugin.serve(configs, clusters=kubes))
    except plugin.PluginError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


def _unpublish(kubeconfig: Path | None, node: str, drivers: list[str]) -> None:
    """Delete ``node``'s ResourceSlices of ``drivers``, saying how many went."""
    from k8snode.dra import cluster

    try:
        client = cluster.load_client(str(kubeconfig) if kubeconfig else None)
        for driver in drivers:
            count = cluster.Cluster(client, node, driver).unpublish()
            click.echo(f"node {node}: {count} ResourceSlice(s) of driver {driver} deleted")
    except cluster.ClusterError as exc:
        fail(str(exc))
