"""How a mock node presents itself to the cluster: node labels, NFD features, FGO profiles.

Three views of one validated :class:`~gpumodel.profile.Profile`, each a pure function:

- :func:`gfd_labels` — the labels GPU Feature Discovery would set on a node with these
  GPUs (``nvidia.com/gpu.product``, ``.count``, ``.memory`` in MiB, ``.family``, the
  compute capability, the CUDA driver/runtime versions...), plus ``nvidia.com/gpu.present``.
- :func:`nfd_features` — the Node Feature Discovery *local source* feature file: the PCI
  vendor/class features NFD's pci source would report for the GPUs (NFD prefixes them with
  ``feature.node.kubernetes.io/``; the GPU Operator selects nodes on ``pci-10de.present``).
- :func:`fgo_profile` — the profile in the shape run:ai's fake-gpu-operator loader reads
  from a ``gpu-profile-<name>`` ConfigMap (``system``, ``device_defaults``, ``devices``...).

:class:`NodeIdentity` applies the labels to the node it runs on through the Kubernetes API
(``get`` + ``patch`` of its own Node, nothing else) and records what it set, and what each
label was before, in the annotation :data:`ANNOTATION`; :meth:`NodeIdentity.remove` undoes
exactly that — a label changed by someone else since is left alone.

``python3 -m k8snode.nodeinfo apply|remove|show`` is the in-cluster entry point the Helm
chart's DaemonSet runs.

One file, though long: the three views are pure functions of one profile, and the node
labeller (:class:`NodeIdentity`, ``main``) is the one process that applies them; the chart runs
it by this module's name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpumodel import atomic, infiniband, mig_state
from gpumodel.profile import MELLANOX_VENDOR, MIB, Profile

LABEL_DOMAIN = "nvidia.com"
ANNOTATION = "mokka.io/node-identity"
NFD_FEATURES_DIR = Path("/etc/kubernetes/node-feature-discovery/features.d")
NFD_FILE_NAME = "mokka"
FIELD_MANAGER = "mokka"
NFD_PREFIX = "feature.node.kubernetes.io/"
_LABEL_VALUE_MAX = 63
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_LABEL_NAME_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class NodeInfoError(Exception):
    """The node could not be read or changed; the message says which node and why."""


# --------------------------------------------------------------------------- pure: labels


def gfd_product(name: str) -> str:
    """The product as GPU Feature Discovery writes it: label-safe characters, blanks as '-'.

    ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``; ``Tesla T4`` -> ``Tesla-T4``.
    """
    kept = re.sub(r"[^A-Za-z0-9\-_. ]", "", name)
    value = "-".join(kept.split())[:_LABEL_VALUE_MAX]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def gfd_family(compute_capability: str) -> str:
    """GFD's architecture family for a compute capability (``9.0`` -> ``hopper``)."""
    major_s, minor_s = compute_capability.split(".")
    major, minor = int(major_s), int(minor_s)
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    families = {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
    }
    return families.get(major, "undefined")


def gfd_labels(profile: Profile) -> dict[str, str]:
    """The node labels for ``profile`` (GPU 0's board when GPUs differ, as GFD reports one)."""
    gpu = profile.devices()[0].spec
    major, minor = gpu.compute_capability.split(".")
    driver = profile.driver.version.split(".")
    cuda_major, cuda_minor = profile.driver.cuda.split(".")
    mode = {0x030200: "compute", 0x030000: "graphics"}.get(gpu.pci.class_code, "unknown")
    d = LABEL_DOMAIN
    labels = {
        f"{d}/gpu.present": "true",
        f"{d}/gpu.product": gfd_product(gpu.name),
        f"{d}/gpu.count": str(profile.gpu_count),
        f"{d}/gpu.memory": str(gpu.memory.total_mib),
        f"{d}/gpu.family": gfd_family(gpu.compute_capability),
        f"{d}/gpu.compute.major": major,
        f"{d}/gpu.compute.minor": minor,
        f"{d}/gpu.replicas": "1",
        f"{d}/gpu.sharing-strategy": "none",
        f"{d}/gpu.mode": mode,
        f"{d}/mig.capable": "true" if gpu.modes.mig is not None else "false",
        f"{d}/mps.capable": "false",
        f"{d}/cuda.driver.major": driver[0],
        f"{d}/cuda.driver.minor": driver[1],
        f"{d}/cuda.driver.rev": driver[2] if len(driver) > 2 else "",
        f"{d}/cuda.driver-version.major": driver[0],
        f"{d}/cuda.driver-version.minor": driver[1],
        f"{d}/cuda.driver-version.revision": driver[2] if len(driver) > 2 else "",
        f"{d}/cuda.driver-version.full": profile.driver.version,
        f"{d}/cuda.runtime.major": cuda_major,
        f"{d}/cuda.runtime.minor": cuda_minor,
        f"{d}/cuda.runtime-version.major": cuda_major,
        f"{d}/cuda.runtime-version.minor": cuda_minor,
        f"{d}/cuda.runtime-version.full": profile.driver.cuda,
    }
    for key, value in labels.items():
        if not _LABEL_NAME_RE.match(key) or len(value) > _LABEL_VALUE_MAX or not _LABEL_VALUE_RE.match(value):
            raise NodeInfoError(f"profile {profile.name}: label {key}={value!r} is not a valid Kubernetes label")
    return labels


