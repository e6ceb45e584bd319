"""Node Feature Discovery on the local cluster (``mokka cluster up --nfd``, and always with
``--allocator nvidia-dra``, whose chart places its kubelet plugins by NFD's PCI labels): NFD's own
``nfd-master`` as a control-plane process and an ``nfd-worker`` in every real node's namespace,
built from the Go module proxy (:data:`fetch.kube.binaries.NFD`), with NFD's CRDs from its module.

Each node's ``features.d`` (its private ``/etc/kubernetes/node-feature-discovery/features.d``) holds
the feature file Mokka writes on every node (:func:`k8snode.nodeinfo.write_nfd_feature_file`, as
Mokka's chart writes it on a real node): NFD's local source turns it into
``feature.node.kubernetes.io/pci-10de.present`` and the class form, which the GPU Operator and
NVIDIA's DRA chart select GPU nodes by. NFD's other sources (cpu, kernel, memory, system, pci...)
read the node as they find it, as on any host. The worker publishes a NodeFeature object; the
master turns it into the node's labels. Up returns when every node carries its GPUs' PCI labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fetch.kube import versions
from k8snode import nodeinfo

from .base import AddOn, Kit

if TYPE_CHECKING:
    from ..context import Context
    from ..node import Node

__all__ = ["FEATURES_DIR", "NAMESPACE", "Nfd", "labels", "write_feature_file"]

NAMESPACE = "node-feature-discovery"  # where the workers' NodeFeature objects live
FEATURES_DIR = str(nodeinfo.NFD_FEATURES_DIR)  # NFD's default, in each node's namespace
# No metrics or health ports: the workers of every node share the cluster's network namespace.
QUIET_PORTS = ("-metrics=0", "-grpc-health=0")


def labels(profile: Any) -> dict[str, str]:
    """The labels NFD puts on a node with these GPUs from Mokka's feature file."""
    return {nodeinfo.NFD_PREFIX + key: value for key, value in nodeinfo.nfd_features(profile).items()}


def write_feature_file(ctx: Context, n: Node) -> None:
    """Mokka's feature file in the node's ``features.d`` (its private /etc/kubernetes)."""
    private = n.layout.private("/etc/kubernetes")
    features = private / nodeinfo.NFD_FEATURES_DIR.relative_to("/etc/kubernetes")
    nodeinfo.write_nfd_feature_file(features, ctx.profiles[n.name])


class Nfd(AddOn):
    def up(self, ctx: Context, kit: Kit) -> None:
        with ctx.step(f"Node Feature Discovery {versions.NFD}: nfd-master, an nfd-worker per node, PCI labels"):
            nfd, kubeconfig = kit.bins.nfd, str(ctx.layout.admin_kubeconfig)
            ctx.apiserver.kubectl("apply", "--server-side", "-f", str(nfd / "nfd-api-crds.yaml"))
            ctx.apiserver.post(
                "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            )
            env = {"KUBERNETES_NAMESPACE": NAMESPACE}
            master = [str(nfd / "nfd-master"), f"-kubeconfig={kubeconfig}", *QUIET_PORTS]
            # The master records its version on the node it runs on, as its pod would: the first node's.
            first = {**env, "NODE_NAME": ctx.nodes[0].name}
            ctx.processes.spawn(ctx.processes.holder, "nfd-master", master, ctx.layout.logs / "nfd-master.log", first)

            def worker(n: Node) -> None:
                write_feature_file(ctx, n)
                argv = [str(nfd / "nfd-worker"), f"-kubeconfig={kubeconfig}", *QUIET_PORTS]
                n.spawn("nfd-worker", argv, env={**env, "NODE_NAME": n.name})

            ctx.each("NFD worker", worker)
            wants = {n.name: labels(ctx.profiles[n.name]) for n in ctx.nodes}
            ctx.wait_each("NFD's PCI labels", lambda n: wants[n.name].items() <= n.labels().items())
