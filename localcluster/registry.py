"""A plain-HTTP OCI registry (CNCF distribution's, Debian's ``docker-registry``:
:data:`fetch.kube.versions.REGISTRY`) on the cluster's loopback, for images a chart pulls with
``imagePullPolicy: Always``: every node's containerd is told to pull from it over http
(:func:`.config.write_registry_hosts`), and an image already in a node's containerd is pushed to it
with ``ctr push`` (run in the cluster's network namespace, where the registry listens).

It runs as one of the cluster's processes, so ``down`` stops it; its storage is under the cluster's
directory."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fetch import containerd_dist
from fetch.kube import versions as kube_versions

from . import config
from .errors import ClusterError

if TYPE_CHECKING:
    from .context import Context

__all__ = ["PORT", "PROCESS", "push", "start"]

PORT = 5000  # in the cluster's own network namespace: nothing else listens there
PROCESS = "registry"


def _run(ctx: Context, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` in the cluster's network namespace (the registry's loopback), the control plane's mounts."""
    return ctx.processes.run(ctx.processes.holder, argv, timeout=300)


def address() -> str:
    return f"127.0.0.1:{PORT}"


def start(ctx: Context, binary: Path) -> str:
    """Run the registry and tell every node's containerd about it; its ``HOST:PORT``."""
    root = ctx.layout.base / "registry"
    settings = {
        "version": 0.1,
        "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": {"addr": address()},
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yml").write_text(yaml.safe_dump(settings))
    ctx.processes.spawn(
        None, PROCESS, [str(binary), "serve", str(root / "config.yml")], ctx.layout.logs / "registry.log"
    )
    deadline = time.monotonic() + 30
    while _run(ctx, ["wget", "-q", "-O", "/dev/null", f"http://{address()}/v2/"]).returncode:
        if time.monotonic() > deadline:
            raise ClusterError(f"the registry did not answer on {address()} (log: {ctx.layout.logs / 'registry.log'})")
        time.sleep(0.3)
    for n in ctx.nodes:
        config.write_registry_hosts(n.layout, address())
    return address()


def push(ctx: Context, image: str, repository: str) -> str:
    """Push ``image`` (in the first node's containerd) to the registry as ``repository`` (``NAME:TAG``),
    then drop that name from the node again, so that every node pulls it; the pushed reference."""
    node = ctx.nodes[0]
    ref = f"{address()}/{repository}"
    node.ctr("images", "tag", "--force", image, ref)
    ctr = containerd_dist.fetch(kube_versions.CONTAINERD, ctx.cache) / "ctr"
    argv = [str(ctr), "-a", str(node.layout.containerd_socket), "-n", "k8s.io", "images", "push", "--plain-http", ref]
    res = _run(ctx, argv)
    node.ctr("images", "rm", ref, check=False)
    if res.returncode != 0:
        raise ClusterError(f"ctr push {ref}: {res.stderr.strip() or res.stdout.strip()}")
    return ref


def manifest_exists(ctx: Context, repository: str) -> bool:
    name, _, tag = repository.rpartition(":")
    url = f"http://{address()}/v2/{name}/manifests/{tag}"
    argv = ["wget", "-q", "-O", "/dev/null", "--header", "Accept: application/vnd.oci.image.manifest.v1+json", url]
    return _run(ctx, argv).returncode == 0
