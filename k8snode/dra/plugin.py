"""The DRA kubelet plugin process: read the devices, publish them, serve kubelet until told to stop.

One process serves one driver per :class:`Config`: the GPUs (``gpu.nvidia.com``) and, on a node
with InfiniBand adapters, the adapters (``nic.mokka.io``), each with its own sockets, slice and
checkpoint, as two drivers would. Start-up of each, in order:

1. the node's devices: the GPUs through the staged ``libnvidia-ml.so`` (``<root>/node.json`` says
   where), the adapters from the node's sysfs tree;
2. the ResourceSlice of this node (and the DeviceClass when asked and absent);
3. the prepared claims from the checkpoint ``<kubelet>/plugins/<driver>/checkpoint.json``;
4. the DRAPlugin service on ``<kubelet>/plugins/<driver>/dra.sock`` (kubelet does not create that
   directory: the plugin does), then the Registration service on
   ``<kubelet>/plugins_registry/<driver>-reg.sock``, which kubelet's plugin watcher picks up.

Each socket is bound and listening under a hidden name in the plugin's directory first and renamed
into place, so kubelet never sees a socket that is not accepting yet; a stale socket from a
previous run is replaced. On SIGTERM/SIGINT both sockets are removed
(kubelet then unregisters the plugin); the ResourceSlice and the checkpoint stay, so a restarted
plugin continues where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumodel.nodelayout import NodeLayout

from . import gpus as gpus_mod
from . import nics as nics_mod
from .claims import Checkpoint, ClaimError, Claims, checkpoint_path
from .cluster import Cluster, ClusterError, load_client
from .resources import DEFAULT_DRIVER, Inventory, gpu_inventory, nic_inventory

__all__ = ["GPUS", "NICS", "Config", "PluginError", "Running", "serve", "start"]

log = logging.getLogger("mokka.dra")

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
DEFAULT_CDI_KIND = "nvidia.com/gpu"
GPUS, NICS = "gpus", "nics"  # which of the node's devices a driver serves


class PluginError(Exception):
    """The plugin cannot start; the message says what and where."""


@dataclass(frozen=True)
class Config:
    root: Path  # staged by `mokka host setup`: node.json
    node: str
    driver: str = DEFAULT_DRIVER
    devices: str = GPUS  # GPUS (through NVML) or NICS (the InfiniBand adapters, from sysfs)
    kubelet_dir: Path = DEFAULT_KUBELET_DIR
    cdi_kind: str = DEFAULT_CDI_KIND
    cdi_spec: Path | None = None  # the spec file whose devices prepared claims name (checked when set)
    sysfs: Path | None = None  # default: <root>/sys when staged there, else /sys
    kubeconfig: str | None = None
    device_class: bool = True

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_dir / "plugins" / self.driver

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / f"{self.driver}-reg.sock"


def _listen(path: Path, staging: Path) -> socket.socket:
    """A listening unix socket at ``path``, bound under a hidden name in ``staging`` and renamed.

    kubelet's plugin watcher reacts to every file created in ``plugins_registry/`` (and complains
    about one gone before it looked), so the socket is made elsewhere and appears there ready.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir(parents=True, exist_ok=True)
    hidden = staging / f".{path.name}.{os.getpid()}"
    hidden.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(hidden))
        sock.listen(64)
        try:
            os.replace(hidden, path)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            sock.close()  # another file system: bind in place (hidden names are skipped there too)
            return _listen(path, path.parent)
    except OSError:
        sock.close()
        hidden.unlink(missing_ok=True)
        raise
    return sock


@dataclass
class Running:
    """A started plugin: its servers and what it read."""

    config: Config
    inventory: Inventory
    claims: Claims
    servers: list[Any]
    registered: asyncio.Event

    async def close(self) -> None:
        for path in (self.config.registration_socket, self.config.dra_socket):
            with contextlib.suppress(OSError):
                path.unlink()
        for server in self.servers:
            server.close()
        for server in self.servers:
            await server.wait_closed()


