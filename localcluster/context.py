"""What a cluster's nodes and add-ons may use of it, passed in (never imported from
:mod:`.cluster`): its layout and state, the API server (:class:`~.apiserver.ApiServer`), its
processes (:class:`~.processes.Processes`), the cache, its real nodes, waits, steps and images.

A :class:`~.cluster.Cluster` is a Context that also knows how to come up, go down and report
status; an add-on (:mod:`.addons`) gets the Context alone."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpumodel.profile import Profile

from .apiserver import ApiServer
from .errors import ClusterError
from .layout import Layout, Ports
from .node import Node
from .processes import READY_TIMEOUT, Processes
from .state import State

__all__ = ["Context", "Progress"]

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class Context:
    def __init__(self, layout: Layout, state: State) -> None:
        self.layout = layout
        self.state = state
        self.processes = Processes(state, self.save, layout.logs)
        self.progress: Progress = _quiet  # one line per step while ``up`` runs
        self.profiles: dict[str, Profile] = {}  # each real node's profile, while ``up`` runs
        self._apiserver: ApiServer | None = None

    def save(self) -> None:
        self.state.write(self.layout.state_file)

    # ------------------------------------------------------------------ facts

    @property
    def options(self) -> dict[str, Any]:
        """``mokka cluster up``'s options, as given (:class:`~.cluster.Options`, as JSON)."""
        return self.state.options

    @property
    def cache(self) -> Path | None:
        """The cache the cluster was brought up with (None: the default one)."""
        cache = self.options.get("cache")
        return Path(cache) if cache else None

    @property
    def ports(self) -> Ports:
        return Ports(**self.state.ports)

    @property
    def apiserver(self) -> ApiServer:
        if self._apiserver is None:
            server = f"https://127.0.0.1:{self.ports.apiserver}"
            self._apiserver = ApiServer(server, self.layout.pki, self.layout.admin_kubeconfig, self.cache)
        return self._apiserver

    @property
    def nodes(self) -> list[Node]:
        """The real nodes, in order."""
        return [Node(self, i) for i in range(len(self.state.nodes))]

    def node(self, name: str | None = None) -> Node:
        """Node ``name`` (default: the first node)."""
        nodes = self.nodes
        if not nodes:
            raise ClusterError("the cluster has no node")
        if name is None:
            return nodes[0]
        for n in nodes:
            if n.name == name:
                return n
        raise ClusterError(f"no node {name!r} in this cluster (its nodes: {', '.join(n.name for n in nodes)})")

    # ------------------------------------------------------------------ doing

    def wait(self, what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT, poll: float = 0.1) -> float:
        """Seconds until ``check`` holds, asked every ``poll`` seconds; a ClusterError when a cluster
        process exits or ``timeout`` passes first."""
        return self.processes.wait(what, check, timeout, poll)

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        """One step of ``up``: its time kept in the state's timings, one progress line."""
        t0 = time.monotonic()
        yield
        took = time.monotonic() - t0
        self.state.timings[title] = round(took, 2)
        self.progress(f"{title} ({took:.1f}s)")

    def each(self, what: str, fn: Callable[[Node], object]) -> None:
        """``fn`` on every node; a failure names the node and the step."""
        for n in self.nodes:
            try:
                fn(n)
            except ClusterError as exc:
                raise ClusterError(f"node {n.name}: {what}: {exc}") from None
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                raise ClusterError(f"node {n.name}: {what}: {exc}") from None

    def wait_each(self, what: str, check: Callable[[Node], bool], timeout: float = READY_TIMEOUT) -> None:
        """Wait until ``check`` holds for every node; a failure names the node: the one whose process
        exited, else those still waiting when time ran out."""
        try:
            self.wait(what, lambda: all(check(n) for n in self.nodes), timeout)
        except ClusterError as exc:
            dead = [p.name for p in self.processes.all() if "@" in p.name and not p.alive()]
            if dead:
                named = sorted({d.split("@", 1)[1] for d in dead})
                raise ClusterError(
                    f"node {', '.join(named)}: {what}: {', '.join(dead)} exited; logs in {self.layout.logs}"
                ) from None
            waiting = [n.name for n in self.nodes if not check(n)]
            raise ClusterError(f"node {', '.join(waiting) or '?'}: {exc}") from None

    def import_image(self, tarball: Path) -> None:
        """Import an image archive into every node's containerd, the nodes in parallel (each
        containerd unpacks it); a failure names the node."""

        def one(n: Node) -> None:
            try:
                n.ctr("images", "import", str(tarball.absolute()))
            except ClusterError as exc:
                raise ClusterError(f"node {n.name}: image {tarball.name}: {exc}") from None

        nodes = self.nodes
        with ThreadPoolExecutor(max(1, len(nodes))) as pool:
            list(pool.map(one, nodes))
