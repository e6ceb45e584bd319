"""One watch of a Kubernetes list, read as it streams: its events from a resource version, with
bookmarks, so that a watch the API server closes (it closes slow watchers when busy) resumes where
it stopped instead of replaying every object (:func:`follow`, the controller's watches, optionally
as an informer keeping a :class:`~.nodecache.NodeCache`). The client library's own Watch tracks no
resource version when it does not decode the objects, which is why this reads the stream itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .nodecache import NodeCache

__all__ = ["WatchExpired", "follow", "watch_events"]

log = logging.getLogger("mokka.fleet")

Json = dict[str, Any]


class WatchExpired(Exception):
    """The watch's resource version is too old (410): watch again from the current state."""


def watch_events(stream: Callable[..., Any], version: str | None, timeout: int = 300) -> Iterator[Json]:
    """The events (``{"type", "object"}``, decoded JSON) of one watch made by ``stream`` (a list
    call of the client), from ``version`` (None: the current state, every object ADDED first), with
    bookmarks; until the server ends it. An ERROR event raises: :class:`WatchExpired` for 410, else
    an ``ApiException``."""
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

    kw: dict[str, Any] = {"watch": True, "timeout_seconds": timeout, "allow_watch_bookmarks": True}
    if version is not None:
        kw["resource_version"] = version
    resp = stream(_preload_content=False, **kw)
    try:
        rest = b""
        for chunk in resp.stream(2**16, decode_content=True):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise WatchExpired(status.get("message", "410"))
                    raise ApiException(status=status.get("code"), reason=status.get("message"))
                yield event
    finally:
        resp.release_conn()


def follow(
    stream: Callable[..., Any],
    to_pool: Callable[[Json], str | None],
    enqueue: Callable[[str], None],
    what: str,
    cache: NodeCache | None = None,
) -> None:
    """Pool names from ``stream``'s watch to ``enqueue``, for good, resumed where it ended: a watch the
    API server closes (a busy server drops slow watchers) goes on from the last version seen instead of
    starting over, which would replay every object as ADDED (at 10,000 nodes, every few seconds). With
    ``cache``, as an informer: a list fills it first and the watch goes on from the list's version,
    each event kept in it; the pools are those the cache says an event touched."""
    version: str | None = None  # None: from the current state (the first watch, or one expired)
    while True:
        try:
            if version is None and cache is not None:
                listed = json.loads(stream(_preload_content=False).data)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                for name in sorted(cache.replace(listed.get("items") or [])):
                    enqueue(name)
            for event in watch_events(stream, version):
                version = event["object"].get("metadata", {}).get("resourceVersion") or version
                if event["type"] == "BOOKMARK":
                    continue
                names = cache.apply(event["type"], event["object"]) if cache is not None else {to_pool(event["object"])}
                for name in sorted(n for n in names if n):
                    enqueue(name)
        except WatchExpired as exc:
            log.info("watch of %s: %s: watching from now", what, exc)
            version = None
            if cache is not None:
                cache.unsync()  # reconciles list from the API server until the list above refills it
        except Exception as exc:  # the API server restarting, a dropped connection: watch again
            log.warning("watch of %s ended: %s", what, exc)
            time.sleep(2)
