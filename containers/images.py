"""Container images without a registry: small root filesystems and one-layer OCI archives.

A root is Debian's static busybox (every applet linked) plus, when asked, the host's shared
libraries some programs need (glibc); :func:`oci_archive` writes it as an OCI image-layout
tarball that ``ctr images import`` registers under a name.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from containers.command import SandboxError, run
from fetch import busybox

__all__ = ["PATH_ENV", "PAUSE_IMAGE", "WORKLOAD_IMAGE", "make_rootfs", "names", "oci_archive"]

PAUSE_IMAGE = "localhost/mokka/pause:1"
WORKLOAD_IMAGE = "localhost/mokka/workload:1"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _shared_libraries(programs: Iterable[Path]) -> list[Path]:
    """Host paths of the shared libraries ``programs`` need (by ``ldd``), the loader included."""
    found: list[Path] = []
    for program in programs:
        res = run(["ldd", program], check=False)
        if res.returncode != 0 and "not a dynamic executable" not in res.stdout + res.stderr:
            raise SandboxError(f"ldd {program}: {res.stderr.strip() or res.stdout.strip()}")
        for line in res.stdout.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/") and Path(path) not in found:
                found.append(Path(path))
            elif "not found" in line:
                raise SandboxError(f"ldd {program}: {line.strip()}")
    return found


def make_rootfs(dest: Path, *, programs: Sequence[Path] = (), cache: Path | None = None) -> Path:
    """A small usr-merged root: static busybox (every applet in /usr/bin) and, when ``programs``
    are given, the host libraries they need (glibc: loader, libc, libm, ...), nothing else.

    ``programs`` themselves are not copied: a test mounts them in (CDI, NRI, bind mounts).
    """
    dest.mkdir(parents=True, exist_ok=True)
    for sub in ("usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "etc", "dev", "proc", "sys", "run"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").mkdir(mode=0o1777, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    for top in ("bin", "sbin", "lib", "lib64"):
        if not (dest / top).is_symlink():
            (dest / top).symlink_to(f"usr/{top}")
    bb = busybox.fetch(cache)
    shutil.copy2(bb, dest / "usr/bin/busybox")
    applets = run([bb, "--list"]).stdout.split()
    for applet in applets:
        link = dest / "usr/bin" / applet
        if applet != "busybox" and not link.is_symlink():
            link.symlink_to("busybox")
    (dest / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (dest / "etc/group").write_text("root:x:0:\n")
    for lib in _shared_libraries(programs):
        rel = lib.relative_to("/")
        target = dest / rel if rel.parts[0] == "usr" else dest / "usr" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, target)  # follows the host's symlinks: the soname path holds the file
    return dest


def _layer(rootfs: Path) -> bytes:
    """An uncompressed, reproducible tar of ``rootfs`` (root-owned, fixed mtimes)."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            here = Path(dirpath)
            for name in sorted(dirnames + filenames):
                path = here / name
                tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=clean)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def oci_archive(
    rootfs: Path,
    out: Path,
    name: str,
    *,
    cmd: Sequence[str] = ("/bin/sh",),
    env: Sequence[str] = (PATH_ENV,),
    entrypoint: Sequence[str] = (),
    user: str = "",
) -> Path:
    """Write ``rootfs`` as a one-layer OCI image-layout tarball ``out`` named ``name``
    (``entrypoint``: the image's, which a pod's ``args`` follow; ``cmd``: its default arguments;
    ``user``: who its processes run as, ``UID[:GID]``, root by default).

    The index carries ``io.containerd.image.name`` so ``ctr images import`` registers ``name``.
    """
    layer = _layer(rootfs)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": list(env),
            "Cmd": list(cmd),
            "WorkingDir": "/",
            **({"Entrypoint": list(entrypoint)} if entrypoint else {}),
            **({"User": user} if user else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created_by": "containers.images.oci_archive", "comment": str(rootfs)}],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(tar, layer)}
        config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(tar, _json(config))}
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            **_blob(tar, _json(manifest)),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rpartition(":")[2],
            },
        }
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [manifest_desc],
        }
        for member, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


def names(archive: Path) -> list[str]:
    """The image names an OCI archive carries (``io.containerd.image.name`` of its manifests)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise SandboxError(f"{archive}: no index.json")
        index = json.load(member)
    return [
        name
        for manifest in index.get("manifests", [])
        if (name := manifest.get("annotations", {}).get("io.containerd.image.name"))
    ]
