"""A pool's template: what every node of a virtual pool carries, computed once from its profile by
the code and the programs a real node of that profile runs — never a second copy of the facts.

The profile is staged as a mock node (host setup, under a directory of the caller's); NVIDIA's GPU
Feature Discovery labels it once, run in a mount namespace where the staged sysfs is at the real
paths (``python -m containers.mounts --view``: GFD reads ``/sys`` past any LD_PRELOAD shim); the
DRA devices are read through NVML as Mokka's DRA plugin reads a node; the device plugin's
resources come from :mod:`k8snode.deviceplugin`; NFD's PCI labels (when asked) from Mokka's
feature file (:mod:`k8snode.nodeinfo`). Then the node is unstaged. Root is needed (device nodes,
the namespace); the local cluster runs this on the host, the fleet controller in its pod.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumodel import fleet, nodelayout
from gpumodel.profile import Profile
from hostsetup import node as hostnode
from hostsetup.view import sysfs_view
from k8snode import deviceplugin, gfd, nodeinfo

__all__ = ["GFD_TIMEOUT", "Template", "TemplateError", "compute"]

GFD_TIMEOUT = 120.0  # seconds for GFD's one-shot (it takes about one on this machine)


class TemplateError(Exception):
    """The template could not be computed; the message names the pool and what failed."""


@dataclass(frozen=True)
class Template:
    labels: dict[str, str]  # GFD's on the staged profile (and NFD's PCI labels when asked)
    per_gpu: list[dict[str, int]]  # the device plugin's resources, GPU by GPU
    devices: list[dict[str, Any]]  # the DRA plugin's ResourceSlice devices
    nic_devices: list[dict[str, Any]]  # its InfiniBand adapters' (driver nic.mokka.io), read from the staged sysfs
    racked: bool  # the board is built into racks: the labels carry a clique (each node gets its rack's)


def racked(profile: Profile) -> bool:
    """The board is built into racks (its fabric names a cluster, as GB200 and GB300 NVL72 do)."""
    return fleet.default_rack(profile, 0) is not None


def compute(
    profile: Profile,
    pool: str,
    gfd_binary: Path,
    workdir: Path,
    mig_strategy: str = "none",
    with_nfd: bool = False,
) -> Template:
    """The template of pool ``pool`` of ``profile`` (its GPU count already chosen), computed under
    ``workdir`` (left empty). GFD's output goes to ``workdir/gfd.log`` while it runs."""
    from k8snode.dra import gpus as dra_gpus
    from k8snode.dra import nics, resources

    name = f"template-{pool}"
    staged = fleet.as_node(profile, name)
    is_racked = racked(profile)
    if is_racked:
        staged = fleet.in_rack(staged, f"virtual-{pool}-template")
    root = workdir / "node"
    root.mkdir(parents=True, exist_ok=True)
    try:
        hostnode.apply(hostnode.plan(staged, hostnode.Options(root=root)))
        node = nodelayout.NodeLayout.load(root)
        labels = _gfd_labels(pool, gfd_binary, node, workdir, mig_strategy)
        try:
            info = dra_gpus.read(Path(node.library), root / "sys")
        except dra_gpus.NvmlError as exc:
            raise TemplateError(f"pool {pool}: {exc}") from None
        adapters = nics.read(root / "sys")
    except (OSError, hostnode.SetupError) as exc:
        raise TemplateError(f"pool {pool}: staging {profile.name}: {exc}") from None
    finally:
        if (root / "node.json").exists() or (root / ".mokka").exists():
            hostnode.cleanup(root)
        shutil.rmtree(root, ignore_errors=True)
    if with_nfd:
        labels.update({nodeinfo.NFD_PREFIX + k: v for k, v in nodeinfo.nfd_features(profile).items()})
    return Template(
        labels=labels,
        per_gpu=deviceplugin.allocatable_by_gpu(profile, mig_strategy),
        devices=[resources.device(g, info) for g in info.gpus],
        nic_devices=[resources.nic_device(n) for n in adapters],
        racked=is_racked,
    )


def _gfd_labels(
    pool: str, binary: Path, node: nodelayout.NodeLayout, workdir: Path, mig_strategy: str
) -> dict[str, str]:
    view = workdir / "view.json"
    view.write_text(json.dumps(sysfs_view(Path(node.root))))
    out = workdir / "labels"
    out.unlink(missing_ok=True)
    driver_root = Path(node.root) / "driver"
    argv = [
        sys.executable, "-m", "containers.mounts", "--view", str(view), "--",
        *gfd.oneshot_argv(binary, out, driver_root, mig_strategy),
    ]  # fmt: skip
    # NVIDIA's Go tools dlopen libnvidia-ml.so.1 from the library path only (go-nvlib's check).
    env = {**os.environ, "LD_LIBRARY_PATH": node.libdir}
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=GFD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise TemplateError(f"pool {pool}: gpu-feature-discovery ran past {GFD_TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise TemplateError(f"pool {pool}: gpu-feature-discovery: {exc}") from None
    finally:
        view.unlink(missing_ok=True)
    (workdir / "gfd.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0 or not out.exists():
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise TemplateError(f"pool {pool}: gpu-feature-discovery exited {res.returncode}: {last}")
    labels = gfd.parse_labels(out.read_text())
    out.unlink()
    return labels