def nfd_features(profile: Profile) -> dict[str, str]:
    """Features for NFD's local source: what its pci source reports for the GPUs' functions and
    the InfiniBand adapters' (class 0207, which the GPU Operator's NFD configuration whitelists).

    Keys are as written in the feature file; NFD publishes them as
    ``feature.node.kubernetes.io/<key>``. Both the GPU Operator's vendor-only form
    (``pci-10de.present``, ``pci-15b3.present``) and NFD's default class+vendor form
    (``pci-0302_10de.present``, ``pci-0207_15b3.present``).
    """
    functions = [(d.spec.pci.class_code, d.spec.pci.vendor_id) for d in profile.devices()]
    functions += [(h.spec.pci_class, MELLANOX_VENDOR) for h in infiniband.adapters(profile)]
    features: dict[str, str] = {}
    for class_code, vendor in functions:
        features[f"pci-{vendor:04x}.present"] = "true"
        features[f"pci-{class_code >> 8:04x}_{vendor:04x}.present"] = "true"
    return dict(sorted(features.items()))


def nfd_feature_file(profile: Profile) -> str:
    lines = [f"# Written by Mokka for profile {profile.name} ({profile.gpu_count}x {profile.gpu.name}); do not edit."]
    lines += [f"{key}={value}" for key, value in nfd_features(profile).items()]
    return "\n".join(lines) + "\n"


def write_nfd_feature_file(directory: Path, profile: Profile) -> Path:
    """Mokka's feature file (:func:`nfd_feature_file`) in NFD's ``features.d`` ``directory``,
    replaced whole (NFD never reads a half-written file); unchanged when it says the same."""
    path = directory / NFD_FILE_NAME
    text = nfd_feature_file(profile)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not (path.exists() and path.read_text() == text):
            atomic.write(path, text.encode(), 0o644)
    except OSError as exc:
        raise NodeInfoError(f"{path}: cannot write the NFD feature file: {exc.strerror or exc}") from None
    return path


# --------------------------------------------------------------------------- pure: FGO


