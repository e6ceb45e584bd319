"""The real nodes of a cluster, as ``mokka cluster up --node PROFILE[:GPUS][@RACK]`` names them:
each a profile (built-in name or YAML file), a GPU count (default: the profile's) and the NVLink
domain it is in (default: none, or its board's rack, see :func:`gpumodel.fleet.default_rack`).

A cluster made without ``--node`` has one node, ``localhost``, of ``--profile``/``--gpus``, with
the profile's GPUs as they are. With ``--node``, node ``i`` is named ``<profile>-<i>`` and its GPUs
are its own (:func:`gpumodel.fleet.as_node`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpumodel import fleet
from gpumodel import profile as profiles

from .layout import MAX_NODES
from .pki import NODE_NAME

__all__ = ["NodeSpec", "ResolvedNode", "resolve"]


@dataclass(frozen=True)
class NodeSpec:
    profile: str = "h100"
    gpus: int | None = None
    rack: str | None = None

    @classmethod
    def parse(cls, text: str) -> NodeSpec:
        """``PROFILE[:GPUS][@RACK]``; ValueError names what is wrong."""
        rest, _, rack = text.partition("@")
        name, sep, count = rest.partition(":")
        if not name:
            raise ValueError(f"{text!r}: expected PROFILE[:GPUS][@RACK], e.g. h100, t4:2 or gb200@rack-a")
        if "@" in text and not rack:
            raise ValueError(f"{text!r}: no rack name after '@'")
        gpus = None
        if sep:
            if not count.isdigit() or int(count) < 1:
                raise ValueError(f"{text!r}: the GPU count after ':' must be a whole number from 1")
            gpus = int(count)
        return cls(name, gpus, rack or None)

    def __str__(self) -> str:
        return self.profile + (f":{self.gpus}" if self.gpus else "") + (f"@{self.rack}" if self.rack else "")


@dataclass(frozen=True)
class ResolvedNode:
    """A node's name and the profile it runs, its GPUs' identities and rack applied."""

    name: str
    spec: NodeSpec
    profile: profiles.Profile
    rack: str | None


def _label(profile_arg: str) -> str:
    stem = Path(profile_arg).stem if profile_arg.endswith((".yaml", ".yml")) else profile_arg
    return re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40] or "node"


def resolve(specs: Sequence[NodeSpec], fleet_names: bool, fabric_delay: float = 0) -> list[ResolvedNode]:
    """Each spec's node; ``fleet_names``: named ``<profile>-<i>`` with GPUs of its own (``--node``),
    else the one node ``localhost`` with the profile's GPUs; ``fabric_delay``: the fabric manager of
    every rack is ready that many seconds from now. A ValueError names the node."""
    if not specs:
        raise ValueError("a cluster needs at least one node")
    if len(specs) > MAX_NODES:
        raise ValueError(f"{len(specs)} nodes: a cluster holds at most {MAX_NODES} real nodes")
    if not fleet_names and len(specs) != 1:
        raise ValueError("several nodes need fleet names")
    out: list[ResolvedNode] = []
    seen: dict[str, int] = {}  # how many nodes of each profile so far (default racks fill in order)
    for i, spec in enumerate(specs):
        name = f"{_label(spec.profile)}-{i}" if fleet_names else NODE_NAME
        try:
            prof = profiles.load(spec.profile).with_count(spec.gpus)
            nth = seen.get(prof.name, 0)
            seen[prof.name] = nth + 1
            rack = spec.rack or (fleet.default_rack(prof, nth) if fleet_names else None)
            if fleet_names:
                prof = fleet.as_node(prof, name)
            if rack:
                prof = fleet.with_fabric_delay(fleet.in_rack(prof, rack), fabric_delay)
        except (profiles.ProfileError, ValueError) as exc:
            raise ValueError(f"node {name} ({spec}): {exc}") from None
        out.append(ResolvedNode(name, spec, prof, rack))
    return out
