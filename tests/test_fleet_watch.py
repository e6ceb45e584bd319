"""The fleet controller's watches (:func:`virtualfleet.watch.watch_events`) without a cluster: the
events of one watch decoded from the stream however it is cut, from the version asked, with
bookmarks; an ERROR event raises (410: WatchExpired, so the watch starts over from the current state;
else ApiException); and ``Controller._watch`` resumes from the last version seen instead of
replaying every object."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from virtualfleet import controller, watch


class Response:
    def __init__(self, events: list[dict[str, Any]], cut: int = 7) -> None:
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.chunks = [data[i : i + cut] for i in range(0, len(data), cut)]
        self.released = False

    def stream(self, amt: int, decode_content: bool = True) -> Any:
        yield from self.chunks

    def release_conn(self) -> None:
        self.released = True


def node(name: str, version: str, pool: str = "p") -> dict[str, Any]:
    labels = {"mokka.io/virtual-pool": pool}
    return {"metadata": {"name": name, "resourceVersion": version, "labels": labels}}


def test_events_are_decoded_from_the_stream_however_it_is_cut() -> None:
    events = [{"type": "ADDED", "object": node("a", "1")}, {"type": "BOOKMARK", "object": node("", "5")}]
    calls: list[dict[str, Any]] = []
    resp = Response(events, cut=3)

    def stream(**kw: Any) -> Response:
        calls.append(kw)
        return resp

    assert list(watch.watch_events(stream, "4")) == events
    assert calls == [
        {
            "_preload_content": False,
            "watch": True,
            "timeout_seconds": 300,
            "allow_watch_bookmarks": True,
            "resource_version": "4",
        }
    ]
    assert resp.released
    list(watch.watch_events(stream, None))
    assert "resource_version" not in calls[-1]


def test_an_error_event_raises() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version: 4 (9)"}}
    with pytest.raises(watch.WatchExpired, match="too old"):
        list(watch.watch_events(lambda **kw: Response([gone]), "4"))
    other = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}}
    with pytest.raises(ApiException, match="boom"):
        list(watch.watch_events(lambda **kw: Response([other]), "4"))


def test_a_watch_resumes_from_the_last_version_seen() -> None:
    """A watch the server closes goes on from its last version; one expired starts over (no version)."""
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "expired"}}
    answers = [
        [{"type": "ADDED", "object": node("a", "3")}, {"type": "MODIFIED", "object": node("b", "7", "q")}],
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}],
        [gone],
        [{"type": "ADDED", "object": node("c", "12")}],
    ]
    versions: list[str | None] = []
    done = threading.Event()

    def stream(**kw: Any) -> Response:
        versions.append(kw.get("resource_version"))
        if not answers:
            done.set()
            threading.Event().wait()  # the (daemon) watch thread waits here for good
        return Response(answers.pop(0))

    ctl = object.__new__(controller.Controller)
    queued: list[str] = []
    ctl.enqueue = queued.append  # type: ignore[method-assign, assignment]

    def to_pool(obj: dict[str, Any]) -> str | None:
        pool = obj.get("metadata", {}).get("labels", {}).get("mokka.io/virtual-pool")
        return str(pool) if pool else None

    thread = threading.Thread(target=ctl._watch, args=(stream, to_pool, "nodes"), daemon=True)
    thread.start()
    assert done.wait(10)
    assert versions == [None, "7", "9", None, "12"]
    assert queued == ["p", "q", "p"]
