"""Stage a driver root: the mock libnvidia-ml carrying the compiled state, and the mock
libcuda beside it, ready for ``LD_LIBRARY_PATH=DIR/usr/lib64`` or for bind mounts into
containers. The state travels inside ``libnvidia-ml.so.<version>`` (see
native/mokka_state.h), so a container that gets only that file still sees the node::

    DIR/usr/lib64/libnvidia-ml.so.<driver version>     ELF image + state region + trailer
    DIR/usr/lib64/libnvidia-ml.so.1 -> libnvidia-ml.so.<driver version>
    DIR/usr/lib64/libnvidia-ml.so   -> libnvidia-ml.so.1
    DIR/usr/lib64/libcuda.so.<driver version>          answers from the same state
    DIR/usr/lib64/libcuda.so.1 -> libcuda.so.<driver version>
    DIR/usr/lib64/libcuda.so   -> libcuda.so.1
    DIR/usr/lib64/libdcgm.so.4                         DCGM's API, read through that NVML
    DIR/usr/lib64/libdcgm.so   -> libdcgm.so.4
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import atomic, state
from .native import CUDA_LIBRARY, DCGM_LIBRARY, NVML_LIBRARY, library_path
from .profile import Profile

LIBDIR = Path("usr/lib64")
DCGM_SONAME = "libdcgm.so.4"  # what dcgm-exporter (go-dcgm) dlopens


@dataclass(frozen=True)
class StagedFile:
    """One file of a driver root, relative to the library directory."""

    name: str
    data: bytes
    mode: int
    live: bool = False  # carries the state: refresh in place when possible, never replace blindly


@dataclass(frozen=True)
class Contents:
    """What a driver root holds for one profile: files, then links (name -> target)."""

    files: tuple[StagedFile, ...]
    links: tuple[tuple[str, str], ...]
    region: bytes  # the compiled state the NVML library carries
    library: bytes  # that library's ELF image, without the state


def contents(profile: Profile) -> Contents:
    """Everything a driver root holds for ``profile``, computed before anything is written
    (a profile that cannot be compiled raises here, StateError or NativeMissing)."""
    region = state.compile_profile(profile)
    nvml = library_path(NVML_LIBRARY).read_bytes()
    cuda = library_path(CUDA_LIBRARY).read_bytes()
    dcgm = library_path(DCGM_LIBRARY).read_bytes()
    version = profile.driver.version
    files = (
        StagedFile(f"libnvidia-ml.so.{version}", state.embed(nvml, region), 0o755, live=True),
        StagedFile(f"libcuda.so.{version}", cuda, 0o755),
        StagedFile(DCGM_SONAME, dcgm, 0o755),
    )
    links = (
        ("libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"),
        ("libnvidia-ml.so", "libnvidia-ml.so.1"),
        ("libcuda.so.1", f"libcuda.so.{version}"),
        ("libcuda.so", "libcuda.so.1"),
        ("libdcgm.so", DCGM_SONAME),
    )
    return Contents(files=files, links=links, region=region, library=nvml)


def refreshed_in_place(c: Contents, target: Path) -> bool:
    """Whether ``target`` (the staged libnvidia-ml) was this build of the library with a state
    of the same layout, now rewritten in place under the writer lock: running processes
    and bind mounts keep their inode and see the new state on their next call."""
    return state.refresh_library(target, c.library, c.region)


@dataclass(frozen=True)
class DriverRoot:
    root: Path
    library: Path  # libnvidia-ml.so.<version>: also the file that carries the state
    cuda: Path

    @property
    def libdir(self) -> Path:
        return self.library.parent

    @property
    def state(self) -> Path:
        """The file carrying the state (the library itself): for MOKKA_STATE and state.update."""
        return self.library


def stage(profile: Profile, out: Path) -> DriverRoot:
    """Write (or refresh) a driver root for ``profile`` under ``out``.

    The state is compiled before anything is written, so a profile that cannot be
    compiled leaves ``out`` untouched. A library staged before by the same Mokka keeps its
    inode: its state is refreshed in place."""
    c = contents(profile)
    libdir = out / LIBDIR
    libdir.mkdir(parents=True, exist_ok=True)
    for f in c.files:
        target = libdir / f.name
        if f.live and refreshed_in_place(c, target):
            continue
        if not f.live and target.is_file() and target.read_bytes() == f.data:
            continue
        atomic.write(target, f.data, f.mode)
    for name, target_name in c.links:
        atomic.symlink(libdir / name, target_name)
    version = profile.driver.version
    return DriverRoot(root=out, library=libdir / f"libnvidia-ml.so.{version}", cuda=libdir / f"libcuda.so.{version}")


# The C runtime nvidia-smi runs on, by machine: (the loader, its path in a root; the libraries'
# directory; the libraries). A driver container's root carries its OS's; NVIDIA's MIG manager (with
# CDI) and validator run ``chroot <driver root> nvidia-smi``.
C_RUNTIME = {
    "x86_64": ("lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu"),
    "aarch64": ("lib/ld-linux-aarch64.so.1", "lib/aarch64-linux-gnu"),
}
C_LIBRARIES = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1")


def c_runtime(machine: str) -> dict[str, Path]:
    """Path in a root -> the host's file, of the C runtime nvidia-smi needs on ``machine``
    (empty when the host has none of that machine's: a foreign architecture)."""
    if machine not in C_RUNTIME:
        return {}
    loader, libdir = C_RUNTIME[machine]
    wanted = [loader, *(f"{libdir}/{lib}" for lib in C_LIBRARIES)]
    found = {rel: (Path("/") / rel).resolve() for rel in wanted}
    return found if all(f.is_file() for f in found.values()) else {}
