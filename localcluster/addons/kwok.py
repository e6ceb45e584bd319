"""KWOK's controller for the local cluster's virtual nodes (:mod:`.virtualpools`, :mod:`.fgo`): its
configuration and command line. It manages only the nodes annotated ``kwok.x-k8s.io/node=fake``,
never a kubelet's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..layout import Layout

__all__ = ["LEASE_SECONDS", "POD_CIDR", "WORKERS", "argv", "configuration", "write_configuration"]

# Where KWOK's pods get addresses (no network behind them): apart from every pod subnet here.
POD_CIDR = "100.64.0.0/12"
# KWOK renews a node's lease every quarter of its duration: every 120 s, so 5000 virtual nodes cost
# about 40 writes a second (the kubelet's 40 s lease, renewed every 10 s, would be 500: more than two
# cores serve beside everything else, and nodes would flap NotReady); the controller manager waits
# for it accordingly (:data:`localcluster.config.VIRTUAL_NODE_GRACE`).
LEASE_SECONDS = 480
# KWOK's workers. Its node workers (4 by default) are 16: a thousand nodes' stages and leases are
# played sooner; its pod workers stay 4 (more take the CPU the scheduler needs). A configuration
# file's options are not defaulted, so each is given.
WORKERS = {
    "nodePlayStageParallelism": 16,
    "nodeLeaseParallelism": 16,
    "podPlayStageParallelism": 4,
    "podsOnNodeSyncParallelism": 1,
}


def configuration() -> dict[str, Any]:
    """KWOK's own configuration object (its workers; the rest its defaults)."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": dict(WORKERS),
    }


def write_configuration(layout: Layout) -> Path:
    path = layout.base / "kwok.yaml"
    path.write_text(yaml.safe_dump(configuration(), sort_keys=False))
    return path


def argv(bindir: Path, layout: Layout, stages: Sequence[str]) -> list[str]:
    """KWOK for the nodes annotated ``kwok.x-k8s.io/node=fake`` only (never a kubelet's), with its
    module's own stages (in ``bindir`` beside the binary) and :func:`configuration`; warnings
    only in its log (it logs every patch and lease otherwise)."""
    return [
        str(bindir / "kwok"),
        f"--kubeconfig={layout.admin_kubeconfig}",
        "--v=WARN",
        f"--config={layout.base / 'kwok.yaml'}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--node-lease-duration-seconds={LEASE_SECONDS}",
        f"--cidr={POD_CIDR}",
        *(f"--config={bindir / Path(stage).name}" for stage in stages),
    ]
