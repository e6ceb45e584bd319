"""Which containers get mock GPUs, which GPUs, and what: a pure function.

``decide(container, layout, config, mig)`` looks only at its arguments — no sockets, no files —
so every rule is unit-tested without containerd. ``mig`` is the node's MIG layout as it stands
(``gpumodel.mig_state``): a GPU with MIG on is handed out as its MIG devices (``"<gpu>:<mig>"``
or ``MIG-<uuid>`` wherever GPUs are named), as NVIDIA's toolkit does. The NRI plugin renders
the returned edits as a ContainerAdjustment; a container that did not ask for GPUs is never
failed.

Who allocates GPUs is the configuration's ``allocator``:

* ``nri`` (standalone, the default): Mokka does. Every selected container gets every GPU of
  the node, or those ``mokka.io/gpus`` names; an allocation the container already carries
  (``NVIDIA_VISIBLE_DEVICES``, ``/dev/nvidia*`` devices, CDI devices) is kept.
* ``external``: a device plugin or DRA driver does, as on a GPU node with NVIDIA's stack in
  charge. A container without an allocation gets nothing; one with an allocation gets what
  the NVIDIA container runtime would give it: its GPUs' device nodes, the control nodes, the
  library, state and nvidia-smi. CDI requests (annotations, CRI CDI devices) are applied by
  the runtime from the CDI spec before the plugin sees the container, and left alone; where a
  spec's device nodes arrive with the driver's library already mounted (NVIDIA's DRA driver's,
  through CRI), nothing of that is added again: only the kernel's view of the GPUs
  (``gpumodel.edits.kernel_view``).

The plugin reads only what a decision can depend on: annotations under
``ANNOTATION_PREFIXES``, the environment variables in ``ENV_READ``, ``/dev/nvidia*`` device
paths and mounts of the driver's library, besides the names and the namespace (``relevant_*``
below say which).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gpumodel.edits import (
    ContainerEdits,
    container_edits,
    driver_procfs,
    kernel_view,
    mig_configuration,
    with_driver_procfs,
)
from gpumodel.mig_devices import GpuMig, MigDevice
from gpumodel.nodelayout import GpuNode, NodeLayout

ANNOTATION_INJECT = "mokka.io/inject"  # "true" opts in (opt-in mode), "false" opts out
ANNOTATION_GPUS = "mokka.io/gpus"  # "all", or indices / UUIDs / <gpu>:<mig> / MIG UUIDs, comma separated
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
ANNOTATION_PREFIXES = ("mokka.io/", CDI_ANNOTATION_PREFIX)  # the annotations decisions read
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# The MIG configuration capability (NVIDIA's toolkit grants it to privileged containers: the MIG
# manager's image asks for it): such a container may change the state and sees /proc/modules.
MIG_CONFIG_DEVICES = "NVIDIA_MIG_CONFIG_DEVICES"
ENV_READ = (VISIBLE_DEVICES, MIG_CONFIG_DEVICES)  # the environment decisions read
DEVICE_PREFIX = "/dev/nvidia"  # the device paths decisions read
DEVICE_RE = re.compile(r"^/dev/nvidia(\d+)$")
DRIVER_LIBRARY = "libnvidia-ml.so"  # mounts of the driver's library a decision reads (by destination)
ALLOCATORS = ("nri", "external")


def relevant_annotation(key: str) -> bool:
    return key.startswith(ANNOTATION_PREFIXES)


def relevant_env(entry: str) -> bool:
    """``entry`` is ``KEY=value``."""
    return entry.partition("=")[0] in ENV_READ


def relevant_device(path: str) -> bool:
    return path.startswith(DEVICE_PREFIX)


def relevant_mount(destination: str) -> bool:
    """A mount of the driver's library (``.so``, ``.so.1``, ``.so.<version>``), wherever put."""
    return destination.rpartition("/")[2].startswith(DRIVER_LIBRARY)


