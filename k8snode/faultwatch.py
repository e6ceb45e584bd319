"""Fault injection in a cluster: a ConfigMap names each node's faults; the node applies them.

The Helm chart (``faults.enabled``) creates the ConfigMap ``<release>-faults`` and runs
``python3 -m k8snode.faultwatch`` beside the NRI plugin on every node. The ConfigMap has one
key per node name; its value is a scenario (:mod:`gpumodel.scenario`: steps, optionally
timed with ``at``/``every``)::

    kubectl -n mokka patch configmap mokka-faults --type merge -p '{"data": {"node-a": "
      steps:
        - {gpu: 3, xid: 79}
        - {gpu: 0, temperature: {from: 60, to: 95, over: 2m}}
    "}}'

The entry is the node's desired faults: when it changes, the watcher restores the profile
(``clear --all``) and applies the new entry (a timed entry runs its timeline, which a newer
change cancels); when the key is removed, or the ConfigMap deleted, the node returns to its
profile. It applies them through :func:`gpumodel.faults.apply`, the path ``mokka fault``
takes, and records which entry it applied in the state itself (``fault_tag``), so a
restarted watcher does not raise the same Xids twice, while a node staged afresh (whose
state no longer has them) gets them again. A bad entry is reported in the watcher's log
and changes nothing.

Why a ConfigMap, not a custom resource: it needs no CRD (cluster-scoped, installed once
per cluster), `kubectl edit/patch` and GitOps tools handle it as they are, and its keys
choose nodes directly. Why the API rather than a mounted ConfigMap volume: the kubelet
refreshes mounted ConfigMaps only on its sync period (a minute or more), a watch delivers
a change at once. The watcher needs only ``list`` and ``watch`` of that one ConfigMap
(a Role in the release's namespace, ``resourceNames`` = it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpumodel import faults, ib_ports, scenario
from gpumodel import faultspec as fs


class Cancelled(Exception):
    """A newer entry replaced the one whose timeline was running."""


def tag_of(text: str) -> int:
    """The entry's tag in the state: never 0 (which means "none")."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


class FaultWatcher:
    """Keeps one node's faults equal to its ConfigMap entry."""

    def __init__(self, target: faults.Target, source: str, report: Callable[[str], None] = print) -> None:
        self.target = target
        self.source = source  # for messages: "ConfigMap NS/NAME key NODE"
        self.report = report
        self._stop = threading.Event()
        self._runner: threading.Thread | None = None
        self._rejected: int | None = None

    def reconcile(self, text: str | None) -> None:
        """Make the node's faults those of ``text`` (None: no entry: the profile's values)."""
        if text is not None and not text.strip():
            text = None
        tag = tag_of(text) if text is not None else 0
        if tag == faults.applied_tag(self.target) or tag == self._rejected:
            return
        if text is None:
            self.cancel()
            self._clear(0)
            self.report(f"{self.source}: no entry: faults cleared, the profile's values restored")
            return
        try:
            s = scenario.load_text(text, self.source)
            gpus = faults.gpus(self.target)
            events = s.timeline(gpus)
            scenario.check(self.target, events, s.source)
        except (scenario.ScenarioError, faults.FaultError) as exc:
            self._rejected = tag
            self.report(f"error: {exc} (nothing changed)")
            return
        self.cancel()
        self._clear(tag)
        self.report(f"{self.source}: {len(events)} fault(s) to apply")
        self._stop = threading.Event()
        self._runner = threading.Thread(target=self._run, args=(s, self._stop), daemon=True, name="faults")
        self._runner.start()

    def _clear(self, tag: int) -> None:
        faults.apply(self.target, [(faults.gpus(self.target), fs.Clear(all=True))], tag=tag)
        if self.target.root is not None:  # the node's InfiniBand ports too
            for line in ib_ports.clear_all(self.target.root):
                self.report(f"{self.source}: {line}")

    def _run(self, s: scenario.Scenario, stop: threading.Event) -> None:
        def sleep(seconds: float) -> None:
            if stop.wait(seconds):
                raise Cancelled

        try:
            scenario.run(self.target, s, report=lambda line: self.report(f"{self.source}: {line}"), sleep=sleep)
        except Cancelled:
            pass
        except (scenario.ScenarioError, faults.FaultError) as exc:
            self.report(f"error: {exc}")

    def cancel(self) -> None:
        """Stop a running timeline (the faults it applied stay until the next reconcile)."""
        self._stop.set()
        if self._runner is not None:
            self._runner.join(timeout=30)
            self._runner = None

    def wait(self) -> None:
        """Until the running timeline (if any) has finished."""
        if self._runner is not None:
            self._runner.join()


# ---- the Kubernetes side ----------------------------------------------------------------


def entries(api: Any, namespace: str, name: str, node: str) -> Iterable[str | None]:
    """The node's entry now, then each time the ConfigMap changes (forever; reconnects)."""
    from kubernetes import watch  # type: ignore[import-untyped, import-not-found, unused-ignore]

    selector = f"metadata.name={name}"
    backoff = 1.0
    while True:
        try:
            listing = api.list_namespaced_config_map(namespace, field_selector=selector)
            items = listing.items or []
            yield (items[0].data or {}).get(node) if items else None
            version = listing.metadata.resource_version
            stream = watch.Watch().stream(
                api.list_namespaced_config_map,
                namespace,
                field_selector=selector,
                resource_version=version,
                timeout_seconds=300,
            )
            for event in stream:
                obj = event["object"]
                yield None if event["type"] == "DELETED" else (obj.data or {}).get(node)
            backoff = 1.0
        except Exception as exc:  # API errors, dropped connections, expired resource versions: relist
            status = getattr(exc, "status", None)
            if status != 410:
                print(
                    f"ConfigMap {namespace}/{name}: {status or ''} {getattr(exc, 'reason', exc)}; retrying", flush=True
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, 30.0)


def api_client() -> Any:
    from kubernetes import client, config  # type: ignore[import-untyped, import-not-found, unused-ignore]

    loader: Any = config
    try:
        loader.load_incluster_config()
    except loader.ConfigException:
        loader.load_kube_config()
    return client.CoreV1Api()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m k8snode.faultwatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/var/lib/mokka"), help="the staged node")
    parser.add_argument("--configmap", required=True, help="the fault ConfigMap's name")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""), help="its namespace")
    parser.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="this node (default: $NODE_NAME)")
    args = parser.parse_args(argv)
    # The container's process 1: the kernel ignores a SIGTERM it has no handler for, and the pod would
    # wait out its whole grace period on every delete and rollout.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if not args.node or not args.namespace:
        print("mokka faultwatch: error: no node or namespace (set NODE_NAME, POD_NAMESPACE), --node", file=sys.stderr)
        return 1
    try:
        target = faults.for_root(args.root)
        api = api_client()
    except faults.FaultError as exc:
        print(f"mokka faultwatch: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the kubernetes client's config errors
        print(f"mokka faultwatch: error: no Kubernetes API: {exc}", file=sys.stderr)
        return 1
    source = f"ConfigMap {args.namespace}/{args.configmap} key {args.node}"
    watcher = FaultWatcher(target, source, report=lambda line: print(line, flush=True))
    print(f"watching {source}", flush=True)
    for text in entries(api, args.namespace, args.configmap, args.node):
        try:
            watcher.reconcile(text)
        except faults.FaultError as exc:  # the state went away (host cleanup): say so, keep watching
            print(f"error: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
