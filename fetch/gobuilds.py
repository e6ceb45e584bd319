"""prepare's Go builds in the background, in order, sharing one module cache and one build cache.

A build runs on a thread of its own while ``fetch.prepare`` goes on with the items before it that
need no Go (Debian packages, kind's node image); the items that need a build wait for it. The builds
share Go's module and build caches (Go makes both safe for concurrent use): Kubernetes' kubeadm and
the GPU Operator's NFD then compile almost nothing the Kubernetes and NFD builds did not, and the
modules several programs require are downloaded once. The shared caches live in
``CACHE/.go-caches-<pid>/`` (about 11 GB at the end of a cold ``--tests``) and are removed by
:meth:`GoBuilds.close` (or by the next run, when the process that made them is gone).

One build at a time (:data:`JOBS`): one ``go build`` already keeps both of this machine's cores busy
(measured cold: kind 85 s of CPU in 45 s, the registry 326 s in 173 s); two at once took as long as
one after the other (212 s against 218 s).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fetch import gotool, versions
from fetch.kube import gobuild as kube_gobuild

__all__ = ["JOBS", "GoBuilds", "Spec"]

JOBS = 1  # builds at once (see above)
Spec = versions.GoBuild | kube_gobuild.GoBuild


def _minimum(spec: Spec) -> tuple[int, int]:
    return spec.go if isinstance(spec, kube_gobuild.GoBuild) else versions.GO_MINIMUM


def _cached(spec: Spec, cache: Path) -> bool:
    if isinstance(spec, kube_gobuild.GoBuild):
        return kube_gobuild.cached(spec, cache) is not None
    return gotool.cached(spec, cache) is not None


class GoBuilds:
    """``start(specs)`` queues the builds not cached yet, in order, ``jobs`` at a time;
    ``wait(specs)`` returns once those of them queued are built (raising the first build's error)."""

    def __init__(self, cache: Path, jobs: int = JOBS) -> None:
        self.cache = cache
        self.caches = cache / f".go-caches-{os.getpid()}"
        self.pool = ThreadPoolExecutor(jobs, thread_name_prefix="go-build")
        self.futures: dict[Spec, Future[Path]] = {}
        for left in cache.glob(".go-caches-*"):  # a run killed midway
            pid = left.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                gotool.remove_tree(left)

    def start(self, specs: Iterable[Spec]) -> None:
        todo = [s for s in dict.fromkeys(specs) if s not in self.futures and not _cached(s, self.cache)]
        for minimum in sorted({_minimum(s) for s in todo}):  # each toolchain fetched once, before the threads
            gotool.find(self.cache, minimum)
        for spec in todo:
            self.futures[spec] = self.pool.submit(self._build, spec)

    def wait(self, specs: Iterable[Spec]) -> None:
        for spec in specs:
            if spec in self.futures:
                self.futures[spec].result()

    def close(self) -> None:
        """Drop the builds not started, wait for the running ones, remove the shared caches."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        gotool.remove_tree(self.caches)

    def _build(self, spec: Spec) -> Path:
        if isinstance(spec, kube_gobuild.GoBuild):
            return kube_gobuild.build(spec, self.cache, caches=self.caches)
        return gotool.build(spec, self.cache, caches=self.caches)
