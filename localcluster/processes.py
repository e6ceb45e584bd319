"""The cluster's recorded processes (``state.procs``): the control plane's, every node's
(``<process>@<node>``) and the namespace holders; found by name, started in a namespace, waited
on, stopped. Every change is saved at once, so that a ``down`` from another process finds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import namespace, process
from .errors import ClusterError
from .process import Proc
from .state import State

__all__ = ["READY_TIMEOUT", "Processes"]

READY_TIMEOUT = 120.0


class Processes:
    def __init__(self, state: State, save: Callable[[], None], logs: Path) -> None:
        self.state = state
        self.save = save
        self.logs = logs

    def all(self) -> list[Proc]:
        return [Proc(**p) for p in self.state.procs]

    def get(self, name: str) -> Proc | None:
        """Process ``name``: the control plane's, a node's (``<process>@<node>``), or else the first
        node's ``<process>``."""
        procs = self.all()
        found = next((p for p in procs if p.name == name), None)
        if found is None and "@" not in name and self.state.nodes:
            first = f"{name}@{self.state.nodes[0]['name']}"
            found = next((p for p in procs if p.name == first), None)
        return found

    def pid(self, name: str) -> int | None:
        """The pid of process ``name`` while it lives."""
        p = self.get(name)
        return p.pid if p and p.alive() else None

    @property
    def holder(self) -> int | None:
        """The control plane's namespace holder."""
        return self.pid("namespace")

    @property
    def net_holder(self) -> int | None:
        """The holder of the cluster's network namespace (:mod:`.netns`)."""
        return self.pid("netns")

    def record(self, proc: Proc) -> Proc:
        self.state.procs = [p for p in self.state.procs if p["name"] != proc.name] + [asdict(proc)]
        self.save()
        return proc

    def run(self, holder: int | None, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the mount namespace of ``holder`` and the cluster's network namespace."""
        if holder is None:
            raise ClusterError("the namespace is gone (is the cluster down?)")
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(process.in_namespace(holder, argv, self.net_holder), check=False, **kw)

    def spawn(
        self, holder: int | None, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> Proc:
        """A long-running process ``name`` in the mount namespace of ``holder`` (None: the host's)."""
        if (running := self.get(name)) is not None and running.alive():
            raise ClusterError(f"a process named {name!r} runs already")
        return self.record(process.spawn(name, argv, log, holder=holder, env=env, net=self.net_holder))

    def start_holder(self, name: str, spec: dict[str, Any], ns_dir: Path, logs: Path) -> int:
        """A namespace holder (:mod:`.namespace`) with ``spec``'s mounts; the namespace's inode."""
        ns_dir.mkdir(parents=True, exist_ok=True)
        spec_file = ns_dir / "spec.json"
        spec_file.write_text(json.dumps(spec, indent=1))
        ready = ns_dir / "ready"
        argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", namespace.__name__]
        holder = self.record(
            process.spawn(name, [*argv, str(spec_file), str(ready)], logs / "namespace.log", holder=None,
                          net=self.net_holder)
        )  # fmt: skip
        self.wait(name, ready.exists, timeout=30)
        return os.stat(f"/proc/{holder.pid}/ns/mnt").st_ino

    def stop(self, name: str) -> None:
        """Stop process ``name`` (as :meth:`get` finds it) and forget it."""
        p = self.get(name)
        if p is not None:
            p.stop()
            self.state.procs = [q for q in self.state.procs if q["name"] != p.name]
            self.save()

    def wait(self, what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT, poll: float = 0.1) -> float:
        """Seconds until ``check`` holds, asked every ``poll`` seconds; a ClusterError when a cluster
        process exits or ``timeout`` passes first."""
        t0 = time.monotonic()
        while not check():
            dead = [p.name for p in self.all() if not p.alive() and not p.name.startswith("gfd")]
            if dead:
                raise ClusterError(f"waiting for {what}: {', '.join(dead)} exited; logs in {self.logs}")
            if time.monotonic() - t0 > timeout:
                raise ClusterError(f"{what}: not within {timeout:g}s; logs in {self.logs}")
            time.sleep(poll)
        return time.monotonic() - t0
