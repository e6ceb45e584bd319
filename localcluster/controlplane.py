"""The cluster's control plane, step by step: its network namespace and the host's way in, the
certificates, its mount namespace, etcd and the API server, the controller manager and scheduler,
kube-proxy and CoreDNS. Every process runs in the control plane's mount namespace and the
cluster's network namespace; each step gets the :class:`~.context.Context` it works in."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fetch.kube.binaries import Binaries

from . import config, forward, netns, process
from .errors import ClusterError
from .pki import Pki

if TYPE_CHECKING:
    from .context import Context

__all__ = [
    "HOLDERS",
    "default_service_account",
    "start_controllers",
    "start_etcd_and_apiserver",
    "start_namespace",
    "start_network",
    "start_services",
    "write_certificates",
]

HOLDERS = ("namespace", "forward", "netns")  # stopped last: the namespaces go with their last process
_SBIN = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # kube-proxy runs iptables


def start_network(ctx: Context) -> None:
    """The cluster's network namespace (:mod:`.netns`), and the forwarder that lets the host reach
    the API server and the NRI plugins' health ports in it (:mod:`.forward`)."""
    layout = ctx.layout
    layout.ns.mkdir(parents=True, exist_ok=True)
    ready = layout.ns / "netns-ready"
    prefix = layout.pod_subnet.split("/")[1]
    nodes = ctx.nodes
    ports = sorted({*ctx.state.ports.values(), *(p for n in nodes for p in n.record["ports"].values())})
    argv = ["unshare", "--net", "--", sys.executable, "-m", netns.__name__, layout.bridge, prefix, str(ready)]
    argv += [",".join(map(str, ports)), layout.gateway, *(n.layout.node_ip for n in nodes)]
    holder = ctx.processes.record(process.spawn("netns", argv, layout.logs / "netns.log", holder=None))
    ctx.wait("network namespace", ready.exists, timeout=30)
    forwarded = [ctx.ports.apiserver, *(n.ports.nri_health for n in nodes)]
    argv = [sys.executable, "-m", forward.__name__, f"/proc/{holder.pid}/ns/net", *map(str, forwarded)]
    fwd = ctx.processes.record(process.spawn("forward", argv, layout.logs / "forward.log", holder=None))
    ctx.wait("the host's forwarder", lambda: "forwarding" in Path(fwd.log).read_text(), timeout=30)


def write_certificates(ctx: Context) -> None:
    """The CA, every component's certificate and the kubeconfigs (each node's kubelet's too)."""
    layout = ctx.layout
    pki = Pki(layout.pki)
    pki.generate([n.name for n in ctx.nodes], addresses=[layout.gateway])
    server = ctx.apiserver.server
    for name in ("admin", "controller-manager", "scheduler", "kube-proxy"):
        pki.kubeconfig(name, server, layout.kubeconfigs / f"{name}.conf")
    for n in ctx.nodes:
        pki.kubeconfig(f"kubelet-{n.name}", server, n.layout.kubeconfig)


def start_namespace(ctx: Context) -> None:
    """The control plane's private mount namespace: /etc/hosts naming every node, iptables' lock
    (kube-proxy's) of its own."""
    layout = ctx.layout
    layout.ns.mkdir(parents=True, exist_ok=True)
    layout.hosts_file.write_text(config.hosts([n.name for n in ctx.nodes]))
    xtables = layout.ns / "xtables.lock"
    xtables.touch()
    binds = [[str(layout.hosts_file), "/etc/hosts"], [str(xtables), "/run/xtables.lock"]]
    ctx.state.namespace_inode = ctx.processes.start_holder("namespace", {"binds": binds}, layout.ns, layout.logs)
    ctx.save()


def start_etcd_and_apiserver(ctx: Context, bins: Binaries) -> None:
    layout, procs = ctx.layout, ctx.processes
    procs.spawn(procs.holder, "etcd", config.etcd_argv(bins.etcd, layout, ctx.ports), layout.logs / "etcd.log")
    apiserver = config.apiserver_argv(bins["kube-apiserver"], layout, ctx.ports)
    procs.spawn(procs.holder, "kube-apiserver", apiserver, layout.logs / "kube-apiserver.log")


def start_controllers(ctx: Context, bins: Binaries, virtual_nodes: bool) -> None:
    """The controller manager (waiting longer for a lease with ``virtual_nodes``) and the scheduler."""
    layout, procs = ctx.layout, ctx.processes
    cm = config.controller_manager_argv(bins["kube-controller-manager"], layout, virtual_nodes=virtual_nodes)
    procs.spawn(procs.holder, "kube-controller-manager", cm, layout.logs / "kube-controller-manager.log")
    scheduler = config.scheduler_argv(bins["kube-scheduler"], layout)
    procs.spawn(procs.holder, "kube-scheduler", scheduler, layout.logs / "kube-scheduler.log")


def start_services(ctx: Context, bins: Binaries) -> None:
    """Services and DNS: kube-proxy, CoreDNS and its Service (kube-system/kube-dns)."""
    layout, procs = ctx.layout, ctx.processes
    proxy = config.kube_proxy_argv(bins["kube-proxy"], layout, ctx.nodes[0].name, 10256, 10249)
    procs.spawn(procs.holder, "kube-proxy", proxy, layout.logs / "kube-proxy.log", env=_SBIN)
    layout.corefile.write_text(config.corefile(layout))
    dns = [str(bins["coredns"]), "-conf", str(layout.corefile)]
    procs.spawn(procs.holder, "coredns", dns, layout.logs / "coredns.log")
    service, endpoints = config.dns_service(layout)
    ctx.apiserver.post("/api/v1/namespaces/kube-system/services", service)
    ctx.apiserver.post("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", endpoints)


def default_service_account(ctx: Context) -> bool:
    """The default namespace's service account and root CA are there (pods can be made)."""
    try:
        ctx.apiserver.get("/api/v1/namespaces/default/serviceaccounts/default")
        ctx.apiserver.get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
        return True
    except ClusterError:
        return False
