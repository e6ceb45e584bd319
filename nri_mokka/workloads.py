"""Containers given GPUs as processes on those GPUs: what NVML lists, follows the workloads.

At POST_START_CONTAINER the plugin reads, from the event's raw bytes (``Event``), the
container's id, its init process (the host's PID, NRI's ``Container.pid``), its command
(``args[0]``, what NVML names the process by) and the GPUs it was given, re-derived from what
the container carries (its ``/dev/nvidiaN`` device nodes, else ``NVIDIA_VISIBLE_DEVICES``), so
that a plugin restarted since CreateContainer still knows them. An IMEX daemon (a ComputeDomain's:
given the ``fabric-imex-mgmt`` capability, it manages the fabric and runs nothing on the GPUs
whose nodes its management device brings) is listed nowhere. The memory it uses per GPU is
the annotation ``mokka.io/gpu-memory`` (MiB; ``Gi``/``GiB`` and ``Mi``/``MiB`` suffixes; the
container's, else the pod's; default ``gpumodel.processes.DEFAULT_MEMORY_MIB``).

The state is written by a helper process (``Recorder``: ``python -m nri_mokka.workloads``,
started at the first event and fed one JSON line per change on a pipe): the plugin process
never loads cffi or the profile model, and its loop, which answers CreateContainer, never
waits for a state update. The helper lists each process and watches it (a pidfd, ``Helper``):
when it exits, the helper takes it off at once. So no stop event is needed (the plugin gets
two events per container it lists, one per container it does not, as many as a plugin that
only injects gets), a container gone before its start reached the plugin (a short-lived one:
containerd sends the start and the exit from two goroutines) is never listed, and a stop while
no plugin process runs is seen all the same. The helper applies the changes in order, logs
one line each, and exits once the plugin process has gone (its pipe closed) and every process
it listed has exited. Nothing here can fail a container: whatever goes wrong is one log line.
"""

from __future__ import annotations

import json
import os
import select
import sys

from nri_mokka.log import Logger
from nri_mokka.nri import wire

# typing is not imported at run time (mypy reads TYPE_CHECKING as true): the plugin starts faster.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping
    from typing import Any

    from gpumodel.nodelayout import NodeLayout

__all__ = ["ANNOTATION_MEMORY", "Event", "Helper", "Recorder", "gpus_of", "main", "memory_mib"]

log = Logger("mokka.workloads")

ANNOTATION_MEMORY = "mokka.io/gpu-memory"  # MiB per GPU the container's processes use
DEFAULT_MEMORY_MIB = 1024  # gpumodel.processes.DEFAULT_MEMORY_MIB (checked by the tests)
# StateChangeEvent: pod 2, container 3
EVENT_POD, EVENT_CONTAINER = 2, 3
# PodSandbox, Container (api.proto)
POD_ANNOTATIONS = 6
CONTAINER_ID = 1
CONTAINER_NAME = 3
CONTAINER_ANNOTATIONS = 6
CONTAINER_ARGS = 7
CONTAINER_ENV = 8
CONTAINER_LINUX = 11
CONTAINER_PID = 12
LINUX_DEVICES = 2
DEVICE_PATH = 1
MAP_KEY, MAP_VALUE = 1, 2
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DEVICE_PREFIX = "/dev/nvidia"
IMEX_MGMT_NODE = "/dev/nvidia-caps/nvidia-cap4323"  # gpumodel.mig_devices.FABRIC_IMEX_MINOR (checked by the tests)


