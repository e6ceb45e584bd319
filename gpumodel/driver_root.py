"""Stage a driver root: the mock libnvidia-ml and its compiled state, ready for
``LD_LIBRARY_PATH=DIR/usr/lib64`` or for bind mounts into containers.

Layout (the library finds its state relative to itself, ``<libdir>/mokka/state.bin``)::

    DIR/usr/lib64/libnvidia-ml.so.<driver version>
    DIR/usr/lib64/libnvidia-ml.so.1 -> libnvidia-ml.so.<driver version>
    DIR/usr/lib64/libnvidia-ml.so   -> libnvidia-ml.so.1
    DIR/usr/lib64/mokka/state.bin
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import atomic, state
from .native import library_path
from .profile import Profile

LIBDIR = Path("usr/lib64")
STATE_RELATIVE = Path("mokka/state.bin")


@dataclass(frozen=True)
class DriverRoot:
    root: Path
    library: Path
    state: Path

    @property
    def libdir(self) -> Path:
        return self.library.parent


def stage(profile: Profile, out: Path) -> DriverRoot:
    """Write (or refresh) a driver root for ``profile`` under ``out``.

    The state is compiled before anything is written, so a profile that cannot be
    compiled leaves ``out`` untouched.
    """
    data = state.compile_profile(profile)
    lib_src = library_path()
    libdir = out / LIBDIR
    libdir.mkdir(parents=True, exist_ok=True)
    versioned = libdir / f"libnvidia-ml.so.{profile.driver.version}"
    atomic.write(versioned, lib_src.read_bytes(), 0o755)
    atomic.symlink(libdir / "libnvidia-ml.so.1", versioned.name)
    atomic.symlink(libdir / "libnvidia-ml.so", "libnvidia-ml.so.1")
    state_file = libdir / STATE_RELATIVE
    state.write_new(state_file, data)
    return DriverRoot(root=out, library=versioned, state=state_file)
