"""Which containers get mock GPUs, which GPUs, and what: a pure function.

``decide(container, layout, config, mig)`` looks only at its arguments — no sockets, no files —
so every rule is unit-tested without containerd. ``mig`` is the node's MIG layout as it stands
(``gpumodel.mig_state``): a GPU with MIG on is handed out as its MIG devices (``"<gpu>:<mig>"``
or ``MIG-<uuid>`` wherever GPUs are named), as NVIDIA's toolkit does. The NRI plugin renders the returned
edits as a ContainerAdjustment; a container that did not ask for GPUs is never failed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpumodel.edits import ContainerEdits, container_edits
from gpumodel.mig_devices import GpuMig, MigDevice
from gpumodel.nodelayout import GpuNode, NodeLayout

ANNOTATION_INJECT = "mokka.io/inject"  # "true" opts in (opt-in mode), "false" opts out
ANNOTATION_GPUS = "mokka.io/gpus"  # "all", or indices / UUIDs / <gpu>:<mig> / MIG UUIDs, comma separated
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEVICE_RE = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class Config:
    mode: Literal["all", "opt-in"] = "all"
    exclude_namespaces: frozenset[str] = frozenset({"kube-system"})
    cdi_kind: str = "nvidia.com/gpu"
    cdi_devices: bool = False  # hand GPUs over as CDI device references (runtimes with NRI >= 0.7)

    @classmethod
    def parse(cls, data: Mapping[str, object]) -> Config:
        """From the plugin's config string (YAML/JSON mapping); unknown keys are an error."""
        known = {"mode", "excludeNamespaces", "cdiKind", "cdiDevices"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(
                f"unknown plugin config keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})"
            )
        mode = data.get("mode", "all")
        if mode not in ("all", "opt-in"):
            raise ValueError(f"mode must be 'all' or 'opt-in', not {mode!r}")
        namespaces = data.get("excludeNamespaces", ["kube-system"])
        if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
            raise ValueError("excludeNamespaces must be a list of names")
        kind = data.get("cdiKind", "nvidia.com/gpu")
        if not isinstance(kind, str):
            raise ValueError("cdiKind must be a string")
        cdi_devices = data.get("cdiDevices", False)
        if not isinstance(cdi_devices, bool):
            raise ValueError("cdiDevices must be true or false")
        return cls(mode=mode, exclude_namespaces=frozenset(namespaces), cdi_kind=kind, cdi_devices=cdi_devices)


@dataclass(frozen=True)
class Container:
    """What the decision needs to know about a container, independent of the transport."""

    name: str
    pod_name: str
    pod_namespace: str
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    device_paths: Sequence[str] = ()


@dataclass(frozen=True)
class Decision:
    """``edits`` is None when the container is left alone; ``error`` fails the container."""

    reason: str
    gpus: tuple[GpuNode, ...] = ()
    edits: ContainerEdits | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    error: str | None = None
    # The same GPUs as CDI device names, when the config asks for references and the plugin
    # supplies the device nodes itself (the runtime then injects the spec's edits instead).
    cdi_devices: tuple[str, ...] = ()

    def summary(self, c: Container) -> str:
        who = f"{c.pod_namespace}/{c.pod_name}/{c.name}"
        if self.error:
            return f"{who}: refused: {self.error}"
        if self.edits is None:
            return f"{who}: untouched ({self.reason})"
        gpus = ",".join([str(g.index) for g in self.gpus] + [f"{d.gpu}:{d.index}" for d in self.mig_devices]) or "none"
        return (
            f"{who}: GPUs {gpus} ({self.reason}): {len(self.edits.device_nodes)} device nodes, "
            f"{len(self.edits.mounts)} mounts, env {' '.join(k for k in self.edits.env_dict())}"
        )


def _selected(c: Container, config: Config) -> str | None:
    """None when the container takes part; else why not."""
    flag = c.annotations.get(ANNOTATION_INJECT, c.pod_annotations.get(ANNOTATION_INJECT, "")).strip().lower()
    if config.mode == "opt-in":
        return None if flag == "true" else f'opt-in mode and no {ANNOTATION_INJECT}: "true"'
    if flag == "false":
        return f'opted out by {ANNOTATION_INJECT}: "false"'
    if c.pod_namespace in config.exclude_namespaces:
        return f"namespace {c.pod_namespace} is excluded"
    return None


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _cdi_requests(c: Container, kind: str) -> list[str]:
    found = []
    for key, value in c.annotations.items():
        if key.startswith(CDI_ANNOTATION_PREFIX):
            found += [d for d in _names(value) if d.startswith(f"{kind}=")]
    return found


def _select(
    layout: NodeLayout, mig: Sequence[GpuMig], names: Sequence[str]
) -> tuple[tuple[GpuNode, ...], tuple[MigDevice, ...]]:
    """GPUs and MIG devices by name: index, UUID, ``<gpu>:<mig>``, ``MIG-<uuid>``, or ``all`` (the
    GPUs without MIG and every MIG device). KeyError names the first unknown one."""
    on = {g.gpu: g.devices for g in mig if g.current}
    slices = [d for g in layout.gpus for d in on.get(g.index, ())]
    if list(names) == ["all"]:
        return tuple(g for g in layout.gpus if g.index not in on), tuple(slices)
    gpus: list[GpuNode] = []
    picked: list[MigDevice] = []
    for name in names:
        found = [d for d in slices if name in (d.uuid, f"{d.gpu}:{d.index}")]
        if found:
            picked += [d for d in found if d not in picked]
        else:
            gpus += [g for g in layout.select([name]) if g not in gpus]
    return tuple(sorted(gpus, key=lambda g: g.index)), tuple(picked)


def decide(c: Container, layout: NodeLayout, config: Config, mig: Sequence[GpuMig] = ()) -> Decision:
    skip = _selected(c, config)
    if skip:
        return Decision(reason=skip)

    # 1. CDI devices already requested: the runtime injects the spec's edits itself.
    cdi = _cdi_requests(c, config.cdi_kind)
    if cdi:
        return Decision(reason=f"CDI devices {', '.join(cdi)} are injected by the runtime")

    # 2. The container's own allocation, from a device plugin: no device nodes of ours.
    existing = [int(m.group(1)) for p in c.device_paths if (m := DEVICE_RE.match(p))]
    if existing:
        by_minor = {g.minor: g for g in layout.gpus}
        unknown = [m for m in existing if m not in by_minor]
        if unknown:
            return Decision(
                reason="", error=f"devices /dev/nvidia{unknown[0]} not on this node ({len(layout.gpus)} mock GPUs)"
            )
        gpus = tuple(by_minor[m] for m in sorted(set(existing)))
        return Decision("allocated /dev/nvidia* devices", gpus, container_edits(layout, gpus).without_devices())
    visible = c.env.get("NVIDIA_VISIBLE_DEVICES")
    if visible is not None:
        value = visible.strip()
        if value in ("", "void"):
            return Decision(reason=f"NVIDIA_VISIBLE_DEVICES={value or '(empty)'} asks for no GPU access")
        if value == "none":
            return Decision(
                "NVIDIA_VISIBLE_DEVICES=none: driver only", (), container_edits(layout, ()).without_devices()
            )
        try:
            gpus, slices = _select(layout, mig, ["all"] if value == "all" else _names(value))
        except KeyError as exc:
            return Decision(
                reason="",
                error=f"NVIDIA_VISIBLE_DEVICES names GPU {exc.args[0]!r}, which this node "
                f"does not have ({len(layout.gpus)} mock GPUs)",
            )
        edits = container_edits(layout, gpus, slices).without_devices()
        return Decision(
            f"NVIDIA_VISIBLE_DEVICES={value}", gpus, _keep_env(edits, "NVIDIA_VISIBLE_DEVICES"), mig_devices=slices
        )

    # 3. Nothing allocated: every GPU of the node, or the subset the pod names.
    wanted = c.annotations.get(ANNOTATION_GPUS, c.pod_annotations.get(ANNOTATION_GPUS))
    if wanted is not None:
        try:
            gpus, slices = _select(layout, mig, _names(wanted) or ["all"])
        except KeyError as exc:
            return Decision(
                reason="",
                error=f"{ANNOTATION_GPUS} names GPU {exc.args[0]!r}, which this node does not "
                f"have ({len(layout.gpus)} mock GPUs)",
            )
        return _with_nodes(f"{ANNOTATION_GPUS}={wanted}", gpus, layout, config, slices)
    gpus, slices = _select(layout, mig, ["all"])
    return _with_nodes("all GPUs of the node", gpus, layout, config, slices)


def _with_nodes(
    reason: str, gpus: tuple[GpuNode, ...], layout: NodeLayout, config: Config, slices: tuple[MigDevice, ...] = ()
) -> Decision:
    names = [f"{config.cdi_kind}={g.index}" for g in gpus] + [f"{config.cdi_kind}={d.gpu}:{d.index}" for d in slices]
    return Decision(
        reason,
        gpus,
        container_edits(layout, gpus, slices),
        cdi_devices=tuple(names) if config.cdi_devices else (),
        mig_devices=slices,
    )


def _keep_env(edits: ContainerEdits, name: str) -> ContainerEdits:
    """Drop ``name`` from the edits: the container's own value stays authoritative."""
    env = tuple(e for e in edits.env if not e.startswith(f"{name}="))
    return ContainerEdits(env=env, device_nodes=edits.device_nodes, mounts=edits.mounts)
