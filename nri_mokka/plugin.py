"""The Mokka NRI plugin: decisions (``decision.decide``) rendered as NRI adjustments.

Three layers, kept apart: the stub (``nri.stub``: ttrpc, mux, registration, reconnects)
calls ``MokkaPlugin.create_container``; that turns NRI's messages into a transport-free
``decision.Container``, asks ``decide`` and renders the resulting edits. A container that
did not ask for GPUs is never failed: an internal error yields an empty adjustment and a
log line. A container that asked for GPUs the node lacks is refused (``PluginError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import yaml

from gpumodel.edits import ContainerEdits
from gpumodel.nodelayout import NodeLayout

from . import decision
from .mig_view import MigView, MigViewError
from .nri.stub import ContainerAdjustment, PluginError, Stub, api

log = logging.getLogger("mokka.plugin")


def to_container(pod: api.PodSandbox, container: api.Container) -> decision.Container:
    env = {key: value for key, _, value in (e.partition("=") for e in container.env)}
    devices = [d.path for d in container.linux.devices] if container.linux else []
    return decision.Container(
        name=container.name,
        pod_name=pod.name,
        pod_namespace=pod.namespace,
        pod_annotations=dict(pod.annotations),
        annotations=dict(container.annotations),
        env=env,
        device_paths=devices,
    )


def render(edits: ContainerEdits, existing_env: Mapping[str, str]) -> ContainerAdjustment:
    """The edits as an NRI ContainerAdjustment (the CDI generator renders the same edits).

    Building protobuf objects dominates the plugin's cost, and a node has few distinct
    edits (one per GPU set): adjustments are built once per (edits, LD_PRELOAD) and reused.
    """
    return _render(edits, existing_env.get("LD_PRELOAD", ""))


@functools.lru_cache(maxsize=256)
def _render(edits: ContainerEdits, preload: str) -> ContainerAdjustment:
    env = []
    for key, value in edits.env_dict().items():
        if key == "LD_PRELOAD" and preload:
            value = f"{value}:{preload}"  # keep what the image preloads
        env.append(api.KeyValue(key=key, value=value))
    mounts = [
        api.Mount(destination=m.container_path, type="bind", source=m.host_path, options=list(m.options))
        for m in edits.mounts
    ]
    devices = [
        api.LinuxDevice(
            path=d.path, type=d.type, major=d.major, minor=d.minor, file_mode=api.OptionalFileMode(value=d.file_mode)
        )
        for d in edits.device_nodes
    ]
    adjust = ContainerAdjustment(env=env, mounts=mounts)
    if devices:
        adjust.linux = api.LinuxContainerAdjustment(devices=devices)
    return adjust


def render_cdi(names: tuple[str, ...]) -> ContainerAdjustment:
    """GPUs as CDI device references: the runtime resolves them against the CDI spec
    (`mokka cdi generate`), which carries the same edits."""
    return _render_cdi(names)


@functools.lru_cache(maxsize=256)
def _render_cdi(names: tuple[str, ...]) -> ContainerAdjustment:
    return ContainerAdjustment(cdi_devices=[api.CdiDevice(name=n) for n in names])


def runtime_takes_cdi(runtime_name: str, runtime_version: str) -> bool:
    """containerd 2.1 and later apply NRI's CDI device references (NRI >= 0.7); older
    runtimes would silently drop them."""
    if runtime_name != "containerd":
        return False
    parts = runtime_version.lstrip("v").split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (2, 1)
    except (ValueError, IndexError):
        return False


class MokkaPlugin:
    """Subscribes to CreateContainer only; reads the node layout host setup wrote."""

    def __init__(self, root: Path, config: decision.Config | None = None) -> None:
        self.root = root
        self.config = config or decision.Config()
        self.layout: NodeLayout | None = None
        self.mig: MigView | None = None  # the MIG layout through NVML, where the node has MIG-capable GPUs
        self.decisions = 0
        self.handling_seconds = 0.0
        self.recent: deque[float] = deque(maxlen=1000)  # seconds per CreateContainer, newest last
        self.runtime_cdi = False  # whether the runtime applies CDI device references
        self._stamp: tuple[int, int] | None = None
        self._layout_file = str(root / "node.json")  # a plain string: stat() on it per call is cheap
        self.load_layout()
        self.warm_up()

    def warm_up(self) -> None:
        """Run one synthetic container through parse, decision, rendering and encoding, so the
        first real container does not pay for lazy class set-up and the common adjustment."""
        if self.layout is None:
            return
        request = api.CreateContainerRequest(
            pod=api.PodSandbox(name="warm-up", namespace="default"), container=api.Container(name="warm-up")
        )
        parsed = api.CreateContainerRequest().parse(bytes(request))
        d = decision.decide(to_container(parsed.pod, parsed.container), self.layout, self.config)
        if d.edits is not None:
            bytes(api.CreateContainerResponse(adjust=render(d.edits, {})))

    def _layout_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._layout_file)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino

    def current_layout(self) -> NodeLayout | None:
        """The node layout, reloaded when host setup rewrote node.json (one stat per call)."""
        if self._layout_stamp() != self._stamp or self.layout is None:
            self.load_layout()
        return self.layout

    def load_layout(self) -> None:
        self._stamp = self._layout_stamp()
        try:
            self.layout = NodeLayout.load(self.root)
            if self.mig is not None:
                self.mig.close()
            self.mig = None
            if self.layout.caps_major is not None:
                try:
                    self.mig = MigView(Path(self.layout.library), Path(self.layout.state))
                except MigViewError as exc:  # MIG devices cannot be named; whole GPUs still can
                    log.error("MIG layout unavailable: %s", exc)
            log.info(
                "node layout %s/node.json: profile %s, %d GPUs", self.root, self.layout.profile, len(self.layout.gpus)
            )
        except (OSError, ValueError, TypeError, KeyError) as exc:
            self.layout = None
            log.error(
                "no usable node layout at %s/node.json (%s): containers pass untouched until "
                "`mokka host setup --root %s` has run",
                self.root,
                exc,
                self.root,
            )

    async def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        log.info("configured by %s %s", runtime_name, runtime_version)
        self.runtime_cdi = runtime_takes_cdi(runtime_name, runtime_version)
        if config.strip():
            try:
                data = yaml.safe_load(config) or {}
                if not isinstance(data, dict):
                    raise ValueError("the plugin config must be a mapping")
                self.config = decision.Config.parse(data)
            except (ValueError, yaml.YAMLError) as exc:
                log.error("ignoring invalid plugin config (%s); keeping %s", exc, self.config)

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> ContainerAdjustment | None:
        start = time.perf_counter()
        try:
            layout = self.current_layout()
            if layout is None:
                log.info("%s/%s/%s: untouched (no node layout)", pod.namespace, pod.name, container.name)
                return None
            c = to_container(pod, container)
            d = decision.decide(c, layout, self.config, self.mig.current() if self.mig else ())
            log.info("%s", d.summary(c))
            if d.error:
                raise PluginError(f"mokka: {d.error}")
            if d.edits is None:
                return None
            if d.cdi_devices and self.runtime_cdi:
                return render_cdi(d.cdi_devices)
            return render(d.edits, c.env)
        except PluginError:
            raise
        except Exception:  # fail open: a bug here must never block a container
            log.exception(
                "%s/%s/%s: internal error; container passes untouched", pod.namespace, pod.name, container.name
            )
            return None
        finally:
            took = time.perf_counter() - start
            self.decisions += 1
            self.handling_seconds += took
            self.recent.append(took)


class Health:
    """/healthz: the process answers; /readyz: registered with the runtime and a layout loaded."""

    def __init__(self, stub: Stub, plugin: MokkaPlugin) -> None:
        self.stub = stub
        self.plugin = plugin

    def status(self, path: str) -> tuple[int, dict[str, object]]:
        body: dict[str, object] = {
            "registered": self.stub.registered.is_set(),
            "registrations": self.stub.connections,
            "layout": self.plugin.layout is not None,
            "decisions": self.plugin.decisions,
        }
        if self.plugin.recent:
            recent = sorted(self.plugin.recent)
            body["handling_ms"] = {
                "median": round(recent[len(recent) // 2] * 1000, 3),
                "p99": round(recent[min(len(recent) - 1, int(len(recent) * 0.99))] * 1000, 3),
                "samples": len(recent),
            }
        if path == "/healthz":
            return 200, body
        if path == "/readyz":
            ready = self.stub.registered.is_set() and self.plugin.layout is not None
            return (200 if ready else 503), body
        return 404, {"error": f"no such endpoint {path}"}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            parts = line.decode(errors="replace").split()
            path = parts[1] if len(parts) > 1 else "/"
            while (await asyncio.wait_for(reader.readline(), 5)).strip():
                pass
            code, body = self.status(path)
            data = json.dumps(body).encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(ConnectionError):
                writer.close()

    async def serve(self, address: str) -> asyncio.Server:
        host, _, port = address.rpartition(":")
        return await asyncio.start_server(self.handle, host or "0.0.0.0", int(port))


async def serve(
    root: Path, socket_path: str, name: str, idx: str, health_addr: str | None, config: decision.Config | None = None
) -> None:
    """Run the plugin until cancelled or, when pre-launched, until containerd closes the socket."""
    plugin = MokkaPlugin(root, config)
    # Reconnect attempts to an absent socket cost one failed connect(): retry often (capped at
    # 0.2 s) so a restarted containerd gets the plugin back well within a second.
    stub = Stub(plugin, name=name, idx=idx, socket_path=socket_path, backoff=(0.02, 0.2))
    server = None
    if health_addr:
        server = await Health(stub, plugin).serve(health_addr)
        log.info("health endpoints on http://%s/healthz and /readyz", health_addr)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stub.stop)
    try:
        await stub.run()
    finally:
        if server is not None:
            server.close()
        log.info("stopped after %d decisions", plugin.decisions)
