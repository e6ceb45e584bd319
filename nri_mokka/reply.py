"""The plugin's answer to CreateContainer, encoded straight to bytes.

An answer is a CreateContainerResponse holding one ContainerAdjustment: environment, bind mounts,
device nodes and createContainer hooks (the edits of ``gpumodel.edits``), or CDI device references.
It is written here field by field on the wire (``nri.wire``), the way ``request`` reads the
request: the plugin process never imports betterproto, whose import (grpclib, asyncio, ssl,
dateutil, importlib.metadata) would take more memory than all the rest of the plugin. Fields come
in the order betterproto writes them, so the bytes are the very ones it would write.

Field numbers are NRI's (api.proto); ``tests/test_nri_wire.py`` checks them against the project's
messages (``nri/proto``, themselves checked against the official api.proto) and the bytes against
betterproto's encoding of the same adjustment.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpumodel.edits import ContainerEdits, DeviceNode, Hook, Mount
from nri_mokka.nri.wire import LEN, encode_bytes, encode_varint, encode_varint_field

__all__ = ["adjustment", "cdi_adjustment", "response"]

# CreateContainerResponse
RESPONSE_ADJUST = 1
# ContainerAdjustment
ADJUST_MOUNTS = 3
ADJUST_ENV = 4
ADJUST_HOOKS = 5
ADJUST_LINUX = 6
ADJUST_CDI_DEVICES = 8
# KeyValue
KEY = 1
VALUE = 2
# Mount
MOUNT_DESTINATION = 1
MOUNT_TYPE = 2
MOUNT_SOURCE = 3
MOUNT_OPTIONS = 4
# Hooks, Hook
HOOKS_CREATE_CONTAINER = 3
HOOK_PATH = 1
HOOK_ARGS = 2
# LinuxContainerAdjustment, LinuxDevice, OptionalFileMode
LINUX_DEVICES = 1
DEVICE_PATH = 1
DEVICE_TYPE = 2
DEVICE_MAJOR = 3
DEVICE_MINOR = 4
DEVICE_FILE_MODE = 5
FILE_MODE_VALUE = 1
# CDIDevice
CDI_NAME = 1


def _message(number: int, body: bytes) -> bytes:
    """A set message field: written even when empty (its presence is what it says)."""
    return encode_varint(number << 3 | LEN) + encode_varint(len(body)) + body


def _strings(number: int, values: Iterable[str]) -> bytes:
    """A repeated string field: every element, empty ones included."""
    return b"".join(_message(number, v.encode()) for v in values)


def _str(number: int, value: str) -> bytes:
    return encode_bytes(number, value.encode())


def _env(key: str, value: str) -> bytes:
    return _message(ADJUST_ENV, _str(KEY, key) + _str(VALUE, value))


def _mount(m: Mount) -> bytes:
    body = _str(MOUNT_DESTINATION, m.container_path) + _str(MOUNT_TYPE, "bind") + _str(MOUNT_SOURCE, m.host_path)
    return _message(ADJUST_MOUNTS, body + _strings(MOUNT_OPTIONS, m.options))


def _device(d: DeviceNode) -> bytes:
    body = (
        _str(DEVICE_PATH, d.path)
        + _str(DEVICE_TYPE, d.type)
        + encode_varint_field(DEVICE_MAJOR, d.major)
        + encode_varint_field(DEVICE_MINOR, d.minor)
        + _message(DEVICE_FILE_MODE, encode_varint_field(FILE_MODE_VALUE, d.file_mode))
    )
    return _message(LINUX_DEVICES, body)


def _hooks(hooks: tuple[Hook, ...]) -> bytes:
    body = b"".join(
        _message(HOOKS_CREATE_CONTAINER, _str(HOOK_PATH, h.path) + _strings(HOOK_ARGS, h.args)) for h in hooks
    )
    return _message(ADJUST_HOOKS, body)


def adjustment(edits: ContainerEdits, preload: str = "") -> bytes:
    """The edits as an NRI ContainerAdjustment; ``preload`` is the container's own LD_PRELOAD,
    kept after the edits' (what the image preloads still loads)."""
    out = [_mount(m) for m in edits.mounts]
    for key, value in edits.env_dict().items():
        if key == "LD_PRELOAD" and preload:
            value = f"{value}:{preload}"
        out.append(_env(key, value))
    if edits.hooks:
        out.append(_hooks(edits.hooks))
    if edits.device_nodes:
        out.append(_message(ADJUST_LINUX, b"".join(_device(d) for d in edits.device_nodes)))
    return b"".join(out)


def cdi_adjustment(names: tuple[str, ...], hooks: tuple[Hook, ...] = ()) -> bytes:
    """GPUs as CDI device references: the runtime resolves them against the CDI spec
    (`mokka cdi generate`), which carries the same edits; ``hooks``, which no device's spec
    carries, beside them."""
    out = _hooks(hooks) if hooks else b""
    return out + b"".join(_message(ADJUST_CDI_DEVICES, _str(CDI_NAME, n)) for n in names)


def response(adjust: bytes) -> bytes:
    """A CreateContainerResponse carrying the adjustment ``adjust``."""
    return _message(RESPONSE_ADJUST, adjust)