def fgo_profile(profile: Profile) -> dict[str, Any]:
    """``profile`` in the shape fake-gpu-operator's profile loader reads (nvml-mock's config).

    FGO reads ``device_defaults.name``, ``.architecture``, ``.memory.total_bytes``,
    ``system.driver_version``, ``system.cuda_version``, ``device_count`` (else the length
    of ``devices``) and, for NUMA placement, ``pcie_topology.root_complexes`` matched
    against ``devices[].pci.bus_id``. The rest of the shape is filled from the same profile
    so that a mock backend reading it sees the same board.
    """
    devices = profile.devices()
    gpu = devices[0].spec
    cc_major, cc_minor = gpu.compute_capability.split(".")
    cuda_major, cuda_minor = profile.driver.cuda.split(".")
    mem = gpu.memory
    reserved = round(mem.reserved_mib * MIB)
    used = mem.used_mib * MIB
    total = mem.total_mib * MIB
    pci = gpu.pci
    cur = gpu.clocks.current
    top = gpu.clocks.max
    app = gpu.clocks.applications
    app_default = gpu.clocks.default_applications

    def mw(watts: float) -> int:
        return round(watts * 1000)

    def enabled(flag: bool | None) -> str:
        return "N/A" if flag is None else ("enabled" if flag else "disabled")

    numa: dict[int, list[str]] = {}
    for d in devices:
        numa.setdefault(d.numa_node, []).append(d.bus_id)
    return {
        "version": "1.0",
        "system": {
            "driver_version": profile.driver.version,
            "nvml_version": f"{cuda_major}.{profile.driver.version}",
            "cuda_version": profile.driver.cuda,
            "cuda_version_major": int(cuda_major),
            "cuda_version_minor": int(cuda_minor),
        },
        "device_count": profile.gpu_count,
        "device_defaults": {
            "name": gpu.name,
            "brand": gpu.brand.lower(),
            "board_part_number": gpu.board_part_number,
            "vbios_version": gpu.vbios_version,
            "architecture": gfd_family(gpu.compute_capability),
            "compute_capability": {"major": int(cc_major), "minor": int(cc_minor)},
            **({"num_gpu_cores": gpu.cuda_cores} if gpu.cuda_cores is not None else {}),
            "inforom": {
                "image_version": gpu.inforom.image or "N/A",
                "oem_object": gpu.inforom.oem or "N/A",
                "ecc_object": gpu.inforom.ecc or "N/A",
                "pwr_object": gpu.inforom.power or "N/A",
            },
            "memory": {
                "total_bytes": total,
                "reserved_bytes": reserved,
                "free_bytes": max(0, total - reserved - used),
                "used_bytes": used,
                **({"memory_bus_width": mem.bus_width} if mem.bus_width is not None else {}),
            },
            "bar1_memory": {
                "total_bytes": mem.bar1_total_mib * MIB,
                "free_bytes": (mem.bar1_total_mib - mem.bar1_used_mib) * MIB,
                "used_bytes": mem.bar1_used_mib * MIB,
            },
            "pci": {
                "device_id": pci.device_id << 16 | pci.vendor_id,
                "subsystem_id": pci.subsystem_device_id << 16 | pci.subsystem_vendor_id,
            },
            "pcie": {
                "max_link_gen": pci.max_link_gen,
                "current_link_gen": pci.current_link_gen or pci.max_link_gen,
                "max_link_width": pci.max_link_width,
                "current_link_width": pci.current_link_width or pci.max_link_width,
                "replay_counter": gpu.pcie_replay_counter,
            },
            "power": {
                "management_supported": gpu.power.management,
                "default_limit_mw": mw(gpu.power.default_limit_w),
                "enforced_limit_mw": mw(gpu.power.limit_w),
                "min_limit_mw": mw(gpu.power.min_limit_w),
                "max_limit_mw": mw(gpu.power.max_limit_w),
                "current_draw_mw": mw(gpu.power.draw_w),
                "power_state": f"P{gpu.modes.performance_state}",
            },
            "thermal": {
                "temperature_gpu_c": gpu.temperature.gpu,
                **({"temperature_memory_c": gpu.temperature.memory} if gpu.temperature.memory is not None else {}),
                **({"shutdown_threshold_c": gpu.temperature.shutdown} if gpu.temperature.shutdown else {}),
                **({"slowdown_threshold_c": gpu.temperature.slowdown} if gpu.temperature.slowdown else {}),
                **({"max_operating_c": gpu.temperature.gpu_max} if gpu.temperature.gpu_max else {}),
            },
            "fan": {"count": gpu.fans, "speed_percent": gpu.fan_speed if gpu.fans else "N/A"},
            "clocks": {
                key: value
                for key, value in {
                    "graphics_current": cur.graphics,
                    "graphics_max": top.graphics,
                    "graphics_app": app.graphics if app else None,
                    "graphics_app_default": app_default.graphics if app_default else None,
                    "sm_current": cur.sm,
                    "sm_max": top.sm,
                    "memory_current": cur.memory,
                    "memory_max": top.memory,
                    "memory_app": app.memory if app else None,
                    "memory_app_default": app_default.memory if app_default else None,
                    "video_current": cur.video,
                    "video_max": top.video,
                }.items()
                if value is not None
            },
            "performance_state": f"P{gpu.modes.performance_state}",
            "utilization": gpu.utilization.model_dump(),
            "ecc": {
                "mode_current": enabled(gpu.modes.ecc),
                "mode_pending": enabled(gpu.modes.ecc),
                "default_mode": enabled(gpu.modes.ecc),
            },
            "mig": {"mode_current": enabled(gpu.modes.mig), "mode_pending": enabled(mig_state.pending_mode(gpu))},
            "persistence_mode": enabled(gpu.modes.persistence),
            "compute_mode": gpu.modes.compute.lower(),
            "accounting": {"mode": enabled(gpu.modes.accounting), "buffer_size": gpu.modes.accounting_buffer},
            "virtualization": {"mode": gpu.modes.virtualization.lower()},
            "processes": [],
        },
        "devices": [
            {
                "index": d.index,
                "uuid": d.uuid,
                "serial": d.serial,
                "pci": {"bus_id": d.bus_id},
                "minor_number": d.index,
                "module_id": d.module_id,
                "numa_node": d.numa_node,
                **({"name": d.spec.name} if d.spec.name != gpu.name else {}),
            }
            for d in devices
        ],
        "nvlink": {
            "version": gpu.nvlink.version,
            "links_per_gpu": gpu.nvlink.links,
            "bandwidth_per_link_gbps": gpu.nvlink.speed_gbps,
        },
        "pcie_topology": {
            "root_complexes": [{"numa_node": node, "devices": buses} for node, buses in sorted(numa.items())]
        },
    }