class Event:
    """What a container's StateChangeEvent (its start) says about it, read from its raw bytes."""

    __slots__ = ("args0", "container_id", "devices", "imex_daemon", "memory", "name", "pid", "visible")

    def __init__(self, payload: bytes) -> None:
        self.container_id = self.name = self.args0 = ""
        self.pid = 0
        self.visible: str | None = None
        self.devices: list[int] = []  # minors of the /dev/nvidiaN device nodes
        self.imex_daemon = False  # given the fabric-imex-mgmt capability
        pod_memory: str | None = None
        memory: str | None = None
        for number, kind, a, b in wire.fields(payload):
            if kind != wire.LEN:
                continue
            if number == EVENT_POD:
                for n, k, x, y in wire.fields(payload, a, b):
                    if n == POD_ANNOTATIONS and k == wire.LEN:
                        pod_memory = _entry(payload, x, y, ANNOTATION_MEMORY, pod_memory)
            elif number == EVENT_CONTAINER:
                memory = self._container(payload, a, b)
        self.memory = memory if memory is not None else pod_memory

    def _container(self, data: bytes, a: int, b: int) -> str | None:
        memory = None
        for n, kind, x, y in wire.fields(data, a, b):
            if kind == wire.VARINT:
                if n == CONTAINER_PID:
                    self.pid = x
                continue
            if kind != wire.LEN:
                continue
            if n == CONTAINER_ID:
                self.container_id = data[x:y].decode(errors="replace")
            elif n == CONTAINER_NAME:
                self.name = data[x:y].decode(errors="replace")
            elif n == CONTAINER_ARGS and not self.args0:
                self.args0 = data[x:y].decode(errors="replace")
            elif n == CONTAINER_ANNOTATIONS:
                memory = _entry(data, x, y, ANNOTATION_MEMORY, memory)
            elif n == CONTAINER_ENV:
                key, _, value = data[x:y].decode(errors="replace").partition("=")
                if key == VISIBLE_DEVICES:
                    self.visible = value  # the last one set wins, as in the process's environment
            elif n == CONTAINER_LINUX:
                for m, k, p, q in wire.fields(data, x, y):
                    if m == LINUX_DEVICES and k == wire.LEN:
                        path = wire.first(data, DEVICE_PATH, p, q)
                        text = data[path[0] : path[1]].decode(errors="replace") if path else ""
                        minor = text[len(DEVICE_PREFIX) :]
                        if text.startswith(DEVICE_PREFIX) and minor.isdigit():
                            self.devices.append(int(minor))
                        elif text == IMEX_MGMT_NODE:
                            self.imex_daemon = True
        return memory

    def process_name(self) -> str:
        """What NVML names the process by: the command it runs, else its comm, else the container's name."""
        if self.args0:
            return self.args0
        if self.pid:
            try:
                with open(f"/proc/{self.pid}/comm") as fh:
                    return fh.read().strip() or self.name
            except OSError:
                pass
        return self.name


def _entry(data: bytes, a: int, b: int, wanted: str, current: str | None) -> str | None:
    key, value = "", ""
    for n, kind, x, y in wire.fields(data, a, b):
        if kind == wire.LEN:
            if n == MAP_KEY:
                key = data[x:y].decode(errors="replace")
            elif n == MAP_VALUE:
                value = data[x:y].decode(errors="replace")
    return value if key == wanted else current


def gpus_of(event: Event, layout: NodeLayout) -> list[int]:
    """The indices of the GPUs the container was given: its device nodes, else the GPUs its
    ``NVIDIA_VISIBLE_DEVICES`` names (a MIG device counts as its GPU; unknown names are skipped);
    none for an IMEX daemon."""
    if event.imex_daemon:
        return []
    if event.devices:
        by_minor = {g.minor: g.index for g in layout.gpus}
        return sorted({by_minor[m] for m in event.devices if m in by_minor})
    value = (event.visible or "").strip()
    if value in ("", "void", "none"):
        return []
    if value == "all":
        return [g.index for g in layout.gpus]
    found: set[int] = set()
    for name in (v.strip() for v in value.split(",")):
        gpu = name.partition(":")[0]  # "<gpu>:<mig>": the MIG device's GPU
        found.update(g.index for g in layout.gpus if gpu in (str(g.index), g.uuid))
    return sorted(found)


def memory_mib(value: str | None) -> int:
    """The annotation's MiB (``2048``, ``2048Mi``, ``2Gi``); ValueError for anything else."""
    if value is None:
        return DEFAULT_MEMORY_MIB
    text = value.strip()
    scale = 1
    for suffix, factor in (("GiB", 1024), ("Gi", 1024), ("MiB", 1), ("Mi", 1)):
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)].strip(), factor
            break
    if not text.isdigit():
        raise ValueError(f"{ANNOTATION_MEMORY}: {value!r} is not a size in MiB (e.g. 2048, 2048Mi, 2Gi)")
    return int(text) * scale


