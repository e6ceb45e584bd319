"""A blocking CRI client (runtime.v1) over a runtime's gRPC unix socket, as kubelet drives it.

grpclib speaks gRPC on an asyncio loop that this client owns; every call runs that loop until
its answer arrives (or its timeout passes), so the client reads like a plain library and keeps
one HTTP/2 connection open across calls. The messages are the betterproto dataclasses of
:mod:`fetch.cri_bindings` (``client.api``): build requests with them, read answers from them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from fetch import cri_bindings as bindings

if TYPE_CHECKING:  # generated: typed when present, Any otherwise
    import containers.cri._pb.runtime.v1 as api

__all__ = ["CriClient", "CriError"]

T = TypeVar("T")
DEFAULT_TIMEOUT = 60.0


class CriError(RuntimeError):
    """A CRI call failed: the runtime answered with an error, or could not be reached."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class CriClient:
    """CRI RuntimeService and ImageService calls on the runtime listening at ``socket``."""

    def __init__(self, socket: Path, *, timeout: float = DEFAULT_TIMEOUT, cache: Path | None = None) -> None:
        self.api: Any = bindings.load(cache)  # the generated module (containers.cri._pb.runtime.v1)
        self.socket = socket
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._channel: Channel | None = None

    # -- plumbing --

    def _run(self, name: str, call: Coroutine[Any, Any, T]) -> T:
        try:
            return self._loop.run_until_complete(call)
        except GRPCError as exc:
            raise CriError(f"{name}: {exc.message or exc.status.name}") from None
        except (OSError, TimeoutError, ProtocolError, StreamTerminatedError) as exc:
            self._drop_channel()
            raise CriError(f"{name}: {self.socket}: {exc or type(exc).__name__}", unreachable=True) from None
        except BaseException:  # Ctrl-C midway: the connection's state is unknown
            self._drop_channel()
            raise

    def _runtime(self) -> api.RuntimeServiceStub:
        stub: api.RuntimeServiceStub = self.api.RuntimeServiceStub(self._connect())
        return stub

    def _images(self) -> api.ImageServiceStub:
        stub: api.ImageServiceStub = self.api.ImageServiceStub(self._connect())
        return stub

    def _connect(self) -> Channel:
        if self._channel is None:

            async def channel() -> Channel:  # a Channel belongs to the loop running when it is made
                return Channel(path=str(self.socket))

            self._channel = self._loop.run_until_complete(channel())
        return self._channel

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def close(self) -> None:
        """Close the connection and the loop; the client cannot be used afterwards."""
        self._drop_channel()
        if not self._loop.is_closed():
            self._loop.run_until_complete(asyncio.sleep(0))  # let the transport finish closing
            self._loop.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the runtime --

    def version(self, timeout: float | None = None) -> api.VersionResponse:
        request = self.api.VersionRequest(version="v1")
        return self._run("Version", self._runtime().version(request, timeout=timeout or self.timeout))

    def status(self, timeout: float | None = None) -> api.StatusResponse:
        request = self.api.StatusRequest(verbose=True)
        return self._run("Status", self._runtime().status(request, timeout=timeout or self.timeout))

    def runtime_config(self, timeout: float | None = None) -> dict[str, Any]:
        """The CRI configuration the runtime runs with (verbose Status' ``config``): what the runtime
        loaded, which may differ from its configuration file."""
        info = self.status(timeout).info
        try:
            config = json.loads(info["config"])
        except (KeyError, ValueError) as exc:
            raise CriError(f"Status: no CRI configuration in the runtime's answer ({exc})") from None
        return dict(config)

    def ready(self, timeout: float | None = None) -> bool:
        """Whether the runtime says RuntimeReady (an unreachable runtime is not ready)."""
        try:
            conditions = self.status(timeout).status.conditions
        except CriError:
            return False
        return any(c.type == "RuntimeReady" and c.status for c in conditions)

    # -- pods --

    def run_pod_sandbox(self, config: api.PodSandboxConfig, runtime_handler: str = "") -> str:
        request = self.api.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)
        response = self._run("RunPodSandbox", self._runtime().run_pod_sandbox(request, timeout=self.timeout))
        return str(response.pod_sandbox_id)

    def stop_pod_sandbox(self, pod_id: str, timeout: float | None = None) -> None:
        request = self.api.StopPodSandboxRequest(pod_sandbox_id=pod_id)
        self._run("StopPodSandbox", self._runtime().stop_pod_sandbox(request, timeout=timeout or self.timeout))

    def remove_pod_sandbox(self, pod_id: str, timeout: float | None = None) -> None:
        request = self.api.RemovePodSandboxRequest(pod_sandbox_id=pod_id)
        self._run("RemovePodSandbox", self._runtime().remove_pod_sandbox(request, timeout=timeout or self.timeout))

    def list_pod_sandbox(self, timeout: float | None = None) -> list[api.PodSandbox]:
        request = self.api.ListPodSandboxRequest()
        response = self._run(
            "ListPodSandbox", self._runtime().list_pod_sandbox(request, timeout=timeout or self.timeout)
        )
        return list(response.items)

    # -- containers --

    def create_container(self, pod_id: str, config: api.ContainerConfig, pod_config: api.PodSandboxConfig) -> str:
        request = self.api.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config)
        response = self._run("CreateContainer", self._runtime().create_container(request, timeout=self.timeout))
        return str(response.container_id)

    def start_container(self, container_id: str) -> None:
        request = self.api.StartContainerRequest(container_id=container_id)
        self._run("StartContainer", self._runtime().start_container(request, timeout=self.timeout))

    def stop_container(self, container_id: str, grace: int = 0) -> None:
        """StopContainer: SIGTERM, then SIGKILL after ``grace`` seconds (0: at once)."""
        request = self.api.StopContainerRequest(container_id=container_id, timeout=grace)
        self._run("StopContainer", self._runtime().stop_container(request, timeout=self.timeout + grace))

    def remove_container(self, container_id: str) -> None:
        request = self.api.RemoveContainerRequest(container_id=container_id)
        self._run("RemoveContainer", self._runtime().remove_container(request, timeout=self.timeout))

    def container_status(self, container_id: str) -> api.ContainerStatus:
        request = self.api.ContainerStatusRequest(container_id=container_id)
        return self._run("ContainerStatus", self._runtime().container_status(request, timeout=self.timeout)).status

    def container_info(self, container_id: str) -> dict[str, Any]:
        """The runtime's verbose view of a container (containerd: its OCI ``runtimeSpec``, pid, ...)."""
        request = self.api.ContainerStatusRequest(container_id=container_id, verbose=True)
        info = self._run("ContainerStatus", self._runtime().container_status(request, timeout=self.timeout)).info
        try:
            return dict(json.loads(info.get("info", "{}")))
        except ValueError as exc:
            raise CriError(f"ContainerStatus {container_id[:13]}: verbose info is not JSON ({exc})") from None

    # -- images --

    def list_images(self) -> list[api.Image]:
        request = self.api.ListImagesRequest()
        return list(self._run("ListImages", self._images().list_images(request, timeout=self.timeout)).images)
