"""What the plugin asks of the API server, through the ``kubernetes`` client (resource.k8s.io/v1).

- publish the node's one ResourceSlice of the driver: created once, replaced (pool generation + 1)
  only when its devices change, extra slices of this driver on this node deleted;
- create the driver's DeviceClass (``gpu.nvidia.com``) when the cluster has none (an existing one
  is left exactly as it is: NVIDIA's chart or the admin may own it);
- read a ResourceClaim for NodePrepareResources.

Objects travel as plain JSON (``_preload_content=False``): the plugin needs a handful of fields,
not the client's model classes, and keeps working with fields newer than the client.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .resources import Inventory, slice_of

__all__ = ["Cluster", "ClusterError", "api_reason", "load_client"]

log = logging.getLogger("mokka.dra")

Json = dict[str, Any]


class ClusterError(Exception):
    """An API call failed; the message names the object and the server's reason."""


def load_client(kubeconfig: str | None = None) -> Any:
    """An ``ApiClient``: from ``kubeconfig`` when given, else in-cluster, else ``$KUBECONFIG``/``~/.kube/config``."""
    from kubernetes import client, config

    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            return config.new_client_from_config()
    except (config.ConfigException, OSError) as exc:
        raise ClusterError(
            f"no Kubernetes API configuration ({kubeconfig or 'in-cluster, $KUBECONFIG'}): {exc}"
        ) from None


def _body(response: Any) -> Json:
    data = json.loads(response.data)
    if not isinstance(data, dict):
        raise ClusterError(f"unexpected API answer: {str(data)[:200]}")
    return data


def api_reason(exc: Exception) -> str:
    """A ``kubernetes`` client error in one line: the status and the API server's message."""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return f"{getattr(exc, 'status', '')} {message}".strip()
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    return f"{status} {reason}" if status else str(exc)


class Cluster:
    """The API calls of one plugin, for one node and driver."""

    def __init__(self, api_client: Any, node: str, driver: str) -> None:
        from kubernetes import client

        self.node = node
        self.driver = driver
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self._api_exception: type[Exception] = client.ApiException

    # ---- ResourceSlice --------------------------------------------------------------------

    def slices(self) -> list[Json]:
        selector = f"spec.nodeName={self.node},spec.driver={self.driver}"
        try:
            items = _body(self.resource.list_resource_slice(field_selector=selector, _preload_content=False))
        except self._api_exception as exc:
            raise ClusterError(f"cannot list ResourceSlices ({selector}): {api_reason(exc)}") from None
        return list(items.get("items") or [])

    def _node_uid(self) -> str | None:
        try:
            return str(_body(self.core.read_node(self.node, _preload_content=False))["metadata"]["uid"])
        except self._api_exception as exc:
            log.info("Node %s not readable (%s): the ResourceSlice gets no owner", self.node, api_reason(exc))
            return None

    def publish(self, inventory: Inventory) -> str:
        """Make this node's slice hold ``inventory``'s devices; returns the slice's name."""
        existing = self.slices()
        keep, extra = (existing[0], existing[1:]) if existing else (None, [])
        for obj in extra:
            name = obj["metadata"]["name"]
            try:
                self.resource.delete_resource_slice(name, _preload_content=False)
            except self._api_exception as exc:
                raise ClusterError(f"cannot delete extra ResourceSlice {name}: {api_reason(exc)}") from None
        devices = list(inventory.devices)
        if keep is None:
            body = slice_of(devices, self.node, driver=self.driver, owner_uid=self._node_uid())
            try:
                created = _body(self.resource.create_resource_slice(body, _preload_content=False))
            except self._api_exception as exc:
                raise ClusterError(f"cannot create the ResourceSlice of node {self.node}: {api_reason(exc)}") from None
            name = str(created["metadata"]["name"])
            log.info("published ResourceSlice %s: %s, pool %s", name, inventory.summary, self.node)
            return name
        name = str(keep["metadata"]["name"])
        spec = keep.get("spec") or {}
        generation = int((spec.get("pool") or {}).get("generation") or 0)
        if spec.get("devices") == devices and (spec.get("pool") or {}).get("name") == self.node:
            log.info("ResourceSlice %s is up to date: %s", name, inventory.summary)
            return name
        body = slice_of(devices, self.node, driver=self.driver, generation=generation + 1)
        body["metadata"] = dict(keep["metadata"])  # name, resourceVersion, owner: replace in place
        try:
            self.resource.replace_resource_slice(name, body, _preload_content=False)
        except self._api_exception as exc:
            raise ClusterError(f"cannot update ResourceSlice {name}: {api_reason(exc)}") from None
        log.info("updated ResourceSlice %s: %s, pool generation %d", name, inventory.summary, generation + 1)
        return name

    def unpublish(self) -> int:
        """Delete this node's slices of this driver; how many there were."""
        existing = self.slices()
        for obj in existing:
            try:
                self.resource.delete_resource_slice(obj["metadata"]["name"], _preload_content=False)
            except self._api_exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise ClusterError(
                        f"cannot delete ResourceSlice {obj['metadata']['name']}: {api_reason(exc)}"
                    ) from None
        return len(existing)

    # ---- DeviceClass ----------------------------------------------------------------------

    def ensure_device_class(self, body: Json) -> bool:
        """Create the DeviceClass ``body`` (named after the driver) unless one of that name exists;
        whether it was created."""
        try:
            self.resource.read_device_class(self.driver, _preload_content=False)
            return False
        except self._api_exception as exc:
            if getattr(exc, "status", None) != 404:
                raise ClusterError(f"cannot read DeviceClass {self.driver}: {api_reason(exc)}") from None
        try:
            self.resource.create_device_class(body, _preload_content=False)
        except self._api_exception as exc:
            if getattr(exc, "status", None) == 409:  # created meanwhile by someone else
                return False
            raise ClusterError(f"cannot create DeviceClass {self.driver}: {api_reason(exc)}") from None
        log.info("created DeviceClass %s", self.driver)
        return True

    # ---- ResourceClaim --------------------------------------------------------------------

    def read_claim(self, namespace: str, name: str) -> Json | None:
        try:
            return _body(self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
        except self._api_exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise ClusterError(api_reason(exc)) from None
