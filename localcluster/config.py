"""What each component of the cluster is told: command lines, kubelet's and containerd's
configuration files, the CNI network. Pure functions of the cluster's :class:`Layout`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomlkit
import yaml

from hostsetup.containerd.settings import RUNTIME_NAME

from .layout import Layout, NodeLayout, NodePorts, Ports
from .pki import Pki

SERVICE_RANGE = "10.96.0.0/16"
DNS_SERVICE_IP = "10.96.0.10"  # the cluster DNS (kube-system/kube-dns), as kubeadm places it
PAUSE_IMAGE = "localhost/mokka/pause:1"


# Kubelet sets the first three and the last three for the whole machine (its container manager's
# kernel tunables, each written where the value differs); the CNI bridge plugin turns on IP
# forwarding when the bridge is the pods' gateway. In the namespace they are private files.
SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def etcd_argv(etcd: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(etcd),
        "--name=mokka",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=mokka={peer}",
        "--listen-metrics-urls=",
        # A throw-away local test cluster: no fsync per write keeps it fast on a busy disk.
        "--unsafe-no-fsync",
        "--snapshot-count=10000",
        "--log-level=warn",
    ]


def apiserver_argv(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    pki = Pki(layout.pki)
    p = pki.path
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        # In the cluster's network namespace: its loopback (etcd, kubelets, the host's forwarder) and
        # the pods' bridge (the `kubernetes` Service leads to the advertised gateway address).
        "--bind-address=0.0.0.0",
        f"--advertise-address={layout.gateway}",
        f"--secure-port={ports.apiserver}",
        # A node is reached by its name (the control plane's hosts file): kubelet refuses a loopback node IP.
        "--kubelet-preferred-address-types=Hostname",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        f"--client-ca-file={pki.ca}",
        f"--tls-cert-file={p('apiserver.crt')}",
        f"--tls-private-key-file={p('apiserver.key')}",
        f"--kubelet-client-certificate={p('apiserver-kubelet-client.crt')}",
        f"--kubelet-client-key={p('apiserver-kubelet-client.key')}",
        f"--service-account-key-file={p('sa.pub')}",
        f"--service-account-signing-key-file={p('sa.key')}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(binary: Path, layout: Layout, virtual_nodes: bool = False) -> list[str]:
    """With ``virtual_nodes`` the node controller waits :data:`VIRTUAL_NODE_GRACE` for a node's lease
    (KWOK renews thousands of them)."""
    pki = Pki(layout.pki)
    grace = [f"--node-monitor-grace-period={VIRTUAL_NODE_GRACE}"] if virtual_nodes else []
    kubeconfig = layout.kubeconfigs / "controller-manager.conf"
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.path('sa.key')}",
        f"--root-ca-file={pki.ca}",
        f"--cluster-signing-cert-file={pki.ca}",
        f"--cluster-signing-key-file={pki.path('ca.key')}",
        "--allocate-node-cidrs=false",
        *grace,
        *API_QPS,
        "--profiling=false",
        "--v=1",
    ]


# Client rate limits of the controllers and the scheduler: the defaults (20 and 50 requests a
# second) would make a 1000-replica Deployment over virtual nodes take a minute.
API_QPS = ("--kube-api-qps=500", "--kube-api-burst=1000")
# The node controller of a cluster with virtual nodes waits 3 minutes for a node's lease instead of
# 50 s (real nodes too): KWOK renews theirs every 120 s (:data:`.addons.kwok.LEASE_SECONDS` / 4).
VIRTUAL_NODE_GRACE = "3m"


def scheduler_argv(binary: Path, layout: Layout) -> list[str]:
    kubeconfig = layout.kubeconfigs / "scheduler.conf"
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        *API_QPS,
        "--profiling=false",
        "--v=1",
    ]


def kubelet_config(node: NodeLayout, ports: NodePorts) -> dict[str, Any]:
    pki = Pki(node.cluster.pki)
    endpoint = f"unix://{node.containerd_socket}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "tlsCertFile": str(pki.path(f"kubelet-serving-{node.name}.crt")),
        "tlsPrivateKeyFile": str(pki.path(f"kubelet-serving-{node.name}.key")),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs",  # PID 1 is not systemd
        "cgroupRoot": node.cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        # No iptables chains on the host; the host's kernel tunables are private files (namespace).
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "clusterDomain": "cluster.local",
        "clusterDNS": [DNS_SERVICE_IP],
        "resolvConf": "/etc/resolv.conf",
        # The images are imported locally: never garbage-collect them; a busy disk is no pressure.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "64Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "serializeImagePulls": False,
        "enforceNodeAllocatable": ["pods"],
        "shutdownGracePeriod": "0s",
    }


def kubelet_argv(binary: Path, node: NodeLayout) -> list[str]:
    return [
        str(binary),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubeconfig}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.node_ip}",
        "--v=1",
    ]


def write_kubelet_config(node: NodeLayout, ports: NodePorts) -> Path:
    path = node.kubelet_config
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubelet_config(node, ports), sort_keys=False))
    return path


def containerd_config(node: NodeLayout, runc: Path, cni_bin: Path) -> dict[str, Any]:
    """containerd 2.x (config version 3) for a node's kubelet: CRI with CDI and NRI, everything under
    the node's directory."""
    c = node.containerd
    return {
        "version": 3,
        "root": str(c / "root"),
        "state": str(c / "state"),
        "temp": str(c / "tmp"),
        "grpc": {"address": str(node.containerd_socket)},
        "ttrpc": {"address": str(node.containerd_socket) + ".ttrpc"},
        "plugins": {
            "io.containerd.cri.v1.images": {
                "snapshotter": "overlayfs",
                "pinned_images": {"sandbox": PAUSE_IMAGE},
                # hosts.toml per registry (write_registry_hosts), in the node's private /etc/containerd
                "registry": {"config_path": REGISTRY_HOSTS},
            },
            "io.containerd.cri.v1.runtime": {
                "enable_cdi": True,
                "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],  # private directories (namespace)
                "netns_mounts_under_state_dir": True,
                "disable_apparmor": True,
                # root lacks CAP_SYS_RESOURCE here: without it every RunPodSandbox fails.
                "restrict_oom_score_adj": True,
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {
                        name: {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"BinaryName": str(runc), "Root": str(c / "runc"), "SystemdCgroup": False},
                        }
                        # ``nvidia``: the handler Mokka's host setup adds (RuntimeClass nvidia, which
                        # the GPU Operator's pods name): plain runc, the NRI plugin giving the GPUs.
                        for name in ("runc", RUNTIME_NAME)
                    },
                },
                "cni": {"bin_dirs": [str(cni_bin)], "conf_dir": str(node.cni / "conf")},
            },
            "io.containerd.grpc.v1.cri": {
                "disable_tcp_service": True,
                "stream_server_address": "127.0.0.1",
                "stream_server_port": "0",
            },
            "io.containerd.image-verifier.v1.bindir": {"bin_dir": str(c / "image-verifier")},
            "io.containerd.internal.v1.opt": {"path": str(c / "opt")},
            "io.containerd.nri.v1.nri": {
                "disable": False,
                "socket_path": "/var/run/nri/nri.sock",  # a private directory (namespace)
                "plugin_path": str(c / "nri-plugins"),
                "plugin_config_path": str(c / "nri-conf.d"),
                "plugin_registration_timeout": "5s",
                "plugin_request_timeout": "2s",
            },
        },
    }


