"""Private views of the host's paths, made in a mount namespace of their own.

A *view* (a JSON-able dict) lists ``binds`` (``[source, target]``: bind-mount a file or
directory over ``target``), ``links`` (``[target, path]``: a symlink at ``path``), ``absent``
(paths that must not exist) and ``shared`` (mount points made recursively shared once the rest is
in place, as a systemd host's are: what a container mounts there with Bidirectional propagation
reaches the namespace, never the host, whose mounts are private to it). A bind target that does
not exist, every link and every absent path are placed in a *union* of their parent: a tmpfs
mounted over the parent that holds the parent's original entries again (directories and files
bind-mounted back, recursively, symlinks copied), plus the new ones and less the absent ones.
So ``/var/lib/kubelet`` appears, or disappears, without ``/var/lib`` changing on the host; what
is written into an existing entry still reaches the host, what is created beside them lands on
the tmpfs and goes with the namespace.

Two users: the local cluster's namespace holder (:mod:`localcluster.namespace`) and
``python -m containers.mounts``, which runs one command in a view (``--view FILE``: one written as
JSON, as :mod:`virtualfleet.template` runs NVIDIA's GFD on a staged node) — with ``--fresh``, a view in
which every path a GPU node's software keeps on the host (:data:`FRESH_PATHS`: kubelet's,
containerd's, CDI's, NRI's, ``/run/nvidia``...) is absent, as on a machine that never ran any of
it. Whatever the command makes there is gone when it ends; the host is never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FRESH_PATHS", "MountError", "Unions", "enter", "main", "setup"]

MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_SHARED = 1 << 20
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000
UNION_SIZE = "16m"  # a union's tmpfs holds only the new entries (the originals are bind mounts)

# What kubelet, containerd, CDI-aware runtimes, NRI and NVIDIA's components keep at fixed host
# paths. None of them exists on a fresh machine; code and tests must create what they use.
FRESH_PATHS = (
    "/var/lib/kubelet",
    "/etc/kubernetes",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/containerd",
    "/run/containerd",
    "/var/lib/containerd",
    "/etc/cdi",
    "/var/run/cdi",
    "/opt/nri",
    "/etc/nri",
    "/var/run/nri",
    "/run/nvidia",
    "/var/lib/mokka",
    "/etc/cni",
    "/opt/cni",
    "/var/lib/cni",
)

_libc = ctypes.CDLL(None, use_errno=True)


class MountError(RuntimeError):
    pass


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None, flags, data.encode() if data else None
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise MountError(f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def _umount(target: str) -> None:
    _libc.umount2(target.encode(), MNT_DETACH)


class Unions:
    """Directories turned into unions (tmpfs + their original entries), by real path."""

    def __init__(self, stash: Path, size: str = UNION_SIZE) -> None:
        self.stash = stash
        self.size = size
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
            _mount("tmpfs", directory, "tmpfs", 0, f"mode={stat.S_IMODE(info.st_mode):o},size={self.size}")
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
            with contextlib.suppress(OSError):
                stash.rmdir()
        self.done.add(directory)


def _real_parent(path: str) -> str:
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _remove(path: str) -> None:
    """Take an entry of a union away (a bind-mounted directory or file, or a copied link)."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        _umount(path)
        os.rmdir(path)
    else:
        with contextlib.suppress(OSError):
            _umount(path)
        os.unlink(path)


def setup(view: dict[str, Any], stash: Path, size: str = UNION_SIZE) -> int:
    """Make every absent path, link, bind and shared mount of ``view``; returns how many directories
    became unions."""
    unions = Unions(stash, size)
    for path in view.get("absent", []):
        path = _real_parent(path)
        if not os.path.lexists(path) and not os.path.isdir(os.path.dirname(path)):
            continue  # its parent is missing too: nothing to hide, nowhere the host could be written
        unions.ensure(os.path.dirname(path))
        _remove(path)
    for target, path in view.get("links", []):
        path = _real_parent(path)
        unions.ensure(os.path.dirname(path))
        _remove(path)
        os.symlink(target, path)
    for source, target in view.get("binds", []):
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
    for path in view.get("shared", []):
        _mount("", _real_parent(path), None, MS_SHARED | MS_REC)
    return unions.count


def enter(view: dict[str, Any], size: str = UNION_SIZE) -> int:
    """Move this process into a new private mount namespace and make ``view`` there."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise MountError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    _mount("", "/", None, MS_PRIVATE | MS_REC)
    stash = Path(tempfile.mkdtemp(prefix="mokka-mounts-"))
    try:
        return setup(view, stash, size)
    finally:
        shutil.rmtree(stash, ignore_errors=True)


def _bind(text: str) -> list[str]:
    source, sep, target = text.partition(":")
    if not sep or not source or not target:
        raise argparse.ArgumentTypeError(f"{text!r}: expected SOURCE:TARGET")
    if not os.path.lexists(source):
        raise argparse.ArgumentTypeError(f"{source}: no such file or directory")
    return [os.path.abspath(source), os.path.abspath(target)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m containers.mounts",
        description="Run COMMAND in a private mount namespace with some host paths bound, or made absent. "
        "Nothing of it is visible outside, and nothing it creates beside the host's entries stays.",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="make every path a GPU node's software keeps absent: " + " ".join(FRESH_PATHS),
    )
    parser.add_argument("--absent", action="append", default=[], metavar="PATH", help="make PATH absent (repeatable)")
    parser.add_argument(
        "--bind", action="append", default=[], type=_bind, metavar="SOURCE:TARGET", help="bind SOURCE over TARGET"
    )
    parser.add_argument(
        "--view",
        type=Path,
        metavar="FILE",
        help="a view as JSON (binds, links, absent, shared; this module's doc says how each is placed), "
        "added to the options' own",
    )
    parser.add_argument(
        "--size", default="25%", help="size of each union's tmpfs, for what is created there (default: %(default)s)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if os.geteuid() != 0:
        parser.error("a private mount namespace needs root")
    view: dict[str, Any] = {}
    if args.view is not None:
        try:
            view = json.loads(args.view.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--view {args.view}: {exc}")
        if not isinstance(view, dict):
            parser.error(f"--view {args.view}: not a JSON object")
    view["absent"] = [*view.get("absent", []), *(FRESH_PATHS if args.fresh else ()), *args.absent]
    view["binds"] = [*view.get("binds", []), *args.bind]
    try:
        enter(view, args.size)
    except (OSError, MountError) as exc:
        print(f"mounts: error: {exc}", file=sys.stderr)
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"mounts: error: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
