"""What an add-on is: one pairing on top of the cluster's real nodes (NVIDIA's device plugin, a DRA
driver, GFD's labels, dcgm-exporter, virtual pools, fake-gpu-operator), brought up by ``mokka
cluster up`` once every node is Ready.

An add-on is made from the options that ask for it, then, in order:

- :meth:`AddOn.check` before anything of the cluster is made: what it needs is there (a user's
  binaries, say), else one line saying what and where;
- :meth:`AddOn.fetch` during the binaries step: what it builds or fetches into the cache;
- :meth:`AddOn.up` with the cluster's :class:`~localcluster.context.Context` (the API server, its
  processes and nodes, images, the cache, waits and steps) and the :class:`Kit` of binaries every
  add-on may use: one or more steps, each ``with ctx.step(title)``.

Nothing of an add-on is imported by the lower files of the package; :mod:`..cluster` imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fetch.kube.binaries import Binaries

if TYPE_CHECKING:
    from ..context import Context

__all__ = ["AddOn", "Kit"]


@dataclass(frozen=True)
class Kit:
    """The binaries the cluster fetched and built for its nodes: Kubernetes' and NVIDIA's builds
    (``bins``), and nvidia-smi (the staged nodes')."""

    bins: Binaries
    nvidia_smi: Path


class AddOn:
    """The base of every add-on: by default it needs nothing checked and fetches nothing."""

    def check(self, cache: Path) -> None:
        """Raise a one-line error when something it needs is not there."""

    def fetch(self, cache: Path | None) -> None:
        """Fetch or build what it needs into ``cache`` (None: the default cache)."""

    def up(self, ctx: Context, kit: Kit) -> None:
        """Bring it up on the cluster; returns when it serves."""
        raise NotImplementedError
