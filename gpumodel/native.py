"""Where the native artifacts are: the state header and the built shared libraries.

In a source checkout (editable install) they are in ``native/`` and ``native/build/``;
an installed wheel carries copies in ``gpumodel/_native/`` made by the build.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent / "native"
_BUNDLED = _PACKAGE / "_native"

NVML_LIBRARY = "libnvidia-ml.so"
CUDA_LIBRARY = "libcuda.so"
DCGM_LIBRARY = "libdcgm.so"
STATE_WRITER = "libmokka-state.so"  # the live-state writer gpumodel.state loads
SYSFS_SHIM = "libmokka-sysfs.so"
IMEX_TOOLS = ("nvidia-imex", "nvidia-imex-ctl")  # the mock IMEX daemon and its query tool (driver root's usr/bin)
PROC_HOOK = "mokka-proc-hook"  # the OCI hook showing a container the driver's procfs files


class NativeMissing(FileNotFoundError):
    """A native artifact was not built."""


def _find(name: str, checkout_sub: str) -> Path:
    for candidate in (_CHECKOUT / checkout_sub / name, _BUNDLED / name):
        if candidate.exists():
            return candidate
    raise NativeMissing(
        f"{name} not found: build it with `make -C native` (looked in {_CHECKOUT / checkout_sub}, {_BUNDLED})"
    )


def header_path() -> Path:
    return _find("mokka_state.h", ".")


def library_path(name: str = NVML_LIBRARY) -> Path:
    return _find(name, "build")
