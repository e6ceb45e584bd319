"""An image with Debian's RDMA tools, unmodified, for tests that run them in containers: busybox,
the tools named, libibverbs with its mlx5 provider, and the host libraries they (and the programs a
GPU container gets mounted, such as nvidia-smi and the sysfs shim) link against. Nothing Mokka's."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from containers import images

PROVIDER = Path("/usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so")
# ibstatus is a shell script: it runs on a dynamically linked shell and cat, as in a Debian image
# (a static busybox is out of any LD_PRELOAD's reach, as it is out of a real image's sysfs path).
SHELL = (Path("/bin/dash"), Path("/usr/bin/cat"), Path("/usr/bin/sed"))


def build(workdir: Path, name: str, tools: Sequence[str], *, mounted: Sequence[Path] = ()) -> Path:
    """The OCI archive of image ``name`` under ``workdir``: ``tools`` (found on the host) in
    /usr/sbin, the shell above in /usr/local/bin, and the libraries of both and of ``mounted``."""
    found = [shutil.which(t, path="/usr/sbin:/sbin:/usr/bin:/bin") for t in tools]
    if not all(found) or not PROVIDER.exists():
        pytest.fail(
            f"{', '.join(tools)} and the mlx5 verbs provider: install Debian's infiniband-diags, ibverbs-utils "
            "and ibverbs-providers (.ci/setup --tests does)"
        )
    paths = [Path(str(t)) for t in found]
    binaries = [p for p in paths if p.name != "ibstatus"]
    rootfs = images.make_rootfs(workdir / "rootfs", programs=[*binaries, PROVIDER, *SHELL, *mounted])
    for path in paths:
        shutil.copy2(path, rootfs / "usr/sbin" / path.name)
    (rootfs / PROVIDER.parent.relative_to("/")).mkdir(parents=True, exist_ok=True)
    shutil.copy2(PROVIDER, rootfs / PROVIDER.relative_to("/"))
    (rootfs / "etc/libibverbs.d").mkdir(parents=True)
    shutil.copy2("/etc/libibverbs.d/mlx5.driver", rootfs / "etc/libibverbs.d/mlx5.driver")
    (rootfs / "usr/local/bin").mkdir(parents=True)
    for program in SHELL:
        shutil.copy2(program, rootfs / "usr/local/bin" / program.name)
    return images.oci_archive(rootfs, workdir / "image.tar", name)
