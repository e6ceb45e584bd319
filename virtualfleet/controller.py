"""The fleet controller: every VirtualGPUPool (``mokka.io/v1alpha1``) made into virtual GPU nodes,
and kept so.

For each pool: its template (:mod:`.template`, once per profile, GPU count and MIG strategy); nodes
``virtual-<pool>-0`` to ``-<replicas-1>`` (:func:`.pool.node_body`: the template's labels, the
pool's own labels under them, its taints, the GPUs as capacity and allocatable, or with the DRA
allocator a ResourceSlice the node owns) made where missing — a node deleted by hand comes back —,
brought in step where the pool changed, and deleted beyond ``replicas``; then the pool's status
(nodes, Ready nodes, allocatable GPUs, racks, the scale subresource's selector, a ``Ready``
condition). Every node is owned by its pool: deleting the pool lets Kubernetes' garbage collector
delete them. KWOK keeps the nodes Ready.

Watches of the pools and of the virtual nodes put pool names on a queue; one worker reconciles
them, and every pool again each :data:`RESYNC` seconds. The node watch also keeps the pools' nodes
in memory (:mod:`.nodecache`: listed once, then kept by its events), which is what a reconcile
reads instead of listing them. Node identities (GPU UUIDs, racks) derive
from the node's name and index, so a restarted controller makes byte-identical nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumodel import fleet
from gpumodel import profile as profiles

from . import faults, slices, template
from . import pool as pools
from .crd import GROUP, PLURAL, VERSION
from .metrics import Metrics
from .nodecache import NodeCache
from .watch import follow

__all__ = ["RESYNC", "Controller", "Settings"]

RESYNC = 60.0  # seconds between two reconciles of every pool
COALESCE = 0.5  # seconds the events after a first one are gathered into one pass
DIGEST_ANNOTATION = "mokka.io/pool-digest"  # what the node was made from: a changed pool changes it
DRA_DRIVER = "gpu.nvidia.com"
EVERY_POOL = "*"  # on the queue: reconcile every pool (the fault ConfigMap changed)

log = logging.getLogger("mokka.fleet")

Json = dict[str, Any]


@dataclass(frozen=True)
class Settings:
    gfd: Path  # NVIDIA's gpu-feature-discovery binary
    workdir: Path  # where templates are staged (emptied after each)
    nfd_labels: bool = True  # nodes carry the PCI labels NFD gives a real node of the profile
    workers: int = 32  # concurrent API writes (each on a connection of its own)
    faults: tuple[str, str] | None = None  # the chart's fault ConfigMap (namespace, name): one key per node


class PoolError(Exception):
    """The pool cannot be made as asked; the message is its Ready condition's (one line)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Controller:
    api: Any  # a kubernetes.client.ApiClient
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    _templates: dict[str, template.Template] = field(default_factory=dict)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _cache: NodeCache = field(default_factory=NodeCache)  # filled by run()'s node watch

    def __post_init__(self) -> None:
        # One connection per writer: the client's pool holds 4 by default, and a writer without one
        # opens and drops a connection per request.
        from kubernetes import client

        config = self.api.configuration
        config.connection_pool_maxsize = self.settings.workers + 4
        self.api = client.ApiClient(config)  # the pool is sized when the client is made

    # ------------------------------------------------------------------ the API

    def _core(self) -> Any:
        from kubernetes import client  # type: ignore[import-untyped, unused-ignore]

        return client.CoreV1Api(self.api)

    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def _resource(self) -> Any:
        from kubernetes import client

        return client.ResourceV1Api(self.api)

    def list_pools(self) -> list[Json]:
        raw = self._custom().list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False)
        return list(json.loads(raw.data).get("items") or [])

    def _nodes(self, name: str) -> dict[str, Json]:
        """Pool ``name``'s nodes by name: from the node watch's cache once it is synced, else listed."""
        if self._cache.synced.is_set():
            return self._cache.nodes(name)
        selector = f"{pools.POOL_LABEL}={name}"
        raw = self._core().list_node(label_selector=selector, _preload_content=False)
        return {n["metadata"]["name"]: n for n in json.loads(raw.data).get("items") or []}

    # ------------------------------------------------------------------ one pool

    def profile_of(self, spec: Json) -> profiles.Profile:
        """The pool's profile with its GPUs per node; PoolError names what is wrong."""
        if "profile" in spec:
            try:
                prof = profiles.load(spec["profile"])
            except profiles.ProfileError as exc:
                raise PoolError("UnknownProfile", str(exc)) from None
        else:
            ref = spec.get("profileConfigMap") or {}
            ns, cm_name, key = ref.get("namespace", ""), ref.get("name", ""), ref.get("key", "profile.yaml")
            where = f"ConfigMap {ns}/{cm_name} key {key}"
            from kubernetes.client.rest import ApiException  # type: ignore[import-untyped, unused-ignore]

            try:
                cm = self._core().read_namespaced_config_map(cm_name, ns)
            except ApiException as exc:
                raise PoolError("ProfileNotFound", f"{where}: {exc.reason}") from None
            text = (cm.data or {}).get(key)
            if text is None:
                raise PoolError("ProfileNotFound", f"{where}: no such key")
            try:
                prof = profiles.load_text(text, where)
            except profiles.ProfileError as exc:
                raise PoolError("InvalidProfile", str(exc).splitlines()[0]) from None
        try:
            return prof.with_count(spec.get("gpusPerNode"))
        except profiles.ProfileError as exc:
            raise PoolError("InvalidProfile", str(exc).splitlines()[0]) from None

    def template_of(self, name: str, prof: profiles.Profile, mig_strategy: str) -> template.Template:
        key = hashlib.sha256(f"{prof.model_dump_json()}|{mig_strategy}|{self.settings.nfd_labels}".encode()).hexdigest()
        if key not in self._templates:
            t0 = time.monotonic()
            try:
                self._templates[key] = template.compute(
                    prof, name, self.settings.gfd, self.settings.workdir / name, mig_strategy, self.settings.nfd_labels
                )
            except template.TemplateError as exc:
                raise PoolError("TemplateFailed", str(exc)) from None
            self.metrics.template.observe(time.monotonic() - t0)
            log.info("pool %s: template of %s computed in %.1f s", name, prof.name, time.monotonic() - t0)
        return self._templates[key]

    def desired(self, obj: Json) -> pools.Pool:
        """The pool ``obj`` as nodes are made from it."""
        name, spec = obj["metadata"]["name"], obj.get("spec") or {}
        prof = self.profile_of(spec)
        made = self.template_of(name, prof, spec.get("migStrategy", "none"))
        rack = spec.get("rackSize")
        return pools.Pool(
            name=name,
            spec=json.dumps(spec, sort_keys=True),
            profile=prof.name,
            product=prof.gpu.name,
            gpus=prof.gpu_count,
            count=int(spec.get("replicas", 1)),
            labels={**(spec.get("labels") or {}), **made.labels},
            per_gpu=made.per_gpu,
            devices=made.devices,
            nic_devices=made.nic_devices,
            racked=made.racked or rack is not None,
            rack_gpus=int(rack) if rack else fleet.NVL_DOMAIN_GPUS,
            taints=[{k: t[k] for k in ("key", "value", "effect") if k in t} for t in spec.get("taints") or []],
            dra=spec.get("allocator", "device-plugin") == "dra",
            owner={
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "VirtualGPUPool",
                "name": name,
                "uid": obj["metadata"]["uid"],
            },
        )

    def fault_entries(self) -> dict[str, str]:
        """The fault ConfigMap's entries (node name -> scenario text); none without one."""
        return faults.read_entries(self._core(), *self.settings.faults) if self.settings.faults else {}

    def health_of(self, pool: pools.Pool, places: list[str]) -> dict[str, faults.Health]:
        """Node -> what its faults show (:func:`.faults.by_node`); a bad entry is logged and changes
        nothing, as on a real node."""
        entries = self.fault_entries()
        if not entries:
            return {}
        placed = [(node, pool.rack(i)) for i, node in enumerate(places)]

        def warn(message: str) -> None:
            log.warning("pool %s: %s: the entry changes nothing", pool.name, message)

        return faults.by_node(
            entries, placed, lambda n: faults.node_gpus(pool.profile, pool.product, pool.gpus, n), warn
        )

    def reconcile(self, name: str) -> None:
        """Pool ``name``'s nodes and status as its spec says (a pool gone: nothing; the garbage
        collector deletes its nodes)."""
        with self.metrics.reconcile.time():
            self._reconcile(name)

    def _reconcile(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            raw = self._custom().get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                self.metrics.forget(name)
                return
            raise
        obj = json.loads(raw.data)
        allocator = (obj.get("spec") or {}).get("allocator", "device-plugin")
        try:
            pool = self.desired(obj)
        except PoolError as exc:
            log.warning("pool %s: %s", name, exc)
            self._write_status(obj, self._nodes(name), None, allocator, (exc.reason, str(exc)))
            return
        existing = self._nodes(name)
        # Nodes someone else made (a user, an autoscaler's KWOK provider) and labelled with the pool:
        # decorated at the places after the pool's own, never deleted.
        own, adopted = pools.split(name, existing)
        places = [*pool.nodes, *adopted]
        pool.health = self.health_of(pool, places)
        digests = {n: _digest(pool, n, i) for i, n in enumerate(places)}
        wanted = set(pool.nodes)
        make = [i for i, n in enumerate(pool.nodes) if n not in existing]
        renew = [
            i
            for i, n in enumerate(places)
            if n in existing
            and (
                existing[n]["metadata"].get("annotations", {}).get(DIGEST_ANNOTATION) != digests[n]
                or not pools.shows(existing[n], pool.health_of(n))  # KWOK keeps the conditions, checked
            )
        ]
        surplus = [n for n in own if n not in wanted]
        if make or renew or surplus:
            log.info("pool %s: nodes to make %d, to renew %d, to delete %d", name, len(make), len(renew), len(surplus))
        dra, workers = allocator == "dra", self.settings.workers
        pools.parallel(lambda i: self._make(pool, i, digests[pool.nodes[i]], dra), make, workers)
        pools.parallel(lambda i: self._renew(pool, i, places[i], digests[places[i]], existing, dra), renew, workers)
        pools.parallel(self._delete, surplus, workers)
        self.metrics.made.inc(len(make))
        self.metrics.renewed.inc(len(renew))
        self.metrics.deleted.inc(len(surplus))
        if make or renew or surplus:
            existing = self._nodes(name)
        self._write_status(obj, existing, pool, allocator, None)

    def _body(self, pool: pools.Pool, i: int, digest: str, name: str | None = None) -> Json:
        body = pools.node_body(pool, i, name)
        body["metadata"]["annotations"][DIGEST_ANNOTATION] = digest
        return body

    def _make(self, pool: pools.Pool, i: int, digest: str, dra: bool) -> None:
        from kubernetes.client.rest import ApiException

        body = self._body(pool, i, digest)
        try:
            made = json.loads(self._core().create_node(body, _preload_content=False).data)
        except ApiException as exc:
            if exc.status != 409:  # made meanwhile (the watch's event came first): the next pass checks it
                raise
            return
        self._cache.wrote(made)  # seen at once by this pass's status (its watch event follows)
        if dra:
            self._slice(pool, i, made["metadata"]["uid"])

    def _renew(self, pool: pools.Pool, i: int, name: str, digest: str, existing: dict[str, Json], dra: bool) -> None:
        """Node ``name`` (at place ``i``) brought in step. One of the pool's own: exactly its body.
        One someone else made: the pool's labels, GPUs and annotations added to what it has (its
        owner, taints, other labels and resources stay)."""
        node = existing[name]
        body = self._body(pool, i, digest, name)
        annotations = {pools.UNHEALTHY_ANNOTATION: None, **body["metadata"]["annotations"]}
        if pool.owns(name):
            labels: dict[str, str | None] = {k: None for k in node["metadata"].get("labels", {})}
            labels.update(body["metadata"]["labels"])
            patch: Json = {
                "metadata": {
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": body["metadata"].get("ownerReferences"),
                },
                "spec": {"taints": body["spec"].get("taints")},
            }
            status = body["status"]
        else:
            theirs = node["metadata"].get("labels", {}).get("kubernetes.io/hostname", name)
            gone = (
                {pools.CLIQUE_LABEL: None} if pools.CLIQUE_LABEL in pool.labels else {}
            )  # GFD's, when no probe completes
            labels = {**gone, **body["metadata"]["labels"], "kubernetes.io/hostname": theirs}
            patch = {"metadata": {"labels": labels, "annotations": annotations}}
            status = {k: pool.resources(name, allocatable=k == "allocatable") for k in ("capacity", "allocatable")}
            status["conditions"] = body["status"]["conditions"]
        # The metadata last: its digest (and unhealthy-GPU) annotation says the node is in step.
        core = self._core()
        if any(status.values()):
            core.patch_node_status(name, {"status": status}, _preload_content=False)
        if dra:
            self._slice(pool, i, node["metadata"]["uid"], name)
        self._cache.wrote(json.loads(core.patch_node(name, patch, _preload_content=False).data), read=node)

    def _slice(self, pool: pools.Pool, i: int, owner_uid: str, name: str | None = None) -> None:
        """Node ``i``'s (or ``name``'s) ResourceSlices: its GPUs' and, where the profile has
        InfiniBand adapters, theirs (made, or replaced where they are)."""
        from k8snode.dra import resources

        node = name or pool.nodes[i]
        slices.publish(self._resource(), node, DRA_DRIVER, pool.slice_devices(node), owner_uid)
        if pool.nic_devices:
            slices.publish(self._resource(), node, resources.NIC_DRIVER, pool.nic_slice_devices(node), owner_uid)

    def _delete(self, node: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._core().delete_node(node, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._cache.apply("DELETED", {"metadata": {"name": node}})

    def _write_status(
        self, obj: Json, nodes: dict[str, Json], pool: pools.Pool | None, allocator: str, error: tuple[str, str] | None
    ) -> None:
        from kubernetes.client.rest import ApiException

        name = obj["metadata"]["name"]
        want = int((obj.get("spec") or {}).get("replicas", 1))
        own, adopted = pools.split(name, nodes)
        ready = [n for n in own.values() if pools.ready(n)]
        gpus = 0
        for n in [*ready, *(nodes[a] for a in adopted if pools.ready(nodes[a]))]:
            if allocator == "dra" and pool is not None:
                gpus += len(pool.healthy(n["metadata"]["name"]))
            else:
                gpus += int(n.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
        places = [*pool.nodes, *adopted] if pool else []
        racks = {pool.rack(i) for i, n in enumerate(places) if n in nodes} - {None} if pool else set()
        if error is not None:
            condition = {"type": "Ready", "status": "False", "reason": error[0], "message": error[1]}
        elif len(ready) == want and len(own) == want:
            condition = {"type": "Ready", "status": "True", "reason": "NodesReady", "message": f"{want} node(s) Ready"}
        else:
            condition = {
                "type": "Ready",
                "status": "False",
                "reason": "NodesNotReady",
                "message": f"{len(ready)} of {want} node(s) Ready",
            }
        generation = obj["metadata"].get("generation")
        condition["observedGeneration"] = generation
        old = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}.get("Ready")
        same = old is not None and old.get("status") == condition["status"]
        condition["lastTransitionTime"] = (
            old["lastTransitionTime"] if same and old else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        )
        status = {
            "observedGeneration": generation,
            "replicas": len(own),
            "readyReplicas": len(ready),
            "adoptedNodes": len(adopted),
            "gpusPerNode": pool.gpus if pool else (obj.get("status") or {}).get("gpusPerNode"),
            "allocatableGPUs": gpus,
            "racks": len(racks),
            "selector": f"{pools.POOL_LABEL}={name}",
            "conditions": [condition],
        }
        status = {k: v for k, v in status.items() if v is not None}
        self.metrics.wanted.labels(name).set(want)
        self.metrics.pool(name, status, sum(len(h.unhealthy) for h in pool.health.values()) if pool else 0)
        if status == obj.get("status"):
            return
        try:
            self._custom().patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, {"status": status}, _preload_content=False
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ------------------------------------------------------------------ the loop

    def enqueue(self, name: str) -> None:
        self._queue.put(name)

    def run(self, stop: threading.Event) -> None:
        """Reconcile until ``stop`` is set: on every change of a pool or a virtual node, and every
        pool each :data:`RESYNC` seconds."""

        def pool_name(obj: Json) -> str | None:
            return str(obj.get("metadata", {}).get("name") or "") or None

        custom, core = self._custom(), self._core()

        def pool_stream(**kw: Any) -> Any:
            return custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)

        def node_stream(**kw: Any) -> Any:
            return core.list_node(label_selector=pools.POOL_LABEL, **kw)  # every pool's nodes, whoever made them

        watches: list[tuple[Callable[..., Any], Callable[[Json], str | None], str, NodeCache | None]] = [
            (pool_stream, pool_name, "pools", None),
            (node_stream, lambda _obj: None, "virtual nodes", self._cache),  # its cache names the pools touched
        ]
        if self.settings.faults is not None:
            namespace, name = self.settings.faults

            def fault_stream(**kw: Any) -> Any:
                return core.list_namespaced_config_map(namespace, field_selector=f"metadata.name={name}", **kw)

            watches.append((fault_stream, lambda _obj: EVERY_POOL, f"the fault ConfigMap {namespace}/{name}", None))
        for target, to_pool, what, cache in watches:
            args = (target, to_pool, self.enqueue, what, cache)
            threading.Thread(target=follow, args=args, daemon=True, name=what).start()
        last_resync = 0.0
        while not stop.is_set():
            if time.monotonic() - last_resync >= RESYNC:
                last_resync = time.monotonic()
                for obj in self._safe(self.list_pools) or []:
                    self.enqueue(obj["metadata"]["name"])
            try:
                first = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            time.sleep(COALESCE)  # a burst of events (KWOK readying a thousand nodes) makes one pass
            names = {first}
            while True:  # every name queued meanwhile, once
                try:
                    names.add(self._queue.get_nowait())
                except queue.Empty:
                    break
            if EVERY_POOL in names:
                names = {obj["metadata"]["name"] for obj in self._safe(self.list_pools) or []}
            for name in sorted(n for n in names if n):
                self._safe(functools.partial(self.reconcile, name))

    @staticmethod
    def _safe(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # one pool's failure (an API error) never stops the others
            log.error("%s", exc)
            return None


def _digest(pool: pools.Pool, node: str, i: int) -> str:
    """What ``node`` at place ``i`` of ``pool`` is made from: the pool's facts (not its node count),
    the node's rack and what its faults show."""
    facts: list[Any] = [pool.labels, pool.per_gpu, pool.devices, pool.nic_devices, pool.racked, pool.rack_gpus]
    facts.append(pool.taints)
    facts += [pool.owner, pool.dra, dataclasses.asdict(pool.health_of(node)), pool.rack(i)]
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
