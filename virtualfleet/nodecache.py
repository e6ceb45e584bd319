"""The pools' nodes as the controller last saw them: listed once, then kept by the node watch's
events (an informer's store), so that a reconcile reads its pool's nodes from memory instead of
listing every one of them from the API server (at 10,000 nodes, a list of about 100 MB of JSON per
pass, twice).

Only what the controller reads of a node is kept (:func:`slim`): its name, uid, resource version,
labels, Mokka's and KWOK's annotations, its conditions without their times, and its allocatable GPUs;
label keys and values, which the nodes of a pool share, are interned. An event that changes none of
that (KWOK's heartbeats, which change only times) touches no pool: nothing is reconciled for it.

The controller's own writes are kept at once (:meth:`NodeCache.wrote`), so that the pass that made
them counts them, but never over what the watch has told since: the watch's events come in order and
bring each write too, while an answer kept after a newer event would hide that event for good.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from typing import Any

from . import pool as pools

__all__ = ["NodeCache", "slim"]

Json = dict[str, Any]

# The annotations the controller reads (its digest's is named by the controller: every mokka.io/ one is kept).
_ANNOTATION_PREFIXES = ("mokka.io/", pools.KWOK_ANNOTATION[0])
_CONDITION_KEYS = ("type", "status", "reason", "message")


def _interned(mapping: dict[str, str]) -> dict[str, str]:
    return {sys.intern(k): sys.intern(v) if isinstance(v, str) else v for k, v in mapping.items()}


def slim(node: Json) -> Json:
    """What the controller reads of Node object ``node`` (the rest of it is KWOK's and the kubelet's)."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(_ANNOTATION_PREFIXES)}
    conditions = [
        {k: sys.intern(c[k]) for k in _CONDITION_KEYS if isinstance(c.get(k), str)}
        for c in status.get("conditions") or []
    ]
    gpus = (status.get("allocatable") or {}).get("nvidia.com/gpu")
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": _interned(meta.get("labels") or {}),
            "annotations": annotations,
        },
        "status": {"conditions": conditions, "allocatable": {"nvidia.com/gpu": gpus} if gpus is not None else {}},
    }


def _version(node: Json) -> str | None:
    return (node.get("metadata") or {}).get("resourceVersion")


def _same(here: Json | None, node: Json) -> bool:
    """Whether slim ``node`` shows what ``here`` shows (its version aside): KWOK's heartbeats change
    only times the cache does not keep, and reconcile nothing."""
    if here is None or here["status"] != node["status"]:
        return False
    return {**here["metadata"], "resourceVersion": None} == {**node["metadata"], "resourceVersion": None}


def _pool_of(node: Json) -> str | None:
    return ((node.get("metadata") or {}).get("labels") or {}).get(pools.POOL_LABEL) or None


class NodeCache:
    """Every node that carries a pool's label, by pool. ``synced`` is set once a list filled it;
    until then (and after :meth:`unsync`) the controller lists from the API server instead."""

    def __init__(self) -> None:
        self._by_pool: dict[str, dict[str, Json]] = {}
        self._pool_of: dict[str, str] = {}  # node -> its pool, to move or drop it
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def replace(self, items: Iterable[Json]) -> set[str]:
        """The cache made of a list's ``items``; the pools that had or have nodes (each to reconcile)."""
        with self._lock:
            before = set(self._by_pool)
            self._by_pool, self._pool_of = {}, {}
            for node in items:
                self._put(slim(node))
            self.synced.set()
            return before | set(self._by_pool)

    def apply(self, kind: str, node: Json) -> set[str]:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``) or the controller's own delete
        (its watch event follows); the pools it touched (a node whose pool label changed touches both)."""
        name = (node.get("metadata") or {}).get("name")
        if not name or kind not in ("ADDED", "MODIFIED", "DELETED"):
            return set()
        kept = slim(node) if kind != "DELETED" else None
        with self._lock:
            if kept is not None and _same(self._here(name), kept):
                self._by_pool[self._pool_of[name]][name] = kept  # its version only: nothing to reconcile
                return set()
            touched = {p} if (p := self._drop(name)) else set()
            if kept is not None and (pool := self._put(kept)):
                touched.add(pool)
            return touched

    def wrote(self, node: Json, read: Json | None = None) -> None:
        """The controller's own write of ``node`` (the answer to a create, or to a patch of the
        version ``read``), kept unless the watch has told of the node since: a create's answer only
        where the node is not here yet, a patch's only where the node here is still the version it
        was made from. (KWOK readying a node between its create and the create's answer being kept
        left the node NotReady here while it was Ready.)"""
        name = (node.get("metadata") or {}).get("name")
        if not name:
            return
        with self._lock:
            here = self._here(name)
            if read is None and here is not None:
                return
            if read is not None and (here is None or _version(here) != _version(read)):
                return
            self._drop(name)
            self._put(slim(node))

    def nodes(self, pool: str) -> dict[str, Json]:
        """Pool ``pool``'s nodes by name (a copy of the mapping; the nodes are not to be changed)."""
        with self._lock:
            return dict(self._by_pool.get(pool, {}))

    def unsync(self) -> None:
        """The watch lost its place: read from the API server until the next list."""
        self.synced.clear()

    def size(self) -> int:
        """Nodes kept (no ``__len__``: an empty cache must not read as no cache)."""
        return len(self._pool_of)

    def _here(self, name: str) -> Json | None:
        pool = self._pool_of.get(name)
        return self._by_pool.get(pool, {}).get(name) if pool is not None else None

    def _put(self, kept: Json) -> str | None:
        """Slim node ``kept`` under its pool (none: not kept); that pool."""
        pool = _pool_of(kept)
        if pool is None:
            return None
        name = kept["metadata"]["name"]
        self._by_pool.setdefault(pool, {})[name] = kept
        self._pool_of[name] = pool
        return pool

    def _drop(self, name: str) -> str | None:
        pool = self._pool_of.pop(name, None)
        if pool is not None:
            nodes = self._by_pool.get(pool, {})
            nodes.pop(name, None)
            if not nodes:
                self._by_pool.pop(pool, None)
        return pool
