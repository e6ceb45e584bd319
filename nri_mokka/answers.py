"""Answers to CreateContainer, encoded once per distinct input and reused.

A node sees few distinct decisions (one per GPU set, per namespace rule), and deciding and
encoding a ContainerAdjustment costs far more than looking one up. ``Answers.get`` keys on what
a decision and its rendering depend on (``request.Key``), asks ``decision.decide`` on a miss,
renders the edits as NRI's ContainerAdjustment (``reply``; the CDI generator renders the same
edits) and keeps the encoded bytes. A new node layout, MIG layout or configuration
starts afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpumodel.mig_devices import GpuMig
from gpumodel.nodelayout import NodeLayout
from nri_mokka import decision, reply, request

__all__ = ["MAX_ENTRIES", "Answer", "Answers"]

MAX_ENTRIES = 4096  # distinct inputs kept; the cache starts afresh beyond that


class Answer:
    """An encoded CreateContainerResponse, with the decision's log text (or its refusal)."""

    __slots__ = ("error", "reply", "text")

    def __init__(self, reply: bytes, text: str, error: str | None) -> None:
        self.reply = reply
        self.text = text
        self.error = error


def runtime_takes_cdi(runtime_name: str, runtime_version: str) -> bool:
    """containerd 2.1 and later apply NRI's CDI device references (NRI >= 0.7); older
    runtimes would silently drop them."""
    if runtime_name != "containerd":
        return False
    parts = runtime_version.lstrip("v").split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (2, 1)
    except (ValueError, IndexError):
        return False


class Answers:
    """Decisions for one node layout, MIG layout and configuration, encoded once per distinct input."""

    def __init__(
        self, layout: NodeLayout, config: decision.Config, runtime_cdi: bool, mig: Sequence[GpuMig] = ()
    ) -> None:
        self.layout = layout
        self.config = config
        self.runtime_cdi = runtime_cdi
        self.mig = mig
        self._cache: dict[request.Key, Answer] = {}
        self._encoded: dict[tuple[object, ...], bytes] = {}  # one encoding per distinct adjustment

    def for_mig(self, mig: Sequence[GpuMig]) -> Answers:
        """The same, for another MIG layout (an empty cache)."""
        return Answers(self.layout, self.config, self.runtime_cdi, mig)

    def get(self, key: request.Key) -> Answer:
        hit = self._cache.get(key)
        if hit is None:
            hit = self._decide(key)
            if len(self._cache) >= MAX_ENTRIES:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _decide(self, key: request.Key) -> Answer:
        d = decision.decide(request.container(key), self.layout, self.config, self.mig)
        if d.error:
            return Answer(b"", d.describe(), f"mokka: {d.error}")
        if d.edits is None:
            return Answer(b"", d.describe(), None)
        if d.cdi_devices and self.runtime_cdi:
            hooks = d.edits.hooks
            data = self._encode(("cdi", d.cdi_devices, hooks), lambda: reply.cdi_adjustment(d.cdi_devices, hooks))
        else:
            edits = d.edits
            preload = dict(key[3]).get("LD_PRELOAD", "")
            data = self._encode(("edits", edits, preload), lambda: reply.adjustment(edits, preload))
        return Answer(data, d.describe(), None)

    def _encode(self, what: tuple[object, ...], build: Callable[[], bytes]) -> bytes:
        data = self._encoded.get(what)
        if data is None:
            data = reply.response(build())
            if len(self._encoded) >= MAX_ENTRIES:
                self._encoded.clear()
            self._encoded[what] = data
        return data
