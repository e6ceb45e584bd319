"""The node's MIG devices as NVML shows them, for the NRI plugin.

The plugin process stays small (no cffi, no pydantic), so it does not parse the state itself: it
asks the node's own library, as NVIDIA's tools do, through ctypes. The staged
``libnvidia-ml.so.<version>`` is loaded by path and initialised against the node's state with
every GPU visible (the plugin's own environment and /dev are not a container's); the environment
is restored right after ``nvmlInit``, which is the only moment the library reads it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from gpumodel.mig_devices import GpuMig, MigDevice

SUCCESS = 0
NOT_FOUND = 6
INVALID_ARGUMENT = 2


class MigViewError(Exception):
    """The node's library could not be loaded or answered an error."""


PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT


class _GpuInstanceProfileInfo(ctypes.Structure):  # v1
    _fields_ = [
        *((name, ctypes.c_uint) for name in ("id", "isP2pSupported", "sliceCount", "instanceCount")),
        *((name, ctypes.c_uint) for name in ("sms", "copyEngines", "decoders", "encoders", "jpeg", "ofa")),
        ("memorySizeMB", ctypes.c_ulonglong),
    ]


class _GpuInstanceInfo(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("start", ctypes.c_uint),
        ("size", ctypes.c_uint),
    ]


class _ComputeInstanceInfo(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("gpuInstance", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("start", ctypes.c_uint),
        ("size", ctypes.c_uint),
    ]


def _with_env(changes: dict[str, str | None]) -> dict[str, str | None]:
    before = {k: os.environ.get(k) for k in changes}
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return before


class MigView:
    """MIG devices of the node whose state ``state`` carries, read through ``library``."""

    def __init__(self, library: Path, state: Path) -> None:
        try:
            self.lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            raise MigViewError(f"cannot load {library}: {exc}") from None
        before = _with_env(
            {"MOKKA_STATE": str(state), "MOKKA_IGNORE_DEVICE_NODES": "1", "NVIDIA_VISIBLE_DEVICES": None}
        )
        try:
            rc = self.lib.nvmlInit_v2()
        finally:
            _with_env(before)
        if rc != SUCCESS:
            raise MigViewError(f"nvmlInit_v2 on {library} returned {rc}")

    def close(self) -> None:
        self.lib.nvmlShutdown()

    def _call(self, name: str, *args: object) -> int:
        return int(getattr(self.lib, name)(*args))

    def _uint(self, name: str, handle: ctypes.c_void_p) -> int | None:
        out = ctypes.c_uint()
        return out.value if self._call(name, handle, ctypes.byref(out)) == SUCCESS else None

    def current(self) -> list[GpuMig]:
        """Every GPU's MIG state now (GPUs that cannot do MIG answer capable=False)."""
        count = ctypes.c_uint()
        if self._call("nvmlDeviceGetCount_v2", ctypes.byref(count)) != SUCCESS:
            raise MigViewError("nvmlDeviceGetCount_v2 failed")
        out = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            if self._call("nvmlDeviceGetHandleByIndex_v2", i, ctypes.byref(h)) != SUCCESS:
                continue
            uuid = ctypes.create_string_buffer(96)
            self._call("nvmlDeviceGetUUID", h, uuid, 96)
            minor = self._uint("nvmlDeviceGetMinorNumber", h)
            current, pending = ctypes.c_uint(), ctypes.c_uint()
            capable = self._call("nvmlDeviceGetMigMode", h, ctypes.byref(current), ctypes.byref(pending)) == SUCCESS
            on = capable and current.value == 1
            devices = self._devices(h, i, minor or i) if on else []
            gis = self._gpu_instances(h) if on else []
            out.append(
                GpuMig(
                    gpu=i,
                    uuid=uuid.value.decode(),
                    minor=minor if minor is not None else i,
                    capable=capable,
                    current=capable and current.value == 1,
                    pending=capable and pending.value == 1,
                    devices=tuple(devices),
                    gpu_instances=tuple(gis),
                )
            )
        return out

    def _gpu_instances(self, parent: ctypes.c_void_p) -> list[tuple[int, int]]:
        """(GI id, profile ID) of every GPU instance, with or without compute instances."""
        found = []
        for index in range(PROFILE_COUNT):
            info = _GpuInstanceProfileInfo()
            if self._call("nvmlDeviceGetGpuInstanceProfileInfo", parent, index, ctypes.byref(info)) != SUCCESS:
                continue
            handles, count = (ctypes.c_void_p * info.instanceCount)(), ctypes.c_uint(info.instanceCount)
            if self._call("nvmlDeviceGetGpuInstances", parent, info.id, handles, ctypes.byref(count)) != SUCCESS:
                continue
            for k in range(count.value):
                gi_info = _GpuInstanceInfo()
                if self._call("nvmlGpuInstanceGetInfo", ctypes.c_void_p(handles[k]), ctypes.byref(gi_info)) == SUCCESS:
                    found.append((gi_info.id, gi_info.profileId))
        return sorted(found)

    def _devices(self, parent: ctypes.c_void_p, gpu: int, minor: int) -> list[MigDevice]:
        found = []
        for j in range(self._uint("nvmlDeviceGetMaxMigDeviceCount", parent) or 0):
            m = ctypes.c_void_p()
            rc = self._call("nvmlDeviceGetMigDeviceHandleByIndex", parent, j, ctypes.byref(m))
            if rc in (NOT_FOUND, INVALID_ARGUMENT):
                continue
            if rc != SUCCESS:
                raise MigViewError(f"nvmlDeviceGetMigDeviceHandleByIndex({gpu}, {j}) returned {rc}")
            uuid, name = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
            self._call("nvmlDeviceGetUUID", m, uuid, 96)
            self._call("nvmlDeviceGetName", m, name, 96)
            gi_id = self._uint("nvmlDeviceGetGpuInstanceId", m) or 0
            ci_id = self._uint("nvmlDeviceGetComputeInstanceId", m) or 0
            gi, ci = ctypes.c_void_p(), ctypes.c_void_p()
            gi_info, ci_info = _GpuInstanceInfo(), _ComputeInstanceInfo()
            if (
                self._call("nvmlDeviceGetGpuInstanceById", parent, gi_id, ctypes.byref(gi)) != SUCCESS
                or self._call("nvmlGpuInstanceGetInfo", gi, ctypes.byref(gi_info)) != SUCCESS
                or self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id, ctypes.byref(ci)) != SUCCESS
                or self._call("nvmlComputeInstanceGetInfo_v2", ci, ctypes.byref(ci_info)) != SUCCESS
            ):
                continue  # destroyed meanwhile
            found.append(
                MigDevice(
                    gpu=gpu,
                    gpu_minor=minor,
                    index=j,
                    gi=gi_id,
                    ci=ci_id,
                    uuid=uuid.value.decode(),
                    profile=name.value.decode().rpartition(" MIG ")[2],
                    gi_profile_id=gi_info.profileId,
                    ci_profile_id=ci_info.profileId,
                    placement=(gi_info.start, gi_info.size),
                )
            )
        return found
