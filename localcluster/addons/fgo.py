"""run:ai's fake-gpu-operator (FGO) beside Mokka's nodes: a few nodes with the full driver surface
(Mokka), a large cheap fleet served by FGO from the same GPU profiles.

``mokka cluster up --fgo POOL=PROFILE:COUNT`` publishes every built-in profile as FGO's profile
ConfigMap (``gpu-profile-<name>``, key ``profile.yaml``: what the chart publishes with
``integrations.fakeGpuOperator.enabled``, from the same writer :func:`k8snode.nodeinfo.fgo_profile`)
in FGO's namespace, writes FGO's ``topology`` ConfigMap (each pool: backend ``fake``, its profile),
creates COUNT KWOK nodes per pool (``fgo-<pool>-<i>``, annotated ``kwok.x-k8s.io/node=fake`` and
labelled with FGO's pool key; Mokka's own nodes never carry that key) and runs FGO's
status-updater, kwok-gpu-device-plugin and status-exporter-kwok against the API server, as
processes in the cluster's network namespace (the exporter's fixed ports 8080 and 9400 are free
there) with the environment FGO's chart gives them.

FGO is not on any registry: the user brings its binaries, built from
github.com/run-ai/fake-gpu-operator (``go build ./cmd/status-updater`` and so on), in the directory
``MOKKA_FGO_DIR`` names (plain or ``.xz``-compressed; unpacked into the cache once).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fetch import thirdparty
from gpumodel import profile as profiles
from virtualfleet import pool as virtual

from ..errors import api_errors
from ..nodewatch import NodeWatch, ready
from ..processes import READY_TIMEOUT
from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["BINARIES", "ENV_DIR", "PROCESSES", "Fgo", "FgoSpec", "find_binaries", "pool_status", "up"]

ENV_DIR = "MOKKA_FGO_DIR"
BINARIES = ("status-updater", "kwok-gpu-device-plugin", "status-exporter-kwok")
PROCESSES = tuple(f"fgo-{name}" for name in BINARIES)  # as the cluster's processes are named
NAMESPACE = "gpu-operator"  # FGO's release namespace (its chart's usual one)
RESERVATION_NAMESPACE = "runai-reservation"  # its chart's environment.resourceReservationNamespace
TOPOLOGY = "topology"
POOL_KEY = "run.ai/simulated-gpu-node-pool"  # its topology's nodePoolLabelKey
PROFILE_LABEL = ("fake-gpu-operator/gpu-profile", "true")
FGO_POOL_LABEL = "mokka.io/fgo-pool"


class FgoError(RuntimeError):
    """FGO could not be found or started; the message says what."""


@dataclass(frozen=True)
class FgoSpec:
    """``POOL=PROFILE:COUNT``: COUNT KWOK nodes of FGO pool POOL, served from PROFILE."""

    pool: str
    profile: str
    count: int

    @classmethod
    def parse(cls, text: str) -> FgoSpec:
        pool, sep, rest = text.partition("=")
        profile, colon, count = rest.rpartition(":")
        if not sep or not colon or not pool or not profile:
            raise ValueError(f"{text!r}: expected POOL=PROFILE:COUNT, e.g. fgo=h100:20")
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", pool):
            raise ValueError(f"{text!r}: the pool name is 1-40 lowercase letters, digits and '-'")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{text!r}: the node count after ':' must be a whole number from 1")
        if profile not in profiles.builtin_names():
            raise ValueError(f"{text!r}: FGO reads built-in profiles ({', '.join(profiles.builtin_names())})")
        return cls(pool, profile, int(count))

    @property
    def nodes(self) -> list[str]:
        return [f"fgo-{self.pool}-{i}" for i in range(self.count)]

    def __str__(self) -> str:
        return f"{self.pool}={self.profile}:{self.count}"


def source_dir() -> Path | None:
    value = os.environ.get(ENV_DIR)
    return Path(value) if value else None


def find_binaries(cache: Path) -> Path:
    """The directory of FGO's three binaries, unpacked into ``cache`` once; FgoError says what is missing."""
    src = source_dir()
    if src is None:
        raise FgoError(
            f"--fgo needs fake-gpu-operator's {', '.join(BINARIES)}: set {ENV_DIR} to the directory holding them"
        )
    try:
        return thirdparty.unpacked(src, BINARIES, cache / "fgo")[BINARIES[0]].parent
    except thirdparty.Missing as exc:
        raise FgoError(f"{ENV_DIR}={src}: {exc}") from None


def profile_configmaps() -> list[dict[str, Any]]:
    """Every built-in profile as FGO's profile ConfigMap (the chart's, same writer)."""
    from k8snode import nodeinfo

    out = []
    for name in profiles.builtin_names():
        body = yaml.safe_dump(nodeinfo.fgo_profile(profiles.load(name)), sort_keys=False, width=120)
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"gpu-profile-{name}",
                    "namespace": NAMESPACE,
                    "labels": {PROFILE_LABEL[0]: PROFILE_LABEL[1], "app.kubernetes.io/managed-by": "mokka"},
                },
                "data": {"profile.yaml": body},
            }
        )
    return out


