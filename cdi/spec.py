"""Render the edits model as a CDI spec, check it against the official schema, write it.

The spec only *renders* :mod:`gpumodel.edits`: spec-level ``containerEdits`` are
``common_edits(layout)``; each device (``"0"``, ``"1"``, ..., each GPU's UUID, ``"all"``)
carries just its ``/dev/nvidiaN`` node(s). MIG follows the current layout as ``nvidia-ctk cdi
generate`` does on a real node: a GPU with MIG on is not a device of its own; each MIG device is,
as ``"<gpu>:<mig>"`` and by its ``MIG-…`` UUID, with its parent's node and its two capability
nodes; ``all`` holds the GPUs without MIG and every MIG device. A runtime injecting some of these devices merges
spec-level edits once with the edits of each device (``resolve`` below does the same), which
gives exactly ``container_edits(layout, gpus)`` without ``NVIDIA_VISIBLE_DEVICES``: the mock
library shows a container the GPUs whose ``/dev/nvidiaN`` exist, so the nodes alone select them.
A per-device ``NVIDIA_VISIBLE_DEVICES`` would even be wrong: with two devices requested the
runtime keeps only the last value of a variable.

The InfiniBand adapters are a spec of their own (:func:`render_adapters`, kind ``mokka.io/hca``):
each adapter (``mlx5_3``, and ``all``) carries its ``/dev/infiniband`` nodes (uverbs, umad, issm);
spec-level edits are the node's sysfs view and its shim, so a container given only an adapter
still reads it as the RDMA tools do (with a GPU of the other spec, the same mounts and variables
merge into one).

Version rules and name syntax are facts from the reference implementation
(``tags.cncf.io/container-device-interface`` 0.8.0: ``pkg/cdi/version.go``, ``pkg/parser``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpumodel import atomic
from gpumodel.edits import ContainerEdits, DeviceNode, Mount, common_edits, container_edits, sysfs_view
from gpumodel.infiniband import RDMA_CM
from gpumodel.mig_devices import GpuMig, MigDevice
from gpumodel.nodelayout import GpuNode, NodeLayout

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_KIND",
    "HCA_KIND",
    "KNOWN_VERSIONS",
    "CdiError",
    "SpecError",
    "device_edits",
    "file_name",
    "minimum_version",
    "render",
    "render_adapters",
    "resolve",
    "validate",
    "write",
]

DEFAULT_KIND = "nvidia.com/gpu"
HCA_KIND = "mokka.io/hca"
DEFAULT_DIR = Path("/var/run/cdi")
ALL = "all"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
# Versions the reference library accepts (0.1.0 and 0.2.0 are known but never required).
KNOWN_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0")
EARLIEST = "0.3.0"
DEVICE_TYPES = {"", "b", "c", "u", "p"}

_VENDOR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

Json = dict[str, Any]


class CdiError(Exception):
    """A CDI spec could not be generated or written."""


class SpecError(CdiError):
    """A spec breaks the schema or a CDI rule; ``path`` is the JSON path of the problem."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"invalid CDI spec at {path}: {message}")
        self.path = path
        self.message = message


# ---- rendering ------------------------------------------------------------------------


def split_kind(kind: str) -> tuple[str, str]:
    """``"vendor/class"`` → ``(vendor, class)``; raises ``CdiError`` when malformed."""
    vendor, sep, klass = kind.partition("/")
    for what, name in (("vendor", vendor), ("class", klass)):
        if not sep or not _VENDOR_CLASS.match(name):
            raise CdiError(
                f"invalid CDI kind {kind!r}: {what} {name!r} must start with a letter, end with a letter or "
                "digit, and contain only letters, digits, '_', '-', '.' (kind is 'vendor/class')"
            )
    return vendor, klass


def _device_node(node: DeviceNode) -> Json:
    return {
        "path": node.path,
        "hostPath": node.host_path,
        "type": node.type,
        "major": node.major,
        "minor": node.minor,
        "fileMode": node.file_mode,
    }


def _mount(mount: Mount) -> Json:
    out: Json = {"hostPath": mount.host_path, "containerPath": mount.container_path, "options": list(mount.options)}
    if "bind" in mount.options or "rbind" in mount.options:
        out["type"] = "bind"
    return out


