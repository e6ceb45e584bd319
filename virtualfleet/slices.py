"""A virtual node's ResourceSlices, one per DRA driver, as that driver's kubelet plugin keeps them:
made once, owned by the Node (deleting the node deletes them), replaced with the pool generation
one higher when what they hold changes."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["publish"]

Json = dict[str, Any]


def publish(api: Any, node: str, driver: str, devices: list[Json], owner_uid: str) -> None:
    """``node``'s one ResourceSlice of ``driver`` holding ``devices`` (``api``: a ResourceV1Api)."""
    from kubernetes.client.rest import ApiException

    from k8snode.dra import resources

    selector = f"spec.nodeName={node},spec.driver={driver}"
    found = json.loads(api.list_resource_slice(field_selector=selector, _preload_content=False).data)["items"]
    if not found:
        body = resources.slice_of(devices, node, driver=driver, owner_uid=owner_uid)
        try:
            api.create_resource_slice(body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:  # made meanwhile: the next pass replaces it
                raise
        return
    for item in found:
        generation = int(item["spec"]["pool"].get("generation", 1)) + 1
        body = resources.slice_of(devices, node, driver=driver, generation=generation, owner_uid=owner_uid)
        body["metadata"] = item["metadata"]
        api.replace_resource_slice(item["metadata"]["name"], body, _preload_content=False)