REGISTRY_HOSTS = "/etc/containerd/certs.d"  # containerd's registry host directory, in the node's namespace


def registry_hosts(server: str) -> str:
    """containerd's hosts.toml for a plain-HTTP registry at ``server`` (``HOST:PORT``): pull and
    resolve from it over http."""
    return f'server = "http://{server}"\n\n[host."http://{server}"]\n  capabilities = ["pull", "resolve"]\n'


def write_registry_hosts(node: NodeLayout, server: str) -> Path:
    """Let the node's containerd pull from the plain-HTTP registry ``server`` (``HOST:PORT``); it
    reads the file at each pull, no restart."""
    path = node.private("/etc/containerd") / Path(REGISTRY_HOSTS).relative_to("/etc/containerd") / server / "hosts.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(registry_hosts(server))
    return path


def write_containerd_config(node: NodeLayout, runc: Path, cni_bin: Path) -> Path:
    path = node.containerd_config
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomlkit.dumps(containerd_config(node, runc, cni_bin)))
    return path


def cni_conflist(node: NodeLayout) -> dict[str, Any]:
    """The cluster's private bridge holding the pods' gateway address (so kubelets reach pods:
    probes), no masquerade and no forwarding on the host: pods reach each other and the nodes only.
    Every node's pods are on the same bridge and subnet, each node handing out its own range of
    it, so a pod reaches another node's pods directly (no routing, no forwarding)."""
    start, end = node.pod_range
    return {
        "cniVersion": "1.0.0",
        "name": "mokka",
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.cluster.bridge,
                "isGateway": True,
                "isDefaultGateway": True,  # Services (10.96.0.0/16) are reached through the gateway
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.cluster.pod_subnet, "rangeStart": start, "rangeEnd": end}]],
                    "dataDir": str(node.cni / "ipam"),
                },
            },
        ],
    }


def write_cni_config(node: NodeLayout) -> Path:
    path = node.cni / "conf" / "10-mokka.conflist"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cni_conflist(node), indent=2))
    return path


def hosts(names: list[str]) -> str:
    """The control plane's /etc/hosts: every node name is this machine's loopback (each kubelet
    listens on a port of its own there; the API server reaches it by name)."""
    return "127.0.0.1 localhost " + " ".join(n for n in names if n != "localhost") + "\n::1 localhost\n"


def kube_proxy_argv(binary: Path, layout: Layout, first_node: str, healthz: int, metrics: int) -> list[str]:
    """One kube-proxy for the cluster's network namespace (every node's pods are in it): iptables
    rules there only; no conntrack sysctls (they are the host's, not the namespace's); Services'
    traffic masqueraded, so a pod behind a Service answers through the bridge's gateway."""
    return [
        str(binary),
        f"--kubeconfig={layout.kubeconfigs / 'kube-proxy.conf'}",
        f"--hostname-override={first_node}",
        f"--cluster-cidr={layout.pod_subnet}",
        "--proxy-mode=iptables",
        "--masquerade-all",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        f"--healthz-bind-address=127.0.0.1:{healthz}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        "--v=1",
    ]


def corefile(layout: Layout) -> str:
    """CoreDNS: the cluster's names from the API server (no upstream: the cluster has no way out)."""
    return (
        ".:53 {\n"
        "    errors\n"
        "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
        f"        kubeconfig {layout.admin_kubeconfig} mokka\n"
        "        pods insecure\n"
        "    }\n"
        "}\n"
    )


def dns_service(layout: Layout) -> tuple[dict[str, Any], dict[str, Any]]:
    """kube-system/kube-dns at DNS_SERVICE_IP, and its EndpointSlice: CoreDNS on the gateway address."""
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {"clusterIP": DNS_SERVICE_IP, "ports": [{**p, "targetPort": 53} for p in ports]},
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-mokka",
            "namespace": "kube-system",
            "labels": {"kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "mokka"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [layout.gateway], "conditions": {"ready": True}}],
        "ports": ports,
    }
    return service, endpoints
