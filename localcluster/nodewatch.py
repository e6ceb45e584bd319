"""Many Node objects followed through one watch of the API server: which of a set of nodes hold
a condition yet (Ready with their GPUs, say). A list of thousands of nodes every few seconds
costs the API server and this process seconds of CPU each time; a watch sends each node once,
then its changes.

``NodeWatch(apiserver, selector, names, done).poll(seconds)`` lists the nodes once (from the API
server's watch cache), then reads the watch's events from that list's version for up to ``seconds``
at a time, and says whether every named node satisfies ``done``; the cluster's ``wait`` calls it
until then (checking the cluster's processes in between). A watch whose version is too old lists
again.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .apiserver import ApiServer

__all__ = ["NodeWatch", "ready"]

Json = dict[str, Any]


def ready(node: Json) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class NodeWatch:
    def __init__(self, apiserver: ApiServer, selector: str, names: Iterable[str], done: Callable[[Json], bool]) -> None:
        self.apiserver = apiserver
        self.selector = selector
        self.names = set(names)
        self.done = done
        self.pending = set(self.names)
        self.version: str | None = None  # None: list every node first (then watch from the list's version)

    def poll(self, seconds: float = 2.0) -> bool:
        """Events for up to ``seconds``; True once every named node satisfies ``done``."""
        if not self.pending:
            return True
        try:
            if self.version is None:
                self._list()
                return not self.pending
            query = {
                "watch": "1",
                "resourceVersion": self.version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(max(1, int(seconds))),
            }
            with self._get(query, seconds + 10) as res:
                for line in res:
                    if self._event(json.loads(line)):
                        return True
        except (OSError, ValueError):
            pass  # the API server is busy or restarting: the next poll watches again
        return not self.pending

    def _get(self, query: dict[str, str], timeout: float) -> Any:
        params = urllib.parse.urlencode({"labelSelector": self.selector, **query})
        url = f"{self.apiserver.server}/api/v1/nodes?{params}"
        return urllib.request.urlopen(url, context=self.apiserver.ssl_context(), timeout=timeout)

    def _list(self) -> None:
        """Every node as the watch cache has it (resourceVersion 0: no read of etcd), and the version
        the watch continues from."""
        with self._get({"resourceVersion": "0"}, 60) as res:
            found = json.loads(res.read())
        self.pending = set(self.names)
        for obj in found.get("items") or []:
            self._seen(obj, present=True)
        self.version = found["metadata"]["resourceVersion"]

    def _event(self, event: Json) -> bool:
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":  # too old a version (410): list again
            self.version = None
            return False
        self.version = obj.get("metadata", {}).get("resourceVersion", self.version)
        if event.get("type") != "BOOKMARK":
            self._seen(obj, present=event.get("type") != "DELETED")
        return not self.pending

    def _seen(self, obj: Json, present: bool) -> None:
        name = obj.get("metadata", {}).get("name")
        if name not in self.names:
            return
        if present and self.done(obj):
            self.pending.discard(name)
        else:
            self.pending.add(name)
