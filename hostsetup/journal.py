"""A record of every change host setup makes, so cleanup restores the node byte for byte.

Each change goes through one of the ``Journal`` methods, which performs it atomically
and records it before returning: a created file, directory, link or device node is
removed on undo; a file or link that existed before is saved first and put back.
The journal itself is saved (atomically) after every change, so an interrupted setup
can still be undone.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumodel import atomic


class JournalError(Exception):
    """A change could not be made or undone; the message names the path."""


@dataclass
class Entry:
    kind: str  # "dir" | "file" | "link" | "device" | "replaced"
    path: str
    backup: str | None = None  # for "replaced": where the previous content was saved

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "backup": self.backup}


@dataclass
class Journal:
    path: Path  # where the journal lives (inside the root)
    backups: Path  # directory for saved originals
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def open(cls, root: Path) -> Journal:
        path = root / ".mokka" / "journal.json"
        journal = cls(path=path, backups=root / ".mokka" / "backups")
        if path.exists():
            try:
                data = json.loads(path.read_text())
                journal.entries = [Entry(**e) for e in data["entries"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise JournalError(
                    f"{path}: corrupt journal ({exc}); remove it by hand after checking the root"
                ) from None
        return journal

    # ---- queries ------------------------------------------------------------------

    def owns(self, path: Path) -> bool:
        p = str(path)
        return any(e.path == p and e.kind != "replaced" for e in self.entries)

    def touched(self, path: Path) -> bool:
        p = str(path)
        return any(e.path == p for e in self.entries)

    # ---- persistence --------------------------------------------------------------

    def save(self) -> None:
        if not self.entries and not self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"entries": [e.as_dict() for e in self.entries]}, indent=1))
        os.replace(tmp, self.path)

    def _record(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.save()

    # ---- changes ------------------------------------------------------------------

    def adopt_dir(self, path: Path) -> None:
        """Record a directory that was moved into place whole (a staged tree)."""
        self._record(Entry("dir", str(path)))

    def mkdir(self, path: Path, mode: int = 0o755) -> None:
        """Create ``path`` and any missing parents, recording each one created."""
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=mode)
            self._record(Entry("dir", str(d)))

    def _save_original(self, path: Path) -> None:
        if self.touched(path):
            return
        self.backups.mkdir(parents=True, exist_ok=True)
        backup = self.backups / f"{len(self.entries):04d}-{path.name}"
        if path.is_symlink():
            os.symlink(os.readlink(path), backup)
        else:
            shutil.copy2(path, backup)
        self._record(Entry("replaced", str(path), str(backup)))

    def write(self, path: Path, data: bytes, mode: int = 0o644, in_place: bool = False) -> bool:
        """Write a file atomically (temp + fsync + rename); return whether it changed.

        ``in_place`` rewrites an existing file of the same size without replacing its
        inode (files bind-mounted into containers must keep theirs).
        """
        self.mkdir(path.parent)
        if path.exists() and not path.is_symlink():
            if path.read_bytes() == data and stat.S_IMODE(path.stat().st_mode) == mode:
                return False
            if not self.owns(path):
                self._save_original(path)
            if in_place and path.stat().st_size == len(data):
                with open(path, "r+b") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                return True
        elif path.is_symlink() and not self.owns(path):
            self._save_original(path)
        new = not path.exists() and not path.is_symlink()
        atomic.write(path, data, mode)
        if new:
            self._record(Entry("file", str(path)))
        return True

    def copy(self, src: Path, dst: Path, mode: int = 0o755) -> bool:
        return self.write(dst, src.read_bytes(), mode)

    def symlink(self, path: Path, target: str) -> bool:
        self.mkdir(path.parent)
        if path.is_symlink() and os.readlink(path) == target:
            return False
        if (path.exists() or path.is_symlink()) and not self.owns(path):
            if path.is_dir() and not path.is_symlink():
                raise JournalError(f"{path}: a directory is in the way of the link to {target}")
            self._save_original(path)
        new = not (path.exists() or path.is_symlink())
        atomic.symlink(path, target)
        if new:
            self._record(Entry("link", str(path)))
        return True

    def mknod(self, path: Path, major: int, minor: int, mode: int = 0o666) -> bool:
        self.mkdir(path.parent)
        if path.exists():
            st = path.stat()
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major and os.minor(st.st_rdev) == minor:
                return False
            if not self.owns(path):
                raise JournalError(f"{path}: exists and is not Mokka's device node; refusing to replace it")
            path.unlink()
            self.entries = [e for e in self.entries if e.path != str(path)]
        try:
            os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
        except PermissionError:
            raise JournalError(f"{path}: cannot create a device node (needs root or CAP_MKNOD)") from None
        os.chmod(path, mode)
        self._record(Entry("device", str(path)))
        return True

    # ---- undo ---------------------------------------------------------------------

    def undo(self, since: int = 0) -> list[str]:
        """Revert the changes recorded from entry ``since`` on, newest first; return what was done."""
        done = []
        for entry in reversed(self.entries[since:]):
            path = Path(entry.path)
            if entry.kind == "replaced":
                assert entry.backup is not None
                backup = Path(entry.backup)
                if path.is_symlink() or path.is_file():
                    path.unlink()
                if backup.is_symlink():
                    os.symlink(os.readlink(backup), path)
                    backup.unlink()
                else:
                    os.replace(backup, path)  # copy2 kept mode and times
                done.append(f"restored {path}")
            elif entry.kind == "dir":
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)  # created by us, with everything in it
                    done.append(f"removed {path}/")
            else:
                if path.is_symlink() or path.exists():
                    path.unlink()
                    done.append(f"removed {path}")
        self.entries = self.entries[:since]
        if since:
            self.save()
            return done
        if self.backups.is_dir():
            shutil.rmtree(self.backups)
        if self.path.exists():
            self.path.unlink()
        meta = self.path.parent
        if meta.is_dir() and not any(meta.iterdir()):
            meta.rmdir()
        return done
