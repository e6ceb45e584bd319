"""The cluster's private mount namespace: kubelet and containerd write their fixed host paths
(``/var/lib/kubelet``, ``/run/containerd``, ``/var/log/pods``, CDI and NRI directories...) into
the cluster's directory, kubelet's host sysctls land in plain files, and NVIDIA's tools find the
mock node's sysfs entries at the real ``/sys`` paths — nothing of it visible outside.

The holder process (``python -m testbed.kube.namespace SPEC``, run under ``unshare --mount
--propagation private``) sets the mounts up and then waits for SIGTERM; every cluster process
joins its namespace (``nsenter --mount=/proc/<holder>/ns/mnt``). The namespace, and with it
every mount made in it, ends when the holder and the processes in it are gone.

The spec (JSON) lists ``binds`` (``[source, target]``: bind-mount a file or directory over
``target``) and ``links`` (``[target, path]``: a symlink at ``path``). A target that does not
exist — and every link — is placed in a *union* of its parent: a tmpfs mounted over the parent
that holds the parent's original entries again (directories and files bind-mounted back,
recursively, symlinks copied), plus the new ones. So ``/var/lib/kubelet`` appears without
``/var/lib`` changing on the host, and ``/sys/bus/pci/devices`` shows the mock GPUs beside
the machine's own devices.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import stat
import sys
import time
from pathlib import Path
from types import FrameType

MS_RDONLY = 0x1
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(RuntimeError):
    pass


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None, flags, data.encode() if data else None
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise NamespaceError(f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def _umount(target: str) -> None:
    _libc.umount2(target.encode(), MNT_DETACH)


class Unions:
    """Directories turned into unions (tmpfs + their original entries), by real path."""

    def __init__(self, stash: Path) -> None:
        self.stash = stash
        self.done: set[str] = set()
        self.count = 0

    def ensure(self, directory: str) -> None:
        """Make ``directory`` a union (creating it, inside its parent's union, when missing)."""
        directory = os.path.realpath(directory)
        if directory in self.done:
            return
        if not os.path.lexists(directory):
            parent = os.path.dirname(directory)
            self.ensure(parent)
            os.mkdir(directory, 0o755)
            self.done.add(directory)  # a new directory on a union's tmpfs is writable already
            return
        info = os.stat(directory)
        self.count += 1
        stash = self.stash / str(self.count)
        stash.mkdir(parents=True)
        _mount(directory, str(stash), None, MS_BIND | MS_REC)
        _mount("", str(stash), None, MS_PRIVATE | MS_REC)
        fd = os.open(stash, os.O_RDONLY | os.O_DIRECTORY)
        try:
            entries = sorted(os.listdir(f"/proc/self/fd/{fd}"))
            _mount("tmpfs", directory, "tmpfs", 0, f"mode={stat.S_IMODE(info.st_mode):o},size=16m")
            os.chown(directory, info.st_uid, info.st_gid)
            for name in entries:
                original = f"/proc/self/fd/{fd}/{name}"
                here = os.path.join(directory, name)
                st = os.lstat(original)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(original), here)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    os.mkdir(here, stat.S_IMODE(st.st_mode))
                else:
                    os.close(os.open(here, os.O_CREAT | os.O_WRONLY, 0o600))
                _mount(original, here, None, MS_BIND | MS_REC)
        finally:
            os.close(fd)
            _umount(str(stash))
        self.done.add(directory)


def _real_parent(path: str) -> str:
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def setup(spec: dict[str, list[list[str]]], stash: Path) -> int:
    """Make every bind and link of ``spec``; returns how many directories became unions."""
    unions = Unions(stash)
    for target, path in spec.get("links", []):
        path = _real_parent(path)
        unions.ensure(os.path.dirname(path))
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                _umount(path)
                os.rmdir(path)
            else:
                with contextlib.suppress(OSError):
                    _umount(path)
                os.unlink(path)
        os.symlink(target, path)
    for source, target in spec.get("binds", []):
        target = _real_parent(target)
        if os.path.islink(target):
            target = os.path.realpath(target)
        if not os.path.lexists(target):
            unions.ensure(os.path.dirname(target))
            if os.path.isdir(source):
                os.mkdir(target, 0o755)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        _mount(source, target, None, MS_BIND | MS_REC)
    return unions.count


def _stop(_signum: int, _frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: list[str]) -> int:
    """``SPEC READY``: set up the mounts from SPEC, write READY, wait for SIGTERM."""
    spec_path, ready = Path(argv[0]), Path(argv[1])
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    t0 = time.monotonic()
    try:
        spec = json.loads(spec_path.read_text())
        unions = setup(spec, ready.parent / "stash")
    except (OSError, NamespaceError, ValueError) as exc:
        print(f"namespace: {exc}", file=sys.stderr, flush=True)
        return 1
    ready.write_text(json.dumps({"pid": os.getpid(), "unions": unions, "seconds": time.monotonic() - t0}))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
