"""Find and remove what containers leave on the host: processes, mounts, cgroups, directories.

Used by the private containerd (:mod:`containers.sandbox`) and by :mod:`containers.podman` to tear
down, and by the tests to check that nothing survived (:func:`leftovers`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from containers.command import SandboxError

__all__ = [
    "cgroup_dirs",
    "cgroup_parent",
    "kill",
    "kill_cgroup_members",
    "leftovers",
    "mounts_under",
    "processes",
    "remove_tree",
    "rmdir_cgroup",
    "thaw",
    "unmount",
    "wait_gone",
    "zombie",
]

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def mounts_under(base: Path) -> list[Path]:
    """Mount points at or below ``base`` (this mount namespace), deepest first."""
    found: list[Path] = []
    prefix = str(base).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(base) or point.startswith(prefix):
                found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount(path: Path) -> None:
    """Unmount ``path`` (lazily when it is busy); a path that is no mount point is left alone."""
    for flags in (0, MNT_DETACH):
        if _libc.umount2(os.fsencode(path), flags) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            return
    raise SandboxError(f"cannot unmount {path}: {os.strerror(err)}")


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones, and cgroup2)."""
    roots: list[Path] = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] in ("cgroup", "cgroup2"):
                roots.append(Path(fields[1]))
    return roots


def cgroup_dirs(parent: str) -> list[Path]:
    """Every existing directory of cgroup ``parent`` in every hierarchy, children first."""
    found: list[Path] = []
    for root in cgroup_hierarchies():
        top = root / parent.strip("/")
        if top.is_dir():
            found += [Path(d) for d, _subdirs, _files in os.walk(top, topdown=False)]
    return found


def cgroup_parent(base: Path, kind: str = "sandbox") -> str:
    """The cgroup parent of the pods (``kind="sandbox"``) or podman containers (``"podman"``) of ``base``."""
    return f"/mokka-{kind}-" + hashlib.sha256(str(base.absolute()).encode()).hexdigest()[:12]


def thaw(dirs: Iterable[Path]) -> None:
    """Unfreeze cgroups ``dirs``: a frozen task sleeps uninterruptibly and ignores SIGKILL.

    runc freezes a container's cgroup while it updates or signals it (v1 ``freezer.state``, v2
    ``cgroup.freeze``); a runc killed in that window leaves the cgroup frozen for good.
    """
    for d in dirs:
        for knob, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
            with contextlib.suppress(OSError):
                if (d / knob).exists():
                    (d / knob).write_text(value)


def kill_cgroup_members(parent: str) -> list[int]:
    """SIGKILL every process in cgroup ``parent`` (any hierarchy), thawed first; the pids signalled."""
    pids: list[int] = []
    dirs = cgroup_dirs(parent)
    thaw(dirs)
    for d in dirs:
        for procs in ("cgroup.procs", "tasks"):
            try:
                members = [int(p) for p in (d / procs).read_text().split()]
            except (OSError, ValueError):
                continue
            for pid in members:
                kill(pid)
            pids += members
    return pids


def rmdir_cgroup(d: Path, problems: list[str]) -> None:
    """Remove one (empty) cgroup directory; a cgroup whose last task just died is briefly busy."""
    for _ in range(100):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                problems.append(f"cannot remove cgroup {d}: {exc.strerror}")
                return
            time.sleep(0.05)
    problems.append(f"cgroup {d} stayed busy")


def remove_tree(path: Path, problems: list[str]) -> None:
    try:
        shutil.rmtree(path)
    except OSError as exc:
        problems.append(f"cannot remove {path}: {exc}")


def processes(match: Sequence[str], *, within: bool = False) -> dict[int, list[str]]:
    """Processes with an argv element equal to one of ``match`` (or containing one, with ``within``)."""
    found: dict[int, list[str]] = {}
    wanted = set(match)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        hit = any(w in a for w in wanted for a in args) if within else bool(wanted.intersection(args))
        if hit:
            found[int(entry.name)] = args
    return found


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until ``pids`` have exited (or are zombies); those still alive after ``timeout``."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if Path(f"/proc/{p}").exists() and not zombie(p)}
        if pending:
            time.sleep(0.05)
    return sorted(pending)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def leftovers(base: Path, kind: str = "sandbox") -> list[str]:
    """What a sandbox (``kind="sandbox"``) or a podman run (``"podman"``) under ``base`` left
    behind: live processes whose command line mentions ``base``, mounts under it, its cgroups,
    the directory itself."""
    base = base.absolute()
    found = [
        f"process {pid}: {' '.join(argv)}"
        for pid, argv in processes([str(base)], within=True).items()
        if not zombie(pid)
    ]
    found += [f"mount {m}" for m in mounts_under(base)]
    found += [f"cgroup {d}" for d in cgroup_dirs(cgroup_parent(base, kind))]
    if base.exists():
        found.append(f"directory {base}")
    return found
