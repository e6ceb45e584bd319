"""``python -m kind.prepare [--tests]``: ``fetch.prepare`` with what this checkout's kind tooling needs
added (``.ci/setup`` runs it): kind's node image with podman's DNS for it, and the Dockerfile's base
image. They live here, not in ``fetch``, because they are developer tooling above every package of
the wheel (kind/ imports fetch and containers, never the other way)."""

from __future__ import annotations

import sys
from pathlib import Path

from fetch import gotool, prepare
from fetch.kube import binaries as kube_binaries
from fetch.kube import gobuild as kube_gobuild
from fetch.kube import versions as kube_versions
from kind import dockerfile_image, nodeimage, provider

__all__ = ["ITEMS", "main"]


def _node_done(cache: Path) -> bool:
    try:
        return nodeimage.cached(cache) is not None and provider.dns_tools_cached(cache)
    except nodeimage.ImageError:  # the Kubernetes build it needs is missing
        return False


def _node_make(cache: Path) -> object:
    try:
        kube_gobuild.build(kube_binaries.KUBEADM, cache)
        kube_binaries.ensure(cache)
        provider.dns_tools(cache)
        return nodeimage.build(cache)
    except (kube_gobuild.BuildError, nodeimage.ImageError, provider.ProviderError) as exc:
        raise gotool.BuildError(f"kind's node image: {exc}") from None


def _base_make(cache: Path) -> object:
    try:
        return dockerfile_image.base_rootfs(cache)
    except dockerfile_image.ImageError as exc:
        raise gotool.BuildError(f"the Dockerfile's base image: {exc}") from None


ITEMS = (
    prepare.Item(
        f"kind's node image (Debian bookworm, containerd 2.1, Kubernetes {kube_versions.KUBERNETES} with kubeadm, "
        "the control-plane images) and podman's dnsname CNI plugin (Debian)",
        "tests/test_kind_cluster.py: bootstrap.sh, the quick start and the FGO guide on real kind "
        "(cold: kubeadm's Go build, about 4 minutes, and 1 minute)",
        _node_done,
        _node_make,
        tests=True,
        go=(kube_binaries.KUBEADM, *kube_binaries.GO_BUILDS),
    ),
    prepare.Item(
        "debian:bookworm-slim for the Dockerfile (bookworm's mmdebstrap, minbase, slim)",
        "tests/test_dockerfile_image.py: the Dockerfile built with podman, no registry here (about 25 s)",
        lambda cache: dockerfile_image.cached_base(cache) is not None,
        _base_make,
        tests=True,
    ),
)


def main(argv: list[str] | None = None) -> int:
    return prepare.main(argv, extra=ITEMS, prog="python -m kind.prepare")


if __name__ == "__main__":
    sys.exit(main())
