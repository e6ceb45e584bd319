"""One watch of a Kubernetes list, read as it streams: its events from a resource version, with
bookmarks, so that a watch the API server closes (it closes slow watchers when busy) resumes where
it stopped instead of replaying every object. The client library's own Watch tracks no resource
version when it does not decode the objects, which is why this reads the stream itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["WatchExpired", "watch_events"]

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
