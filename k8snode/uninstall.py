"""The chart's pre-delete step: the DaemonSet's pods end while the release's RBAC still stands.

``helm uninstall`` deletes a release's objects in one pass and does not wait for a DaemonSet's pods
to end before it deletes their ServiceAccount and ClusterRoleBinding: each pod's preStop hook (which
removes the labels it set on its node, the NFD feature file and the staged node) then meets a token
the API server no longer accepts, and the node keeps its GPU labels. The chart therefore runs this
module first, as a ``pre-delete`` hook Job: it deletes the DaemonSet with foreground propagation and
waits until the DaemonSet is gone, which the garbage collector allows only once every pod of it has
been deleted, i.e. once each pod's preStop has run and its kubelet has confirmed the end. Helm then
deletes the rest.

It acts only on a DaemonSet that Helm installed for this release (Helm's ``meta.helm.sh/release-name``
and ``-namespace`` annotations name it): the chart rendered by ``helm template`` and applied with
kubectl has its hook objects applied too, and their Job must then leave the DaemonSet alone.

``python3 -m k8snode.uninstall --release R --namespace NS --daemonset NAME [--timeout S]``;
in-cluster credentials (the hook's own ServiceAccount: ``get`` and ``delete`` of that DaemonSet,
nothing else). One line on stdout per step; one line on stderr and exit 1 on failure.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["UninstallError", "end_daemonset", "main"]


class UninstallError(Exception):
    """The DaemonSet could not be deleted or did not end in time (one line)."""


RELEASE_NAME, RELEASE_NAMESPACE = "meta.helm.sh/release-name", "meta.helm.sh/release-namespace"


def end_daemonset(apps: Any, release: str, namespace: str, name: str, timeout: float, poll: float = 1.0) -> str:
    """Delete DaemonSet ``namespace/name`` in the foreground and wait until it is gone, if Helm
    installed it for ``release``; what happened (``gone``, ``not there``, or why it was left alone).
    ``apps`` is a ``kubernetes.client.AppsV1Api``."""
    from kubernetes.client import V1DeleteOptions
    from kubernetes.client.exceptions import ApiException

    where = f"daemonset {namespace}/{name}"
    try:
        ds = apps.read_namespaced_daemon_set(name, namespace)
        annotations = ds.metadata.annotations or {}
        if (annotations.get(RELEASE_NAME), annotations.get(RELEASE_NAMESPACE)) != (release, namespace):
            return f"left alone: not installed by helm release {namespace}/{release} (its {RELEASE_NAME} annotations)"
        apps.delete_namespaced_daemon_set(name, namespace, body=V1DeleteOptions(propagation_policy="Foreground"))
    except ApiException as exc:
        if exc.status == 404:
            return "not there"
        raise UninstallError(f"{where}: {exc.status} {exc.reason}") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            apps.read_namespaced_daemon_set(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            raise UninstallError(f"{where}: {exc.status} {exc.reason}") from None
        time.sleep(poll)
    raise UninstallError(f"{where}: its pods did not end within {timeout:g}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m k8snode.uninstall",
        description="End the chart's DaemonSet (its pods' preStop hooks run) before helm deletes its RBAC.",
    )
    parser.add_argument("--release", required=True, help="the Helm release being uninstalled")
    parser.add_argument("--namespace", required=True, help="the release's namespace")
    parser.add_argument("--daemonset", required=True, help="the chart's DaemonSet")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for its pods (default 120)")
    args = parser.parse_args(argv)
    from kubernetes import client, config

    where = f"daemonset {args.namespace}/{args.daemonset}"
    try:
        config.load_incluster_config()
        print(f"{where}: ending it before helm deletes its RBAC; each pod's preStop undoes its node", flush=True)
        started = time.monotonic()
        outcome = end_daemonset(client.AppsV1Api(), args.release, args.namespace, args.daemonset, args.timeout)
    except (UninstallError, config.ConfigException) as exc:
        print(f"mokka uninstall: {exc}", file=sys.stderr)
        return 1
    print(f"{where}: {outcome} ({time.monotonic() - started:.1f}s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
