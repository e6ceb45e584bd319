"""A ``coordination.k8s.io/v1`` Lease as the lock of the Kubernetes client's leader election
(:mod:`kubernetes.leaderelection`, which ships a ConfigMap lock only; Kubernetes' own controllers
elect through Leases).

The election loop is the library's; this is the lock it calls: ``get`` (the record, or the
API's error), ``create`` and ``update`` (the write, made conditional on the resourceVersion
read by the last ``get``, so two candidates never both win one renewal).
"""

from __future__ import annotations

import datetime
from typing import Any

from kubernetes import client  # type: ignore[import-untyped, unused-ignore]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]
from kubernetes.leaderelection.leaderelectionrecord import (  # type: ignore[import-untyped, unused-ignore]
    LeaderElectionRecord,
)

__all__ = ["LeaseLock"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaseLock:
    """The lock ``namespace/name`` held by ``identity`` (the pod's name)."""

    def __init__(self, api: Any, name: str, namespace: str, identity: str) -> None:
        self.api = client.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self._lease: Any = None

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            self._lease = self.api.read_namespaced_lease(name, namespace)
        except ApiException as exc:
            return False, exc
        spec = self._lease.spec
        if spec is None or not spec.holder_identity:
            return True, None
        return True, LeaderElectionRecord(
            spec.holder_identity,
            str(spec.lease_duration_seconds),
            str(spec.acquire_time),
            str(spec.renew_time),
        )

    def _spec(self, record: Any) -> Any:
        now = _now()
        held = self._lease is not None and self._lease.spec is not None
        same = held and self._lease.spec.holder_identity == record.holder_identity
        return client.V1LeaseSpec(
            holder_identity=record.holder_identity,
            lease_duration_seconds=int(float(record.lease_duration)),
            acquire_time=self._lease.spec.acquire_time if same and self._lease.spec.acquire_time else now,
            renew_time=now,
            lease_transitions=(self._lease.spec.lease_transitions or 0) + (0 if same else 1) if held else 0,
        )

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        self._lease = None
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=self._spec(election_record))
        try:
            self._lease = self.api.create_namespaced_lease(namespace, body)
        except ApiException:
            return False
        return True

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        if self._lease is None:
            return False
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, resource_version=self._lease.metadata.resource_version),
            spec=self._spec(updated_record),
        )
        try:
            self._lease = self.api.replace_namespaced_lease(name, namespace, body)
        except ApiException:
            return False
        return True