def _edits(edits: ContainerEdits) -> Json:
    out: Json = {}
    if edits.env:
        out["env"] = list(edits.env)
    if edits.device_nodes:
        out["deviceNodes"] = [_device_node(n) for n in edits.device_nodes]
    if edits.mounts:
        out["mounts"] = [_mount(m) for m in edits.mounts]
    if edits.hooks:
        out["hooks"] = [{"hookName": "createContainer", "path": h.path, "args": list(h.args)} for h in edits.hooks]
    return out


def device_edits(layout: NodeLayout, gpus: Sequence[GpuNode], mig: Sequence[MigDevice] = ()) -> ContainerEdits:
    """What ``gpus`` (and MIG devices) add on top of the spec-level edits: ``container_edits``
    minus ``common_edits``.

    ``NVIDIA_VISIBLE_DEVICES`` is left out: the device nodes select the GPUs (see the module doc).
    """
    full, common = container_edits(layout, gpus, mig), common_edits(layout)
    return ContainerEdits(
        env=tuple(e for e in full.env if e not in common.env and not e.startswith(f"{VISIBLE}=")),
        device_nodes=tuple(n for n in full.device_nodes if n not in common.device_nodes),
        mounts=tuple(m for m in full.mounts if m not in common.mounts),
    )


def render(layout: NodeLayout, *, kind: str = DEFAULT_KIND, mig: Sequence[GpuMig] = ()) -> Json:
    """The CDI spec for ``layout`` (and the MIG state ``mig``, from ``gpumodel.mig_state.read``):
    devices by index, by UUID and ``all``; pure."""
    split_kind(kind)
    if not layout.gpus:
        raise CdiError(f"node layout {layout.root!r} has no GPUs: nothing to put in a CDI spec")
    if mig and layout.caps_major is None:
        raise CdiError(f"node layout {layout.root!r} has no MIG capability nodes: run `mokka host setup` again")
    by_gpu = {g.gpu: g for g in mig if g.current}
    whole = [g for g in layout.gpus if g.index not in by_gpu]
    slices = [d for g in layout.gpus if g.index in by_gpu for d in by_gpu[g.index].devices]
    named: list[tuple[str, str, ContainerEdits]] = []  # (index name, UUID, edits), in GPU order
    for g in layout.gpus:
        if g.index in by_gpu:
            named += [(f"{d.gpu}:{d.index}", d.uuid, device_edits(layout, [], [d])) for d in by_gpu[g.index].devices]
        else:
            named.append((str(g.index), g.uuid, device_edits(layout, [g])))
    devices: list[Json] = [{"name": n, "containerEdits": _edits(e)} for n, _, e in named]
    devices += [{"name": u, "containerEdits": _edits(e)} for _, u, e in named]
    devices.append({"name": ALL, "containerEdits": _edits(device_edits(layout, whole, slices))})
    names = [d["name"] for d in devices]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise CdiError(f"GPU names collide in the CDI spec: {', '.join(dupes)}")
    spec: Json = {"cdiVersion": "", "kind": kind, "devices": devices, "containerEdits": _edits(common_edits(layout))}
    spec["cdiVersion"] = minimum_version(spec)
    # Key order as the spec documents it.
    return {k: spec[k] for k in ("cdiVersion", "kind", "devices", "containerEdits")}


def render_adapters(
    layout: NodeLayout, adapters: Sequence[tuple[str, Sequence[tuple[str, int, int]]]], *, kind: str = HCA_KIND
) -> Json:
    """The CDI spec of the node's InfiniBand adapters: ``adapters`` is each adapter's name and its
    character devices (name under ``/dev/infiniband``, major, minor), as the node's sysfs lists
    them (``k8snode.dra.nics``); pure."""
    split_kind(kind)
    if not adapters:
        raise CdiError(f"node {layout.root!r} has no InfiniBand adapters: nothing to put in a CDI spec")

    def nodes(names: Sequence[tuple[str, int, int]]) -> list[DeviceNode]:
        return [
            DeviceNode(f"/dev/infiniband/{n}", major, minor, f"{layout.dev_root}/infiniband/{n}")
            for n, major, minor in names
        ]

    devices: list[Json] = [
        {"name": name, "containerEdits": _edits(ContainerEdits(device_nodes=tuple(nodes(chars))))}
        for name, chars in adapters
    ]
    every = tuple(n for _, chars in adapters for n in nodes(chars))
    devices.append({"name": ALL, "containerEdits": _edits(ContainerEdits(device_nodes=every))})
    # every adapter's: the node's sysfs view, its relay directory and the connection manager's device
    common = replace(sysfs_view(layout), device_nodes=tuple(nodes([RDMA_CM])))
    spec: Json = {"cdiVersion": "", "kind": kind, "devices": devices, "containerEdits": _edits(common)}
    spec["cdiVersion"] = minimum_version(spec)
    return {k: spec[k] for k in ("cdiVersion", "kind", "devices", "containerEdits")}


