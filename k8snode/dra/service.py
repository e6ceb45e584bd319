"""The two gRPC services kubelet calls, on grpclib with the betterproto bindings of its own protos.

- **Registration** (``pluginregistration.Registration``), on a socket in kubelet's
  ``plugins_registry/``: ``GetInfo`` says "a DRAPlugin named <driver>, served at <endpoint>, in
  these API versions"; ``NotifyRegistrationStatus`` is kubelet's answer.
- **DRAPlugin** (``k8s.io.kubelet.pkg.apis.dra.v1`` and ``v1beta1``, identical messages), on the
  endpoint socket: ``NodePrepareResources`` / ``NodeUnprepareResources`` for a batch of claims;
  every claim gets an entry, with an error string when it failed (kubelet retries those). Claims
  are handled one after the other, in the order kubelet lists them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from . import api
from .claims import Claim, ClaimError, Claims, PreparedDevice

__all__ = ["PLUGIN_TYPE", "dra_services", "registration_service"]

log = logging.getLogger("mokka.dra")

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1: DRAPlugin


def registration_service(
    driver: str, endpoint: str, on_status: Callable[[bool, str], None], versions: tuple[str, ...] | None = None
) -> Any:
    """The Registration service announcing ``driver`` at ``endpoint``; ``on_status(registered, error)``."""
    reg = api.registration
    supported = list(versions if versions is not None else (v for v, _ in api.DRA_SERVICES))

    class Registration(reg.RegistrationBase):  # type: ignore[misc,name-defined]  # generated base is untyped
        async def get_info(self, info_request: Any) -> Any:
            return reg.PluginInfo(type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=supported)

        async def notify_registration_status(self, registration_status: Any) -> Any:
            on_status(bool(registration_status.plugin_registered), str(registration_status.error))
            return reg.RegistrationStatusResponse()

    return Registration()


def _claims(request: Any) -> list[Claim]:
    return [Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


async def _prepare_one(claims: Claims, claim: Claim) -> tuple[tuple[PreparedDevice, ...], str]:
    try:
        return await asyncio.to_thread(claims.prepare, claim), ""
    except ClaimError as exc:
        log.warning("prepare %s (uid %s): refused: %s", claim, claim.uid, exc)
        return (), str(exc)
    except Exception as exc:  # never let one claim take the service down
        log.error("prepare %s (uid %s): failed: %s: %s", claim, claim.uid, type(exc).__name__, exc)
        return (), f"{type(exc).__name__}: {exc}"


async def _unprepare_one(claims: Claims, claim: Claim) -> str:
    try:
        await asyncio.to_thread(claims.unprepare, claim)
        return ""
    except ClaimError as exc:
        log.warning("unprepare %s (uid %s): failed: %s", claim, claim.uid, exc)
        return str(exc)
    except Exception as exc:
        log.error("unprepare %s (uid %s): failed: %s: %s", claim, claim.uid, type(exc).__name__, exc)
        return f"{type(exc).__name__}: {exc}"


def dra_service(module: Any, claims: Claims) -> Any:
    """The DRAPlugin service of one generated API version (``api.dra_v1`` or ``api.dra_v1beta1``)."""

    class DraPlugin(module.DraPluginBase):  # type: ignore[misc]  # generated base is untyped
        async def node_prepare_resources(self, node_prepare_resources_request: Any) -> Any:
            wanted = _claims(node_prepare_resources_request)
            results = [await _prepare_one(claims, c) for c in wanted]  # in order: the first claim wins a conflict
            answer = {}
            for claim, (devices, error) in zip(wanted, results, strict=True):
                answer[claim.uid] = module.NodePrepareResourceResponse(
                    devices=[
                        module.Device(
                            request_names=list(d.requests),
                            pool_name=d.pool,
                            device_name=d.device,
                            cdi_device_ids=list(d.cdi_ids),
                        )
                        for d in devices
                    ],
                    error=error,
                )
            return module.NodePrepareResourcesResponse(claims=answer)

        async def node_unprepare_resources(self, node_unprepare_resources_request: Any) -> Any:
            wanted = _claims(node_unprepare_resources_request)
            errors = [await _unprepare_one(claims, c) for c in wanted]
            return module.NodeUnprepareResourcesResponse(
                claims={
                    c.uid: module.NodeUnprepareResourceResponse(error=e) for c, e in zip(wanted, errors, strict=True)
                }
            )

    return DraPlugin()


def dra_services(claims: Claims) -> list[Any]:
    """The DRAPlugin service in every API version this plugin announces."""
    return [dra_service(module, claims) for _version, module in api.DRA_SERVICES]