def topology(specs: list[FgoSpec], mig_strategy: str) -> dict[str, Any]:
    """FGO's topology ConfigMap: every pool served by the fake backend from its profile."""
    pools = {s.pool: {"gpu": {"backend": "fake", "profile": s.profile}} for s in specs}
    text = yaml.safe_dump({"nodePoolLabelKey": POOL_KEY, "migStrategy": mig_strategy, "nodePools": pools})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": TOPOLOGY, "namespace": NAMESPACE},
        "data": {"topology.yml": text},
    }


def node_body(spec: FgoSpec, name: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        POOL_KEY: spec.pool,
        FGO_POOL_LABEL: spec.pool,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {virtual.KWOK_ANNOTATION[0]: virtual.KWOK_ANNOTATION[1]},
        },
        "spec": {},
        "status": {"capacity": dict(virtual.NODE_RESOURCES), "allocatable": dict(virtual.NODE_RESOURCES)},
    }


def env(kubeconfig: Path) -> dict[str, str]:
    """What FGO's chart sets for its components (SOURCE: they panic without the first four)."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "TOPOLOGY_CM_NAME": TOPOLOGY,
        "TOPOLOGY_CM_NAMESPACE": NAMESPACE,
        "FAKE_GPU_OPERATOR_NAMESPACE": NAMESPACE,
        "RESOURCE_RESERVATION_NAMESPACE": RESERVATION_NAMESPACE,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }


class Fgo(AddOn):
    """The add-on: FGO's pools of KWOK nodes (KWOK is started by the virtual pools' add-on)."""

    def __init__(self, specs: list[FgoSpec], mig_strategy: str) -> None:
        self.specs = specs
        self.mig_strategy = mig_strategy

    def check(self, cache: Path) -> None:
        find_binaries(cache)

    def up(self, ctx: Context, kit: Kit) -> None:
        from fetch import debcache

        total = sum(f.count for f in self.specs)
        with ctx.step(f"fake-gpu-operator: {total} node(s) in pool(s) {', '.join(map(str, self.specs))}"):
            bindir = find_binaries(ctx.cache or debcache.default_cache())
            ctx.state.fgo = [str(f) for f in self.specs]
            ctx.save()
            with api_errors("fake-gpu-operator"):
                up(ctx, self.specs, bindir, self.mig_strategy)
            ctx.wait(
                f"{total} FGO nodes Ready with GPUs",
                watch(ctx, self.specs).poll,
                timeout=max(READY_TIMEOUT, total * 0.1),
            )


def up(ctx: Context, specs: list[FgoSpec], bindir: Path, mig_strategy: str) -> None:
    """FGO's objects, nodes and processes (KWOK runs already)."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

    core = client.CoreV1Api(ctx.apiserver.client())
    for ns in (NAMESPACE, RESERVATION_NAMESPACE):
        core.create_namespace({"metadata": {"name": ns}}, _preload_content=False)
    for cm in [*profile_configmaps(), topology(specs, mig_strategy)]:
        core.create_namespaced_config_map(NAMESPACE, cm, _preload_content=False)
    virtual.parallel(
        lambda item: core.create_node(node_body(*item), _preload_content=False),
        [(s, n) for s in specs for n in s.nodes],
    )
    for name, proc in zip(BINARIES, PROCESSES, strict=True):
        ctx.processes.spawn(
            ctx.processes.holder, proc, [str(bindir / name)], ctx.layout.logs / f"{proc}.log",
            env=env(ctx.layout.admin_kubeconfig),
        )  # fmt: skip


def watch(ctx: Context, specs: list[FgoSpec]) -> NodeWatch:
    """A watch that is done once every FGO node is Ready with its profile's GPUs and product label."""
    gpus = {n: str(profiles.load(s.profile).gpu_count) for s in specs for n in s.nodes}

    def done(node: dict[str, Any]) -> bool:
        allocatable = node.get("status", {}).get("allocatable", {})
        labelled = "nvidia.com/gpu.product" in node["metadata"].get("labels", {})
        return ready(node) and labelled and allocatable.get("nvidia.com/gpu") == gpus[node["metadata"]["name"]]

    return NodeWatch(ctx.apiserver, FGO_POOL_LABEL, gpus, done)


def pool_status(ctx: Context, specs: list[FgoSpec]) -> list[dict[str, Any]]:
    """Per FGO pool: nodes, Ready, and the GPUs FGO's device plugin gave them."""
    from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

    core = client.CoreV1Api(ctx.apiserver.client())
    items = json.loads(core.list_node(label_selector=FGO_POOL_LABEL, _preload_content=False).data)["items"]
    out = []
    for s in specs:
        mine = [i for i in items if i["metadata"]["labels"].get(FGO_POOL_LABEL) == s.pool]
        up = [i for i in mine if ready(i)]
        out.append(
            {
                "pool": s.pool,
                "spec": str(s),
                "nodes": len(mine),
                "wanted": s.count,
                "ready": len(up),
                "allocatable_gpus": sum(int(i["status"].get("allocatable", {}).get("nvidia.com/gpu", 0)) for i in mine),
                "products": sorted({i["metadata"]["labels"].get("nvidia.com/gpu.product", "") for i in mine} - {""}),
            }
        )
    return out