# ---- versions -------------------------------------------------------------------------


def _vkey(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.removeprefix("v").split("."))
    except ValueError:
        return (-1,)


def _all_edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield spec.get("containerEdits") or {}
    for dev in spec.get("devices") or []:
        yield dev.get("containerEdits") or {}


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` whose features cover ``spec`` (rules of ``pkg/cdi/version.go``)."""
    edits = list(_all_edits(spec))
    devices = spec.get("devices") or []
    _vendor, _, klass = str(spec.get("kind", "")).partition("/")
    if any(e.get("intelRdt") is not None or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or (_vendor and "." in klass):
        return "0.6.0"
    names = [str(d.get("name", "")) for d in devices]
    if any(n and not (n[0].isascii() and n[0].isalpha()) for n in names) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return EARLIEST


# ---- validation -----------------------------------------------------------------------


def _load(path: Path) -> Json:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CdiError(f"cannot load CDI schema {path}: {exc}") from None
    if not isinstance(data, dict):
        raise CdiError(f"cannot load CDI schema {path}: not a JSON object")
    return data


def _schema_errors(spec: Any, schema_dir: Path) -> None:
    from jsonschema import Draft7Validator
    from jsonschema.exceptions import best_match
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    schema = _load(schema_dir / "schema.json")
    defs = _load(schema_dir / "defs.json")
    # schema.json has no $id; its "$ref": "defs.json#/..." resolves against the bare name.
    registry: Registry[Any] = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    validator = Draft7Validator(schema, registry=registry)
    error = best_match(validator.iter_errors(spec))
    if error is not None:
        raise SpecError(error.json_path, error.message)


def _check_edits(edits: Any, where: str) -> None:
    for i, env in enumerate(edits.get("env") or []):
        if not isinstance(env, str) or env.find("=") <= 0:
            raise SpecError(f"{where}.env[{i}]", f"{env!r} is not a KEY=VALUE environment entry")
    for i, node in enumerate(edits.get("deviceNodes") or []):
        if not node.get("path"):
            raise SpecError(f"{where}.deviceNodes[{i}].path", "empty device path")
        if node.get("type", "") not in DEVICE_TYPES:
            raise SpecError(f"{where}.deviceNodes[{i}].type", f"{node['type']!r} is not one of b, c, u, p")
        if set(node.get("permissions", "")) - set("rwm"):
            raise SpecError(f"{where}.deviceNodes[{i}].permissions", f"{node['permissions']!r} is not made of r, w, m")
    for i, mount in enumerate(edits.get("mounts") or []):
        for key in ("hostPath", "containerPath"):
            if not mount.get(key):
                raise SpecError(f"{where}.mounts[{i}].{key}", "empty path")


def _check_rules(spec: Json) -> None:
    """What the reference library checks beyond the schema (``Spec.validate``, ``Device.validate``)."""
    version = str(spec["cdiVersion"])
    if version.removeprefix("v") not in KNOWN_VERSIONS:
        raise SpecError("$.cdiVersion", f"unknown version {version!r}; known: {', '.join(KNOWN_VERSIONS)}")
    needed = minimum_version(spec)
    if _vkey(needed) > _vkey(version):
        raise SpecError("$.cdiVersion", f"declares {version} but its features need at least {needed}")
    try:
        split_kind(str(spec["kind"]))
    except CdiError as exc:
        raise SpecError("$.kind", str(exc)) from None
    _check_edits(spec.get("containerEdits") or {}, "$.containerEdits")
    seen: set[str] = set()
    for i, dev in enumerate(spec["devices"]):
        name = dev["name"]
        if not _DEVICE_NAME.match(name):
            raise SpecError(f"$.devices[{i}].name", f"invalid device name {name!r}")
        if name in seen:
            raise SpecError(f"$.devices[{i}].name", f"device {name!r} appears twice")
        seen.add(name)
        edits = dev["containerEdits"]
        if not any(edits.get(k) for k in ("env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids")):
            raise SpecError(f"$.devices[{i}].containerEdits", f"device {name!r} has empty edits")
        _check_edits(edits, f"$.devices[{i}].containerEdits")


def validate(spec: Any, schema_dir: Path) -> None:
    """Check ``spec`` against the official JSON schema in ``schema_dir``, then the CDI rules.

    Raises ``SpecError`` naming the JSON path of the first problem.
    """
    _schema_errors(spec, schema_dir)
    _check_rules(spec)


# ---- consuming (what a runtime does on injection) ---------------------------------------


def _parse_edits(edits: Mapping[str, Any]) -> ContainerEdits:
    nodes = tuple(
        DeviceNode(
            path=n["path"],
            major=n["major"],
            minor=n["minor"],
            host_path=n.get("hostPath", n["path"]),
            type=n.get("type", "c"),
            file_mode=n.get("fileMode", DeviceNode.file_mode),
        )
        for n in edits.get("deviceNodes") or []
    )
    mounts = tuple(
        Mount(m["hostPath"], m["containerPath"], tuple(m.get("options", ()))) for m in edits.get("mounts") or []
    )
    return ContainerEdits(env=tuple(edits.get("env") or ()), device_nodes=nodes, mounts=mounts)


def resolve(spec: Mapping[str, Any], names: Iterable[str]) -> ContainerEdits:
    """The edits a CDI runtime applies for devices ``names`` of ``spec`` (``Cache.InjectDevices``).

    Spec-level edits once, then each device's, later entries replacing earlier ones with the
    same env key, device path or mount target.
    """
    by_name = {d["name"]: d for d in spec.get("devices") or []}
    parts = [_parse_edits(spec.get("containerEdits") or {})]
    for name in names:
        if name not in by_name:
            known = ", ".join(by_name)
            raise CdiError(f"unresolvable CDI device {spec.get('kind')}={name}; known: {known}")
        parts.append(_parse_edits(by_name[name]["containerEdits"]))
    env: dict[str, str] = {}
    nodes: dict[str, DeviceNode] = {}
    mounts: dict[str, Mount] = {}
    for part in parts:
        for item in part.env:
            key, _, _value = item.partition("=")
            env[key] = item
        for node in part.device_nodes:
            nodes.pop(node.path, None)
            nodes[node.path] = node
        for mount in part.mounts:
            mounts.pop(mount.container_path, None)
            mounts[mount.container_path] = mount
    return ContainerEdits(env=tuple(env.values()), device_nodes=tuple(nodes.values()), mounts=tuple(mounts.values()))


# ---- writing --------------------------------------------------------------------------


def file_name(spec: Mapping[str, Any]) -> str:
    """``<vendor>-<class>.json`` (the reference library's ``GenerateNameForSpec``)."""
    vendor, klass = split_kind(str(spec.get("kind", "")))
    return f"{vendor}-{klass}.json"


def dumps(spec: Mapping[str, Any]) -> bytes:
    return (json.dumps(spec, indent=2) + "\n").encode()


def write(spec: Mapping[str, Any], directory: Path = DEFAULT_DIR) -> Path:
    """Write ``spec`` into ``directory`` atomically; an identical file is left untouched.

    The temporary file ends in ``.tmp`` so a runtime watching the directory never loads it.
    """
    target = directory / file_name(spec)
    data = dumps(spec)
    try:
        if target.read_bytes() == data:
            return target
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise CdiError(f"cannot read existing CDI spec {target}: {exc.strerror or exc}") from None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        atomic.write(target, data, 0o644, tmp_suffix=True)  # runtimes watching the directory skip *.tmp
    except OSError as exc:
        raise CdiError(f"cannot write CDI spec into {directory}: {exc.strerror or exc}") from None
    return target