@dataclass(frozen=True)
class Config:
    mode: Literal["all", "opt-in"] = "all"
    exclude_namespaces: frozenset[str] = frozenset({"kube-system"})
    cdi_kind: str = "nvidia.com/gpu"
    cdi_devices: bool = False  # hand GPUs over as CDI device references (runtimes with NRI >= 0.7)
    allocator: Literal["nri", "external"] = "nri"  # who hands out GPUs: Mokka, or a device plugin / DRA

    @classmethod
    def parse(cls, data: Mapping[str, object], base: Config | None = None) -> Config:
        """From the plugin's config string (YAML/JSON mapping) over ``base``; unknown keys are an error."""
        base = base or cls()
        known = {"mode", "excludeNamespaces", "cdiKind", "cdiDevices", "allocator"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(
                f"unknown plugin config keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})"
            )
        mode = data.get("mode", base.mode)
        if mode not in ("all", "opt-in"):
            raise ValueError(f"mode must be 'all' or 'opt-in', not {mode!r}")
        namespaces = data.get("excludeNamespaces", sorted(base.exclude_namespaces))
        if not isinstance(namespaces, list) or not all(isinstance(n, str) for n in namespaces):
            raise ValueError("excludeNamespaces must be a list of names")
        kind = data.get("cdiKind", base.cdi_kind)
        if not isinstance(kind, str):
            raise ValueError("cdiKind must be a string")
        cdi_devices = data.get("cdiDevices", base.cdi_devices)
        if not isinstance(cdi_devices, bool):
            raise ValueError("cdiDevices must be true or false")
        allocator = data.get("allocator", base.allocator)
        if allocator not in ALLOCATORS:
            raise ValueError(f"allocator must be 'nri' or 'external', not {allocator!r}")
        return cls(
            mode=mode,
            exclude_namespaces=frozenset(namespaces),
            cdi_kind=kind,
            cdi_devices=cdi_devices,
            allocator=allocator,  # type: ignore[arg-type]  # checked against ALLOCATORS above
        )


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
    driver_mounts: Sequence[str] = ()  # where the runtime already mounted the driver's library


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

    def describe(self) -> str:
        """What was decided and why, without naming the container."""
        if self.error:
            return f"refused: {self.error}"
        if self.edits is None:
            return f"untouched ({self.reason})"
        gpus = ",".join([str(g.index) for g in self.gpus] + [f"{d.gpu}:{d.index}" for d in self.mig_devices]) or "none"
        return (
            f"GPUs {gpus} ({self.reason}): {len(self.edits.device_nodes)} device nodes, "
            f"{len(self.edits.mounts)} mounts, env {' '.join(k for k in self.edits.env_dict())}"
        )

    def summary(self, c: Container) -> str:
        return f"{c.pod_namespace}/{c.pod_name}/{c.name}: {self.describe()}"


def _flag(c: Container) -> str:
    return c.annotations.get(ANNOTATION_INJECT, c.pod_annotations.get(ANNOTATION_INJECT, "")).strip().lower()


def _selected(c: Container, config: Config) -> str | None:
    """None when the container takes part; else why not."""
    flag = _flag(c)
    if config.mode == "opt-in":
        return None if flag == "true" else f'opt-in mode and no {ANNOTATION_INJECT}: "true"'
    if flag == "false":
        return f'opted out by {ANNOTATION_INJECT}: "false"'
    if c.pod_namespace in config.exclude_namespaces:
        return f"namespace {c.pod_namespace} is excluded"
    return None


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _cdi_requests(c: Container, kind: str | None) -> list[str]:
    """CDI devices the container's annotations request: of ``kind``, or of any kind (None)."""
    found = []
    for key, value in c.annotations.items():
        if key.startswith(CDI_ANNOTATION_PREFIX):
            found += [d for d in _names(value) if kind is None or d.startswith(f"{kind}=")]
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
    d = _decide(c, layout, config, mig)
    edits = d.edits
    if edits is None:
        return d
    modules = c.env.get(MIG_CONFIG_DEVICES, "").strip() not in ("", "void", "none")
    if modules:
        why = f"{d.reason}; {MIG_CONFIG_DEVICES}: the state writable, the node's /proc/modules"
        d, edits = replace(d, reason=why), mig_configuration(layout, edits)
    elif c.driver_mounts:  # a runtime's CDI spec brought the driver (and its hooks): they have /proc
        return d
    if d.cdi_devices:  # the runtime applies the references' spec: the hook only adds /proc
        return replace(d, edits=replace(edits, hooks=edits.hooks + driver_procfs(layout, modules=modules)))
    return replace(d, edits=with_driver_procfs(layout, edits, modules=modules))


def _decide(c: Container, layout: NodeLayout, config: Config, mig: Sequence[GpuMig]) -> Decision:
    if config.allocator == "external":
        return _decide_external(c, layout, config, mig)
    skip = _selected(c, config)
    if skip:
        return Decision(reason=skip)

    # 1. CDI devices already requested: the runtime injects the spec's edits itself.
    cdi = _cdi_requests(c, config.cdi_kind)
    if cdi:
        return Decision(reason=f"CDI devices {', '.join(cdi)} are injected by the runtime")

    # 2. The container's own allocation, from a device plugin: no device nodes of ours.
    existing = _device_gpus(c, layout)
    if isinstance(existing, Decision):
        return existing
    if existing:
        return Decision("allocated /dev/nvidia* devices", existing, container_edits(layout, existing).without_devices())
    visible = c.env.get(VISIBLE_DEVICES)
    if visible is not None:
        value = visible.strip()
        if value in ("", "void"):
            return Decision(reason=f"{VISIBLE_DEVICES}={value or '(empty)'} asks for no GPU access")
        if value == "none":
            return Decision(f"{VISIBLE_DEVICES}=none: driver only", (), container_edits(layout, ()).without_devices())
        chosen = _visible(value, layout, mig)
        if isinstance(chosen, Decision):
            return chosen
        gpus, slices = chosen
        edits = container_edits(layout, gpus, slices).without_devices()
        return Decision(f"{VISIBLE_DEVICES}={value}", gpus, _keep_env(edits, VISIBLE_DEVICES), mig_devices=slices)

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


def _decide_external(c: Container, layout: NodeLayout, config: Config, mig: Sequence[GpuMig]) -> Decision:
    """A device plugin or DRA driver allocates: serve exactly what it allocated, as the NVIDIA
    container runtime would. Namespace exclusion and opt-in mode do not apply (an allocation
    the cluster made is honoured); an explicit opt-out does."""
    if _flag(c) == "false":
        return Decision(reason=f'opted out by {ANNOTATION_INJECT}: "false"')

    # CDI (annotations or CRI CDI devices, which containerd also records as annotations): the
    # runtime already applied the spec's edits, which carry everything; nothing to add.
    cdi = _cdi_requests(c, config.cdi_kind)
    if cdi:
        return Decision(reason=f"CDI devices {', '.join(cdi)} are injected by the runtime")
    has_nodes = any(DEVICE_RE.match(p) for p in c.device_paths)
    if has_nodes and (other := _cdi_requests(c, None)):
        return Decision(reason=f"CDI devices {', '.join(other)} were injected by the runtime")

    # Device nodes passed by the device plugin (device specs): add what the runtime would.
    existing = _device_gpus(c, layout)
    if isinstance(existing, Decision):
        return existing
    if existing and c.driver_mounts:
        # The runtime's path (a CDI spec passed through CRI: NVIDIA's DRA driver's) brought the
        # device nodes, the driver and its tools already: only what a GPU node's kernel shows.
        why = f"allocated /dev/nvidia* devices, the driver at {c.driver_mounts[0]}"
        return Decision(why, existing, kernel_view(layout))
    if existing:
        edits = container_edits(layout, existing)
        present = set(c.device_paths)
        nodes = tuple(n for n in edits.device_nodes if n.path not in present)
        edits = replace(edits, device_nodes=nodes)
        if c.env.get(VISIBLE_DEVICES, "").strip() not in ("", "void", "none"):
            # it names the GPUs (a device plugin's variable beside its device specs): it stays.
            # "void" is how a CDI spec (NVIDIA's nvcdi) keeps the legacy hook out: the device
            # nodes are the allocation, and the library is told which GPUs they are.
            edits = _keep_env(edits, VISIBLE_DEVICES)
        return Decision("allocated /dev/nvidia* devices", existing, edits)

    # Envvar mode: the device plugin set NVIDIA_VISIBLE_DEVICES.
    visible = c.env.get(VISIBLE_DEVICES)
    if visible is None:
        return Decision(reason="no GPU allocation (allocator external)")
    value = visible.strip()
    if value in ("", "void"):
        return Decision(reason=f"{VISIBLE_DEVICES}={value or '(empty)'} asks for no GPU access")
    if value == "none":
        edits = _keep_env(container_edits(layout, ()), VISIBLE_DEVICES)
        return Decision(f"{VISIBLE_DEVICES}=none: driver only", (), edits)
    chosen = _visible(value, layout, mig)
    if isinstance(chosen, Decision):
        return chosen
    gpus, slices = chosen
    edits = _keep_env(container_edits(layout, gpus, slices), VISIBLE_DEVICES)
    return Decision(f"{VISIBLE_DEVICES}={value}", gpus, edits, mig_devices=slices)


def _device_gpus(c: Container, layout: NodeLayout) -> tuple[GpuNode, ...] | Decision:
    """The GPUs whose /dev/nvidiaN the container has (a Decision refusing unknown ones)."""
    minors = [int(m.group(1)) for p in c.device_paths if (m := DEVICE_RE.match(p))]
    if not minors:
        return ()
    by_minor = {g.minor: g for g in layout.gpus}
    unknown = [m for m in minors if m not in by_minor]
    if unknown:
        return Decision(
            reason="", error=f"devices /dev/nvidia{unknown[0]} not on this node ({len(layout.gpus)} mock GPUs)"
        )
    return tuple(by_minor[m] for m in sorted(set(minors)))


def _visible(
    value: str, layout: NodeLayout, mig: Sequence[GpuMig]
) -> tuple[tuple[GpuNode, ...], tuple[MigDevice, ...]] | Decision:
    """The GPUs and MIG devices NVIDIA_VISIBLE_DEVICES names (a Decision refusing unknown ones)."""
    try:
        return _select(layout, mig, ["all"] if value == "all" else _names(value))
    except KeyError as exc:
        return Decision(
            reason="",
            error=f"{VISIBLE_DEVICES} names GPU {exc.args[0]!r}, which this node "
            f"does not have ({len(layout.gpus)} mock GPUs)",
        )


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
    return replace(edits, env=env)
