"""The fleet controller's watches (:func:`virtualfleet.watch.watch_events`) without a cluster: the
events of one watch decoded from the stream however it is cut, from the version asked, with
bookmarks; an ERROR event raises (410: WatchExpired, so the watch starts over from the current state;
else ApiException); ``watch.follow`` resumes from the last version seen instead of
replaying every object; and the node watch keeps the pools' nodes (:mod:`virtualfleet.nodecache`)
as an informer does."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from virtualfleet import nodecache, pool, watch


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

    queued: list[str] = []

    def to_pool(obj: dict[str, Any]) -> str | None:
        pool = obj.get("metadata", {}).get("labels", {}).get("mokka.io/virtual-pool")
        return str(pool) if pool else None

    thread = threading.Thread(target=watch.follow, args=(stream, to_pool, queued.append, "nodes"), daemon=True)
    thread.start()
    assert done.wait(10)
    assert versions == [None, "7", "9", None, "12"]
    assert queued == ["p", "q", "p"]


class Listed:
    def __init__(self, items: list[dict[str, Any]], version: str) -> None:
        self.data = json.dumps({"metadata": {"resourceVersion": version}, "items": items}).encode()


def test_the_node_watch_keeps_the_pools_nodes_as_an_informer_does() -> None:
    """Listed once, then kept by the events from the list's version; an expired watch lists again,
    and until then reconciles list from the API server (the cache is not synced)."""
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "expired"}}
    answers: list[Any] = [
        Listed([], "1"),  # an empty cache (falsy by its length) keeps what comes
        [{"type": "ADDED", "object": node("z", "1", "s")}, gone],
        Listed([node("a", "2"), node("b", "3", "q")], "5"),
        [{"type": "MODIFIED", "object": node("b", "6", "p")}, {"type": "ADDED", "object": node("c", "7")}],
        [{"type": "DELETED", "object": node("a", "8")}, gone],
        Listed([node("d", "11", "r")], "12"),
    ]
    calls: list[dict[str, Any]] = []
    done, synced_at_the_end = threading.Event(), []
    cache = nodecache.NodeCache()

    def stream(**kw: Any) -> Any:
        calls.append(kw)
        if not answers:
            synced_at_the_end.append(cache.synced.is_set())
            done.set()
            threading.Event().wait()
        answer = answers.pop(0)
        if isinstance(answer, Listed) and calls[:-1]:  # the list after the expired watch: not synced until it
            synced_at_the_end.append(cache.synced.is_set())
        return answer if isinstance(answer, Listed) else Response(answer)

    queued: list[str] = []
    args = (stream, lambda o: None, queued.append, "nodes", cache)
    thread = threading.Thread(target=watch.follow, args=args, daemon=True)
    thread.start()
    assert done.wait(10)
    assert [(c.get("watch", False), c.get("resource_version")) for c in calls] == [
        (False, None),
        (True, "1"),
        (False, None),
        (True, "5"),
        (True, "7"),
        (False, None),
        (True, "12"),
    ]
    # s added; the list: s gone, p and q; b moved from q to p; c added; a deleted; the last list: p, q gone, r
    assert queued == ["s", "p", "q", "s", "p", "q", "p", "p", "p", "r"]
    assert synced_at_the_end == [False, False, True] and set(cache.nodes("r")) == {"d"} and cache.nodes("p") == {}
    assert cache.size() == 1


def test_the_node_cache_keeps_what_the_controller_reads() -> None:
    full = {
        "metadata": {
            "name": "virtual-p-0",
            "uid": "u-1",
            "resourceVersion": "9",
            "labels": {"mokka.io/virtual-pool": "p", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "annotations": {
                "mokka.io/pool-digest": "abc",
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "managedFields": [{"manager": "kwok"}],
        },
        "spec": {"taints": []},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "1k"},
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "r", "message": "m", "lastHeartbeatTime": "t"}
            ],
            "images": [],
        },
    }
    cache = nodecache.NodeCache()
    assert not cache.synced.is_set()
    assert cache.replace([full]) == {"p"} and cache.synced.is_set()
    kept = cache.nodes("p")["virtual-p-0"]
    assert kept == {
        "metadata": {
            "name": "virtual-p-0",
            "uid": "u-1",
            "resourceVersion": "9",
            "labels": full["metadata"]["labels"],
            "annotations": {"mokka.io/pool-digest": "abc", "kwok.x-k8s.io/node": "fake"},
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "r", "message": "m"}],
            "allocatable": {"nvidia.com/gpu": "8"},
        },
    }
    assert pool.ready(kept) and pool.kept_by_kwok(kept)
    unlabelled = {"metadata": {"name": "virtual-p-0", "labels": {}}}
    assert cache.apply("MODIFIED", unlabelled) == {"p"} and cache.nodes("p") == {} and cache.size() == 0
    assert cache.apply("BOOKMARK", full) == set()
    cache.unsync()
    assert not cache.synced.is_set()


def test_the_controllers_own_writes_never_hide_what_the_watch_told_since() -> None:
    """A create's answer is kept only where the watch has not brought the node yet; a patch's only
    where the node is still the version the patch was made from. (KWOK readied a node between its
    create and the answer being kept: the answer hid the Ready event, the pool stayed at 2 of 3.)"""
    cache = nodecache.NodeCache()
    cache.replace([])

    def version(name: str) -> str:
        return cache.nodes("p")[name]["metadata"]["resourceVersion"]  # type: ignore[no-any-return]

    cache.wrote(node("a", "5"))  # made, before its watch event
    assert version("a") == "5"
    cache.apply("ADDED", node("b", "6"))  # the watch was quicker: made, then readied by KWOK
    cache.apply("MODIFIED", node("b", "7"))
    cache.wrote(node("b", "6"))  # the create's answer, late
    assert version("b") == "7"
    read = cache.nodes("p")["a"]
    cache.wrote(node("a", "8"), read=read)  # a patch of the version read: kept
    assert version("a") == "8"
    cache.apply("MODIFIED", node("a", "10"))  # a newer event came before the next patch's answer
    cache.wrote(node("a", "9"), read=read)
    assert version("a") == "10"
    cache.wrote(node("c", "11"), read=node("c", "3"))  # patched a node the cache does not hold: the watch brings it
    assert set(cache.nodes("p")) == {"a", "b"}


def test_a_heartbeat_reconciles_nothing() -> None:
    """KWOK's heartbeats change only the conditions' times (not kept): the event touches no pool, and
    the node's version is still kept (a patch made from it is then kept too)."""

    def ready(version: str, beat: str, status: str = "True") -> dict[str, Any]:
        got = node("a", version)
        got["status"] = {"conditions": [{"type": "Ready", "status": status, "lastHeartbeatTime": beat}]}
        return got

    cache = nodecache.NodeCache()
    assert cache.replace([ready("1", "t0")]) == {"p"}
    assert cache.apply("MODIFIED", ready("2", "t1")) == set()
    assert cache.nodes("p")["a"]["metadata"]["resourceVersion"] == "2"
    assert cache.apply("MODIFIED", ready("3", "t2", status="False")) == {"p"}  # NotReady: the pool is told
    assert cache.apply("MODIFIED", {**ready("4", "t3", "False"), "metadata": node("a", "4", "q")["metadata"]}) == {
        "p",
        "q",
    }  # moved to another pool
    assert cache.apply("DELETED", node("a", "5", "q")) == {"q"}
