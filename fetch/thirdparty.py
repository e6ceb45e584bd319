"""Programs no registry here serves (dcgm-exporter, NVIDIA's DRA driver, run:ai's fake-gpu-operator): the user
brings a directory holding them, plain or ``.xz``-compressed; they are unpacked into a cache
directory once, keyed by the sources' names, sizes and times."""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "thirdparty"  # beside a checkout


def directory(env: str, name: str) -> Path | None:
    """Where a user's build of ``name`` is: the directory ``$env`` names, else the checkout's
    ``../shared/thirdparty/<name>`` when there is one."""
    named = os.environ.get(env)
    if named:
        return Path(named)
    shared = SHARED / name
    return shared if shared.is_dir() else None


class Missing(RuntimeError):
    """A program is not in the directory, or cannot be unpacked; the message names it."""


def unpacked(src: Path, names: Sequence[str], cache: Path) -> dict[str, Path]:
    """``names`` found in ``src`` (``NAME`` or ``NAME.xz``), as executables under ``cache``."""
    found = {}
    for name in names:
        for candidate in (src / name, src / f"{name}.xz"):
            if candidate.is_file():
                found[name] = candidate
                break
        else:
            raise Missing(f"no {name} (nor {name}.xz) there")
    digest = hashlib.sha256("".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in found.values()).encode())
    out = cache / digest.hexdigest()[:12]
    if not all((out / n).is_file() for n in names):
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for name, path in found.items():
            target = tmp / name
            try:
                if path.suffix == ".xz":
                    with lzma.open(path) as fin, target.open("wb") as fout:
                        shutil.copyfileobj(fin, fout)
                else:
                    shutil.copyfile(path, target)
            except (OSError, lzma.LZMAError) as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise Missing(f"{path}: cannot unpack ({exc})") from None
            target.chmod(0o755)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return {name: out / name for name in names}
