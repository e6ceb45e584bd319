"""What each side of `mokka bench fleet` is timed by: one watch of its nodes (:class:`Follower`), the
times read from it and from the pods scheduled on them (:class:`Side`), and the waits, which end in
one :class:`BenchError` line naming what did not happen in time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BenchError", "Follower", "Side", "is_ready", "schedule_pods", "wait_until"]


class BenchError(Exception):
    """The bench cannot run here; the message says what to do."""


@dataclass
class Side:
    """One side's seconds: its nodes made and done (Ready; a peer's, Ready with its GPUs) from the first
    write, its pods bound and Running from their Deployment's creation, its nodes gone from their
    deletion (None: not measured)."""

    nodes: int
    made_s: float = 0.0
    ready_s: float = 0.0
    bound_s: float | None = None
    running_s: float | None = None
    deleted_s: float | None = None

    @property
    def rate(self) -> float:
        """Nodes made per second."""
        return self.nodes / self.made_s if self.made_s else 0.0


def is_ready(node: dict[str, Any]) -> bool:
    """Whether ``node`` is Ready."""
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Follower:
    """One watch of the nodes ``selector`` picks: when each was first seen and first done (seconds
    from t0); done is Ready, or what ``done`` says of a node (a peer's nodes: Ready with its GPUs)."""

    def __init__(
        self, core: Any, selector: str, t0: float, done: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        self.core, self.selector, self.t0 = core, selector, t0
        self.done = done or is_ready
        self.seen: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        listed = json.loads(core.list_node(label_selector=self.selector, _preload_content=False).data)
        self.version = listed["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True, name="follower")
        self.thread.start()

    def _run(self) -> None:
        from virtualfleet.watch import WatchExpired, watch_events

        def stream(**kw: Any) -> Any:
            return self.core.list_node(label_selector=self.selector, **kw)

        while not self.stop.is_set():
            try:
                for event in watch_events(stream, self.version, timeout=60):
                    obj = event["object"]
                    self.version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    self._saw(event["type"], obj)
                    if self.stop.is_set():
                        return
            except WatchExpired:  # too old: the nodes as they are now, and on from there
                listed = json.loads(self.core.list_node(label_selector=self.selector, _preload_content=False).data)
                names = {obj["metadata"]["name"] for obj in listed["items"]}
                with self.lock:
                    for gone in set(self.seen) - names:
                        self.seen.pop(gone, None)
                        self.ready.pop(gone, None)
                for obj in listed["items"]:
                    self._saw("ADDED", obj)
                self.version = listed["metadata"]["resourceVersion"]
            except Exception:  # a dropped watch: resume from the last version seen
                time.sleep(0.5)

    def _saw(self, kind: str, obj: dict[str, Any]) -> None:
        now, name = time.monotonic() - self.t0, obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.seen.pop(name, None)
                self.ready.pop(name, None)
                return
            self.seen.setdefault(name, now)
            if self.done(obj):
                self.ready.setdefault(name, now)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.seen), len(self.ready)

    def last(self) -> tuple[float, float]:
        with self.lock:
            return max(self.seen.values(), default=0.0), max(self.ready.values(), default=0.0)


def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def schedule_pods(
    api: Any,
    side: Side,
    selector: dict[str, str],
    pods: int,
    settle: float,
    timeout: float,
    progress: Callable[[str], None],
    who: str,
) -> None:
    """``settle`` seconds after ``side``'s nodes are Ready, ``pods`` one-GPU pods on the nodes
    ``selector`` picks: their bound and Running times into ``side`` (nothing without pods)."""
    from .gpu_pods import schedule

    if not pods:
        return
    time.sleep(settle)
    progress(f"{who}: scheduling {pods} one-GPU pods")
    side.bound_s, side.running_s = schedule(api, selector, pods, timeout=timeout)