class Recorder:
    """The helper process that writes the changes into the state, in order."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def send(self, order: dict[str, object]) -> None:
        """Queue one change (``add`` or ``remove``); dropped with a log line if the helper is stuck."""
        line = json.dumps(order, separators=(",", ":")).encode() + b"\n"
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            sent = os.write(self.proc.stdin.fileno(), line)  # below PIPE_BUF: all or nothing
        except (BlockingIOError, BrokenPipeError) as exc:
            log.error("GPU processes: the recorder takes no more (%s); dropped %s", type(exc).__name__, order)
            return
        if sent != len(line):
            log.error("GPU processes: short write to the recorder; dropped %s", order)

    def _start(self) -> None:
        import subprocess

        if self.proc is not None:
            log.error("GPU processes: the recorder exited (%s); starting another", self.proc.returncode)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nri_mokka.workloads"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            cwd="/",  # it may outlive the plugin process (until what it listed exits): it pins no folder
        )
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()


def apply(order: Mapping[str, Any]) -> str:
    """Carry out one change; return its log line."""
    from pathlib import Path

    from gpumodel import processes

    path = Path(str(order["state"]))
    pids = [int(p) for p in order["pids"]]
    listed = ",".join(map(str, pids))
    what = str(order.get("what", ""))
    if order["op"] == "add":
        gpus = [int(g) for g in order["gpus"]]
        mib = int(order["mib"])
        n = processes.add(path, gpus, pids, str(order["name"]), mib)
        on = ",".join(map(str, gpus))
        return f"{what}: pid {listed} ({order['name']}) on GPUs {on}, {mib} MiB each ({n} entries)"
    n = processes.remove(path, pids)
    return f"{what}: pid {listed} off the GPUs ({n} entries)"


class Helper:
    """The helper's work: the changes the plugin sends, and the listed processes watched until
    they exit (one pidfd each; where the kernel has none, their /proc entries once a second)."""

    def __init__(self) -> None:
        self.poll = select.poll()
        self.watched: dict[int, tuple[str, int, str]] = {}  # pidfd -> (state, PID, what)
        self.unwatchable: dict[int, tuple[str, str]] = {}  # PID -> (state, what): no pidfd for it

    def handle(self, line: bytes) -> None:
        """One change from the plugin (a JSON line)."""
        try:
            order = json.loads(line)
        except ValueError as exc:
            log.error("GPU processes: %s: %s (%s)", type(exc).__name__, exc, line.decode(errors="replace").strip())
            return
        self._apply(order)

    def _apply(self, order: dict[str, Any]) -> None:
        """Carry out one change, an ``add`` only for the PIDs still running; whatever fails is one log line."""
        try:
            if order["op"] == "add":
                order = self._watch(order)
                if not order["pids"]:
                    return
            log.info("%s", apply(order))
        except Exception as exc:  # one change that cannot be made must not stop the others
            log.error("GPU processes: %s: %s (%s)", type(exc).__name__, exc, order)

    def _watch(self, order: dict[str, Any]) -> dict[str, Any]:
        """``order`` with only the PIDs still running, each now watched (before it is listed, so
        that an exit meanwhile is seen)."""
        state, what = str(order["state"]), str(order.get("what", ""))
        alive = []
        for pid in (int(p) for p in order["pids"]):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                log.info("%s: pid %d exited before its start was seen: not listed", what, pid)
                continue
            except OSError as exc:  # a kernel without pidfds (before 5.3)
                log.info("%s: pid %d: no pidfd (%s): its /proc entry is checked each second", what, pid, exc.strerror)
                self.unwatchable[pid] = (state, what)
            else:
                self.watched[fd] = (state, pid, what)
                self.poll.register(fd, select.POLLIN)
            alive.append(pid)
        return {**order, "pids": alive}

    def _gone(self, state: str, pid: int, what: str) -> None:
        self._apply({"op": "remove", "state": state, "pids": [pid], "what": what})

    def exited(self, fd: int) -> None:
        """The process behind pidfd ``fd`` exited: take it off."""
        state, pid, what = self.watched.pop(fd)
        self.poll.unregister(fd)
        os.close(fd)
        self._gone(state, pid, what)

    def check_unwatchable(self) -> None:
        """Take off each process without a pidfd whose /proc entry is gone."""
        for pid, (state, what) in list(self.unwatchable.items()):
            if not os.path.exists(f"/proc/{pid}"):
                del self.unwatchable[pid]
                self._gone(state, pid, what)

    @property
    def busy(self) -> bool:
        return bool(self.watched or self.unwatchable)


def main() -> int:
    """The helper: one JSON change per line on stdin, the listed processes watched until they exit;
    done when stdin has closed and none is left."""
    helper = Helper()
    stdin = sys.stdin.buffer.fileno()
    helper.poll.register(stdin, select.POLLIN)
    reading, pending = True, b""
    while reading or helper.busy:
        for fd, _ in helper.poll.poll(1000 if helper.unwatchable else None):
            if fd != stdin:
                helper.exited(fd)
                continue
            data = os.read(stdin, 65536)
            if not data:
                reading = False
                helper.poll.unregister(stdin)
                continue
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if line.strip():
                    helper.handle(line)
        helper.check_unwatchable()
    return 0


if __name__ == "__main__":
    sys.exit(main())