def _inventory(config: Config) -> Inventory:
    try:
        layout = NodeLayout.load(config.root)
    except FileNotFoundError:
        raise PluginError(
            f"{config.root}/node.json not found: run `mokka host setup --root {config.root}` first"
        ) from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise PluginError(f"cannot read {config.root}/node.json: {exc}") from None
    sysfs = config.sysfs or layout.sysfs
    if config.devices == NICS:
        return nic_inventory(nics_mod.read(sysfs), driver=config.driver, cdi_kind=config.cdi_kind)
    try:
        info = gpus_mod.read(Path(layout.library), sysfs)
    except gpus_mod.NvmlError as exc:
        raise PluginError(str(exc)) from None
    for index in info.lost:
        log.warning("GPU %d is lost (NVML: GPU is lost): not published", index)
    return gpu_inventory(info, driver=config.driver, cdi_kind=config.cdi_kind)


async def start(config: Config, *, cluster: Cluster | None = None) -> Running:
    """Read, publish and serve; returns once both sockets accept connections."""
    from grpclib.server import Server

    from .service import dra_services, registration_service

    inventory = await asyncio.to_thread(_inventory, config)
    if cluster is None:
        try:
            cluster = Cluster(await asyncio.to_thread(load_client, config.kubeconfig), config.node, config.driver)
        except ClusterError as exc:
            raise PluginError(str(exc)) from None
    try:
        await asyncio.to_thread(cluster.publish, inventory)
        if config.device_class:
            await asyncio.to_thread(cluster.ensure_device_class, inventory.device_class)
    except ClusterError as exc:
        raise PluginError(str(exc)) from None
    try:
        checkpoint = Checkpoint.load(checkpoint_path(config.plugin_dir), config.driver)
    except ClaimError as exc:
        raise PluginError(str(exc)) from None
    claims = Claims(
        driver=config.driver,
        pool=config.node,
        cdi_ids=inventory.cdi_ids,
        checkpoint=checkpoint,
        read_claim=cluster.read_claim,
        cdi_spec=config.cdi_spec,
    )
    if checkpoint.claims:
        log.info("checkpoint: %d prepared claims from the previous run", len(checkpoint.claims))
    registered = asyncio.Event()

    def on_status(ok: bool, error: str) -> None:
        if ok:
            log.info("kubelet registered the plugin %s", config.driver)
            registered.set()
        else:
            log.warning("kubelet refused the plugin %s: %s", config.driver, error or "no reason given")

    servers: list[Any] = []
    for path, services in (
        (config.dra_socket, dra_services(claims)),
        (config.registration_socket, [registration_service(config.driver, str(config.dra_socket), on_status)]),
    ):
        try:
            sock = _listen(path, config.plugin_dir)
        except OSError as exc:
            await Running(config, inventory, claims, servers, registered).close()
            raise PluginError(f"cannot serve on {path}: {exc.strerror or exc}") from None
        server = Server(services)
        await server.start(sock=sock)
        servers.insert(0, server)
    log.info(
        "serving %s on %s (registration %s), %s",
        config.driver,
        config.dra_socket,
        config.registration_socket,
        inventory.summary,
    )
    return Running(config, inventory, claims, servers, registered)


async def serve(
    configs: Sequence[Config], *, clusters: Sequence[Cluster] | None = None, stop: asyncio.Event | None = None
) -> None:
    """Serve every driver of ``configs`` until SIGTERM/SIGINT (or ``stop`` is set)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running: list[Running] = []
    try:
        for i, config in enumerate(configs):
            running.append(await start(config, cluster=clusters[i] if clusters else None))
        await stop.wait()
    finally:
        for one in running:
            await one.close()
        if running:
            log.info("stopped: sockets removed; ResourceSlices and checkpoints kept for the next run")
