"""What a decision needs from NRI's CreateContainerRequest, read straight from its raw bytes.

A request is ~3 KB of pod and container description; a decision reads a handful of fields.
Instead of parsing it whole into message objects, this walks the encoding (``nri.wire``) to
the names and namespace, and — only when the bytes contain one of ``TRIGGERS`` at all — to
the annotations, environment, device paths and mounts of the driver's library a decision can
depend on (``decision.relevant_*``), keeping just those. Protobuf strings are stored verbatim, so a
request without any trigger substring cannot carry a relevant annotation, variable or device.

Field numbers are NRI's (api.proto); ``tests/test_nri_wire.py`` checks them against the
project's proto and the official one.
"""

from __future__ import annotations

from nri_mokka import decision
from nri_mokka.nri import wire

# CreateContainerRequest
REQUEST_POD = 1
REQUEST_CONTAINER = 2
# PodSandbox
POD_NAME = 2
POD_NAMESPACE = 4
POD_ANNOTATIONS = 6
# Container
CONTAINER_NAME = 3
CONTAINER_ANNOTATIONS = 6
CONTAINER_ENV = 8
CONTAINER_MOUNTS = 9
CONTAINER_LINUX = 11
# Mount
MOUNT_DESTINATION = 1
# LinuxContainer, LinuxDevice
LINUX_DEVICES = 2
DEVICE_PATH = 1
# map<string, string> entries
MAP_KEY = 1
MAP_VALUE = 2

RENDER_ENV = ("LD_PRELOAD",)  # what rendering reads of the environment (kept, not replaced)
TRIGGERS = tuple(
    s.encode()
    for s in (
        *decision.ANNOTATION_PREFIXES,
        *(f"{name}=" for name in (*decision.ENV_READ, *RENDER_ENV)),
        decision.DEVICE_PREFIX,
        decision.DRIVER_LIBRARY,
    )
)

Items = tuple[tuple[str, str], ...]
# (namespace, pod annotations, container annotations, environment, device paths, driver
# mounts): every input of a decision and its rendering except the names, which only go into
# the log line.
Key = tuple[str, Items, Items, Items, tuple[str, ...], tuple[str, ...]]


class CreateRequest:
    """A CreateContainerRequest's raw bytes, read on demand."""

    __slots__ = ("container", "namespace", "payload", "pod", "pod_name")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.pod = (0, 0)
        self.container = (0, 0)
        for number, kind, a, b in wire.fields(payload):
            if kind == wire.LEN:
                if number == REQUEST_POD:
                    self.pod = (a, b)
                elif number == REQUEST_CONTAINER:
                    self.container = (a, b)
        self.pod_name = self.namespace = ""
        found = 0
        for number, kind, a, b in wire.fields(payload, *self.pod):
            if kind == wire.LEN and number in (POD_NAME, POD_NAMESPACE):
                if number == POD_NAME:
                    self.pod_name = payload[a:b].decode()
                else:
                    self.namespace = payload[a:b].decode()
                found += 1
                if found == 2:
                    break

    def container_name(self) -> str:
        data = self.payload
        for number, kind, a, b in wire.fields(data, *self.container):
            if number == CONTAINER_NAME and kind == wire.LEN:
                return data[a:b].decode()
        return ""

    def key(self) -> Key:
        """Everything a decision about this container (and its rendering) depends on."""
        data = self.payload
        if not any(t in data for t in TRIGGERS):
            return (self.namespace, (), (), (), (), ())
        pod_annotations: list[tuple[str, str]] = []
        for number, kind, a, b in wire.fields(data, *self.pod):
            if number == POD_ANNOTATIONS and kind == wire.LEN:
                _relevant_entry(data, a, b, pod_annotations)
        annotations: list[tuple[str, str]] = []
        env: list[tuple[str, str]] = []
        devices: list[str] = []
        mounts: list[str] = []
        for number, kind, a, b in wire.fields(data, *self.container):
            if kind != wire.LEN:
                continue
            if number == CONTAINER_ANNOTATIONS:
                _relevant_entry(data, a, b, annotations)
            elif number == CONTAINER_ENV:
                entry = data[a:b].decode()
                name, _, value = entry.partition("=")
                if name in decision.ENV_READ or name in RENDER_ENV:
                    env.append((name, value))
            elif number == CONTAINER_LINUX:
                for n, k, x, y in wire.fields(data, a, b):
                    if n == LINUX_DEVICES and k == wire.LEN:
                        path = wire.first(data, DEVICE_PATH, x, y)
                        if path is not None:
                            text = data[path[0] : path[1]].decode()
                            if decision.relevant_device(text):
                                devices.append(text)
            elif number == CONTAINER_MOUNTS:
                where = wire.first(data, MOUNT_DESTINATION, a, b)
                if where is not None and decision.relevant_mount(text := data[where[0] : where[1]].decode()):
                    mounts.append(text)
        pod, ctr = tuple(sorted(pod_annotations)), tuple(sorted(annotations))
        return (self.namespace, pod, ctr, _last(env), tuple(devices), tuple(mounts))


def _relevant_entry(data: bytes, a: int, b: int, out: list[tuple[str, str]]) -> None:
    key = value = ""
    for n, kind, x, y in wire.fields(data, a, b):
        if kind == wire.LEN:
            if n == MAP_KEY:
                key = data[x:y].decode()
            elif n == MAP_VALUE:
                value = data[x:y].decode()
    if decision.relevant_annotation(key):
        out.append((key, value))


def _last(env: list[tuple[str, str]]) -> Items:
    """One value per variable, the last one set (as in the process's environment), sorted."""
    return tuple(sorted(dict(env).items()))


def container(key: Key, pod_name: str = "", name: str = "") -> decision.Container:
    """The decision's view of a container with inputs ``key``."""
    namespace, pod_annotations, annotations, env, devices, mounts = key
    return decision.Container(
        name=name,
        pod_name=pod_name,
        pod_namespace=namespace,
        pod_annotations=dict(pod_annotations),
        annotations=dict(annotations),
        env=dict(env),
        device_paths=devices,
        driver_mounts=mounts,
    )