# --------------------------------------------------------------------------- the node


class CoreV1Like(Protocol):
    """The two calls of ``kubernetes.client.CoreV1Api`` this module makes."""

    def read_node(self, name: str, *, _preload_content: bool = ...) -> Any: ...

    def patch_node(
        self,
        name: str,
        body: dict[str, Any],
        *,
        field_manager: str | None = ...,
        _content_type: str | None = ...,
        _preload_content: bool = ...,
    ) -> Any: ...


@dataclass(frozen=True)
class Record:
    """What Mokka set on the node: each label's value, and what it was before (None: absent)."""

    labels: Mapping[str, str]
    previous: Mapping[str, str | None]

    def to_json(self) -> str:
        return json.dumps({"labels": dict(self.labels), "previous": dict(self.previous)}, sort_keys=True)

    @classmethod
    def parse(cls, text: str) -> Record:
        try:
            data = json.loads(text)
            labels = {str(k): str(v) for k, v in data["labels"].items()}
            previous = {str(k): (None if v is None else str(v)) for k, v in data["previous"].items()}
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            raise NodeInfoError(f"annotation {ANNOTATION} is not Mokka's record: {exc}") from None
        return cls(labels, previous)


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class NodeIdentity:
    """Labels one Node (the one this process runs on) and writes NFD's local feature file.

    Only ``get`` and ``patch`` of that Node are used. Every patch carries the
    ``resourceVersion`` it was computed from, so a concurrent change is a conflict that is
    retried from a fresh read, never a lost update.
    """

    def __init__(
        self,
        api: CoreV1Like,
        node: str,
        nfd_dir: Path | None = NFD_FEATURES_DIR,
        retries: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not node:
            raise NodeInfoError("no node name (set NODE_NAME from the downward API: spec.nodeName)")
        self.api = api
        self.node = node
        self.nfd_dir = nfd_dir
        self.retries = retries
        self.sleep = sleep

    @classmethod
    def in_cluster(cls, node: str, nfd_dir: Path | None = NFD_FEATURES_DIR) -> NodeIdentity:
        """With the pod's service account (falls back to ~/.kube/config outside a cluster)."""
        from kubernetes import client, config  # type: ignore[import-untyped, import-not-found, unused-ignore]

        loader: Any = config  # the config loaders are untyped
        try:
            loader.load_incluster_config()
        except loader.ConfigException as in_cluster:
            try:
                loader.load_kube_config()
            except (loader.ConfigException, OSError) as exc:
                raise NodeInfoError(
                    f"no Kubernetes API: not in a pod ({in_cluster}) and no kubeconfig ({exc})"
                ) from None
        return cls(client.CoreV1Api(), node, nfd_dir)

    # -- API calls

    def read(self) -> dict[str, Any]:
        try:
            response = self.api.read_node(self.node, _preload_content=False)
        except Exception as exc:
            raise NodeInfoError(f"node {self.node}: get failed: {_describe(exc)}") from None
        data = json.loads(response.data)
        if not isinstance(data, dict):
            raise NodeInfoError(f"node {self.node}: the API server returned no Node object")
        return data

    def _patch(self, metadata: dict[str, Any]) -> None:
        # JSON merge patch: null deletes a key; metadata.resourceVersion makes it conditional.
        self.api.patch_node(
            self.node,
            {"metadata": metadata},
            field_manager=FIELD_MANAGER,
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )

    def _update(self, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Read the Node, compute a metadata patch, send it with the read's resourceVersion."""
        for attempt in range(self.retries + 1):
            node = self.read()
            patch = change(node)
            if patch is None:
                return None
            patch["resourceVersion"] = node.get("metadata", {}).get("resourceVersion")
            try:
                self._patch(patch)
                return patch
            except Exception as exc:
                if _status(exc) == 409 and attempt < self.retries:
                    self.sleep(0.2 * (attempt + 1))
                    continue
                raise NodeInfoError(f"node {self.node}: patch failed: {_describe(exc)}") from None
        raise AssertionError("unreachable")

    # -- what the chart runs

    def apply(self, profile: Profile) -> dict[str, str]:
        """Set the GFD labels for ``profile`` and write the NFD feature file; idempotent.

        Returns the labels set. A label that already carried another value is replaced, and
        its old value recorded so :meth:`remove` can put it back.
        """
        wanted = gfd_labels(profile)

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            meta = node.get("metadata", {})
            labels: dict[str, str] = meta.get("labels") or {}
            annotations: dict[str, str] = meta.get("annotations") or {}
            old = Record.parse(annotations[ANNOTATION]) if ANNOTATION in annotations else Record({}, {})
            previous: dict[str, str | None] = {}
            for key in wanted:
                if key in old.labels and labels.get(key) == old.labels[key]:
                    previous[key] = old.previous.get(key)  # ours already: keep the original
                else:
                    previous[key] = labels.get(key)
            patch_labels: dict[str, str | None] = {k: v for k, v in wanted.items() if labels.get(k) != v}
            # Labels Mokka set earlier that this profile no longer has: restore them too.
            for key, value in old.labels.items():
                if key not in wanted and labels.get(key) == value:
                    patch_labels[key] = old.previous.get(key)
            record = Record(wanted, previous).to_json()
            if not patch_labels and annotations.get(ANNOTATION) == record:
                return None
            return {"labels": patch_labels, "annotations": {ANNOTATION: record}}

        self._update(change)
        if self.nfd_dir is not None:
            write_nfd_feature_file(self.nfd_dir, profile)
        return wanted

    def remove(self) -> list[str]:
        """Undo :meth:`apply`: restore every label Mokka set and still owns, drop the record
        and the feature file. Returns the label keys restored; idempotent."""
        restored: list[str] = []

        def change(node: dict[str, Any]) -> dict[str, Any] | None:
            restored.clear()
            meta = node.get("metadata", {})
            labels: dict[str, str] = meta.get("labels") or {}
            annotations: dict[str, str] = meta.get("annotations") or {}
            if ANNOTATION not in annotations:
                return None
            record = Record.parse(annotations[ANNOTATION])
            patch_labels: dict[str, str | None] = {}
            for key, value in record.labels.items():
                if labels.get(key) == value:  # still ours: someone else's change is theirs
                    patch_labels[key] = record.previous.get(key)
                    restored.append(key)
            return {"labels": patch_labels, "annotations": {ANNOTATION: None}}

        self._update(change)
        if self.nfd_dir is not None:
            path = self.nfd_dir / NFD_FILE_NAME
            if path.exists():
                path.unlink()
        return sorted(restored)


def _describe(exc: Exception) -> str:
    status = _status(exc)
    reason = getattr(exc, "reason", None) or exc
    if status == 403:
        return f"forbidden ({reason}): the service account needs get/patch on this node"
    return f"HTTP {status} {reason}" if status else str(reason)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m k8snode.nodeinfo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("apply", "remove", "show"):
        p = sub.add_parser(name)
        if name != "remove":
            p.add_argument("--profile", required=True, help="built-in profile name or a profile YAML file")
            p.add_argument("--gpus", type=int, default=None, help="GPU count (default: the profile's)")
        if name != "show":
            p.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="node name (default: $NODE_NAME)")
            p.add_argument("--nfd-dir", type=Path, default=NFD_FEATURES_DIR, help="NFD features.d directory")
            p.add_argument("--no-nfd", action="store_true", help="do not write/remove the NFD feature file")
    args = parser.parse_args(argv)
    from gpumodel import profile as profiles

    try:
        prof = profiles.load(args.profile).with_count(args.gpus) if args.command != "remove" else None
        if args.command == "show":
            assert prof is not None
            print(json.dumps({"labels": gfd_labels(prof), "nfd": nfd_features(prof)}, indent=2))
            return 0
        identity = NodeIdentity.in_cluster(args.node, None if args.no_nfd else args.nfd_dir)
        if args.command == "apply":
            assert prof is not None
            labels = identity.apply(prof)
            product = labels[f"{LABEL_DOMAIN}/gpu.product"]
            print(f"node {args.node}: {len(labels)} labels set ({LABEL_DOMAIN}/gpu.product={product})")
        else:
            restored = identity.remove()
            print(f"node {args.node}: {len(restored)} labels restored")
    except (profiles.ProfileError, NodeInfoError, ValueError) as exc:
        print(f"mokka nodeinfo: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
