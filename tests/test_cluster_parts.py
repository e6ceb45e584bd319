"""The local cluster's parts, without a cluster: the pinned Go builds' description, the components'
configuration (containerd's checked by containerd itself), the certificates, the private mount
namespace's union mounts, GFD's label file, the DMI names of the staged sysfs."""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from fetch import containerd_dist
from fetch.kube import binaries, gobuild, versions
from gpumodel import fleet, profile
from hostsetup import sysfs
from k8snode import gfd
from localcluster import config, pki
from localcluster.layout import MAX_NODES, PRIVATE_PATHS, Layout, NodePorts, Ports
from localcluster.nodespec import NodeSpec, resolve

LAYOUT = Layout(Path("/run/mokka-cluster"))
PORTS = Ports(2379, 2380, 6443)
NODE = LAYOUT.node("localhost", 0)
NODE_PORTS = NodePorts(10250, 10248, 8080)


def test_staging_replaces_read_from_kubernetes_go_mod() -> None:
    gomod = """module k8s.io/kubernetes

require (
\tk8s.io/api v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tgithub.com/other/thing => github.com/fork/thing v1.2.3
)

replace k8s.io/kubectl => ./staging/src/k8s.io/kubectl
"""
    assert gobuild.staging_replaces(gomod, "v0.34.4") == {
        "k8s.io/api": "v0.34.4",
        "k8s.io/client-go": "v0.34.4",
        "k8s.io/kubectl": "v0.34.4",
    }


def test_builds_are_pinned_and_keyed_by_what_they_build() -> None:
    assert "v0." + versions.KUBERNETES.removeprefix("v1.") == versions.KUBERNETES_STAGING
    k8s = binaries.KUBERNETES
    commands = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet", "kubectl")
    assert k8s.binaries == ("kubernetes", *commands)  # one program, a link per command
    assert k8s.main is not None and all(f'case "{c}":' in k8s.main.read_text() for c in commands)
    assert any(f"gitVersion={versions.KUBERNETES}" in flag for flag in k8s.ldflags)
    other = dataclasses.replace(k8s, ldflags=(*k8s.ldflags, "-X a.b=c"))
    assert other.key() != k8s.key() and other.key().startswith(f"kubernetes-{versions.KUBERNETES}-")
    assert binaries.DEVICE_PLUGIN.cgo and "nvidia-cdi-hook" in binaries.DEVICE_PLUGIN.binaries


def test_layout_names() -> None:
    assert len(LAYOUT.bridge) <= 15  # IFNAMSIZ
    assert ipaddress.ip_network(LAYOUT.pod_subnet).prefixlen == 24
    assert NODE.cgroup_root == f"/mokka-kube-{LAYOUT.tag}-0" != LAYOUT.node("t4-1", 1).cgroup_root
    assert Layout(Path("/tmp/other")).tag != LAYOUT.tag


def test_kubelet_stays_off_the_host() -> None:
    kubelet = config.kubelet_config(NODE, NODE_PORTS)
    assert kubelet["address"] == "127.0.0.1" and kubelet["readOnlyPort"] == 0
    assert kubelet["makeIPTablesUtilChains"] is False
    assert kubelet["protectKernelDefaults"] is False  # the sysctls it sets land in private files
    assert kubelet["cgroupRoot"] == NODE.cgroup_root and kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["failCgroupV1"] is False
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    cni = config.cni_conflist(NODE)
    bridge = cni["plugins"][0]
    assert bridge["isGateway"] is True and bridge["ipMasq"] is False  # forwarding: a private sysctl file
    assert [p["type"] for p in cni["plugins"]] == ["bridge"]
    assert set(PRIVATE_PATHS) >= {"/var/lib/kubelet", "/run/containerd", "/var/log/pods", "/var/run/nri"}
    assert "net/ipv4/ip_forward" in config.SYSCTLS


def test_control_plane_listens_inside_the_clusters_network_namespace_only() -> None:
    """The API server binds every address of the cluster's own network namespace (its loopback and
    the pods' bridge, whose gateway address it advertises for the `kubernetes` Service); the host
    reaches it only through the forwarder on its loopback. etcd stays on the namespace's loopback."""
    argv = config.apiserver_argv(Path("kube-apiserver"), LAYOUT, PORTS)
    assert "--bind-address=0.0.0.0" in argv and "--secure-port=6443" in argv
    assert f"--advertise-address={LAYOUT.gateway}" in argv
    assert ipaddress.ip_address(LAYOUT.gateway) in ipaddress.ip_network(LAYOUT.pod_subnet)
    etcd = config.etcd_argv(Path("etcd"), LAYOUT, PORTS)
    urls = [a.split("=", 1)[1] for a in etcd if a.startswith("--listen-") and "metrics" not in a]
    assert urls and all(u.startswith("http://127.0.0.1:") for u in urls)
    for component in (config.controller_manager_argv, config.scheduler_argv):
        assert "--secure-port=0" in component(Path("x"), LAYOUT)


def test_containerd_takes_every_key_of_its_config(tmp_path: Path) -> None:
    """containerd 2.1 itself parses the config (`config dump`) and keeps every value we set."""
    bindir = containerd_dist.fetch(versions.CONTAINERD)
    layout = Layout(tmp_path).node("localhost", 0)
    path = config.write_containerd_config(layout, Path("/usr/sbin/runc"), tmp_path / "cni-bin")
    res = subprocess.run(
        [str(bindir / "containerd"), "--config", str(path), "config", "dump"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    dumped = tomllib.loads(res.stdout)

    def leaves(d: dict[str, object], prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    got = leaves(dumped)
    wanted = leaves(config.containerd_config(layout, Path("/usr/sbin/runc"), tmp_path / "cni-bin"))
    assert {k: got.get(k) for k in wanted} == wanted


def test_certificates(tmp_path: Path) -> None:
    p = pki.Pki(tmp_path / "pki")
    p.generate()
    ca = x509.load_pem_x509_certificate(p.ca.read_bytes())
    server = x509.load_pem_x509_certificate(p.path("apiserver.crt").read_bytes())
    assert server.issuer == ca.subject
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert {"127.0.0.1", pki.SERVICE_IP} <= ips
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    kubelet = x509.load_pem_x509_certificate(p.path("kubelet-localhost.crt").read_bytes())
    assert kubelet.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:localhost"
    assert kubelet.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    assert oct(p.path("ca.key").stat().st_mode & 0o777) == "0o600"
    conf = p.kubeconfig("admin", "https://127.0.0.1:6443", tmp_path / "admin.conf")
    from kubernetes import config as kconfig

    api = kconfig.new_client_from_config(config_file=str(conf))
    assert api.configuration.host == "https://127.0.0.1:6443"


def test_gfd_label_file() -> None:
    text = "nvidia.com/gpu.count=8\nnvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n\nbroken line\n"
    assert gfd.parse_labels(text) == {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }


def test_staged_sysfs_names_the_machine() -> None:
    files = sysfs.files(profile.load("h100"))
    assert files[Path("sys/class/dmi/id/product_name")] == b"Mokka 8x NVIDIA H100 80GB HBM3\n"
    assert files[Path("sys/class/dmi/id/sys_vendor")] == b"Mokka\n"


@pytest.mark.root
def test_union_mounts_stay_inside_the_namespace(tmp_path: Path) -> None:
    """A missing target appears inside the namespace beside the parent's own entries (files,
    directories, symlinks); the host's directory is unchanged."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    parent = tmp_path / "parent"
    (parent / "dir").mkdir(parents=True)
    (parent / "dir" / "inner").write_text("inner")
    (parent / "file").write_text("file")
    (parent / "link").symlink_to("dir")
    source = tmp_path / "source"
    source.mkdir()
    (source / "new-file").write_text("new")
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"binds": [[str(source), str(parent / "added")]], "links": [["dir", str(parent / "alias")]]})
    )
    ready = tmp_path / "ns" / "ready"
    ready.parent.mkdir()
    argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "localcluster.namespace"]
    holder = subprocess.Popen([*argv, str(spec), str(ready)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        inside = ["nsenter", f"--mount=/proc/{holder.pid}/ns/mnt", "--"]
        ls = subprocess.run([*inside, "ls", str(parent)], capture_output=True, text=True, check=True).stdout.split()
        assert ls == ["added", "alias", "dir", "file", "link"]
        cat = [
            *inside,
            "cat",
            f"{parent}/added/new-file",
            f"{parent}/alias/inner",
            f"{parent}/link/inner",
            f"{parent}/file",
        ]
        assert subprocess.run(cat, capture_output=True, text=True, check=True).stdout == "newinnerinnerfile"
        # Written through the union: lands in the real directory
        subprocess.run([*inside, "sh", "-c", f"echo x > {parent}/dir/written"], check=True)
        assert (parent / "dir" / "written").read_text() == "x\n"
        assert sorted(p.name for p in parent.iterdir()) == ["dir", "file", "link"]
    finally:
        holder.terminate()
        holder.wait(10)
    assert str(parent) not in Path("/proc/self/mountinfo").read_text()


def test_a_killed_build_leaves_nothing_for_the_next(tmp_path: Path) -> None:
    dead = next(p for p in range(4_000_000, 4_100_000) if not Path(f"/proc/{p}").exists())
    root = gobuild.bin_root(tmp_path)
    spec = binaries.DEVICE_PLUGIN
    left = [root / f"{spec.key()}.tmp{dead}", root.parent / f"work-{spec.name}-{dead}"]
    live = root.parent / f"work-{spec.name}-{os.getpid()}"  # a build still running keeps its own
    for d in (*left, live):
        (d / "pkg").mkdir(parents=True)
        (d / "pkg").chmod(0o555)  # Go leaves its module cache read-only
    gobuild._sweep(spec, tmp_path)
    assert [d.exists() for d in left] == [False, False]
    assert live.exists()


def test_node_specs_parse_and_refuse_in_one_message() -> None:
    assert NodeSpec.parse("h100") == NodeSpec("h100", None, None)
    assert NodeSpec.parse("t4:2") == NodeSpec("t4", 2, None)
    assert NodeSpec.parse("gb200:4@rack-a") == NodeSpec("gb200", 4, "rack-a")
    assert str(NodeSpec.parse("gb200:4@rack-a")) == "gb200:4@rack-a"
    for bad, message in (
        ("", "expected PROFILE[:GPUS][@RACK]"),
        ("t4:x", "whole number from 1"),
        ("t4:0", "whole number from 1"),
        ("h100@", "no rack name after '@'"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            NodeSpec.parse(bad)


def test_fleet_nodes_are_named_by_position_with_gpus_of_their_own() -> None:
    nodes = resolve([NodeSpec("h100", 2, "r1"), NodeSpec("h100", 1, "r1"), NodeSpec("t4", 1)], fleet_names=True)
    assert [n.name for n in nodes] == ["h100-0", "h100-1", "t4-2"]
    assert [n.rack for n in nodes] == ["r1", "r1", None]
    uuids = [d.uuid for n in nodes for d in n.profile.devices()]
    assert len(set(uuids)) == len(uuids) == 4
    (single,) = resolve([NodeSpec("h100", 2)], fleet_names=False)
    assert single.name == "localhost"  # no --node: the profile's GPUs as they are
    assert [d.uuid for d in single.profile.devices()] == [d.uuid for d in profile.load("h100").with_count(2).devices()]
    with pytest.raises(ValueError, match="at most 8 real nodes"):
        resolve([NodeSpec("t4", 1)] * 9, fleet_names=True)


def test_gb200_nodes_fill_nvl72_racks_in_order() -> None:
    nodes = resolve([NodeSpec("gb200")] * 3 + [NodeSpec("gb200", None, "own")], fleet_names=True)
    assert [n.rack for n in nodes] == ["gb200-nvl72-0"] * 3 + ["own"]
    assert fleet.default_rack(profile.load("gb200"), 17) == "gb200-nvl72-0"  # 18 nodes of 4 GPUs: one domain
    assert fleet.default_rack(profile.load("gb200"), 18) == "gb200-nvl72-1"
    assert fleet.default_rack(profile.load("h100"), 0) is None  # not a rack board: no rack unless asked


def test_a_rack_is_one_fabric_domain() -> None:
    a = fleet.in_rack(profile.load("h100").with_count(2), "r1")
    b = fleet.in_rack(profile.load("b200"), "r1")
    c = fleet.in_rack(profile.load("h100"), "r2")
    fabrics = {
        (d.spec.fabric.state, d.spec.fabric.status, d.spec.fabric.cluster_uuid) for d in a.devices() + b.devices()
    }
    assert fabrics == {("Completed", "Success", fleet.rack_cluster_uuid("r1"))}
    assert {d.spec.fabric.cluster_uuid for d in c.devices()} == {fleet.rack_cluster_uuid("r2")}
    assert fleet.rack_cluster_uuid("r1") != fleet.rack_cluster_uuid("r2")
    with pytest.raises(profile.ProfileError, match="has no NVLink fabric"):
        fleet.in_rack(profile.load("l40s"), "r1")


def test_nodes_share_the_pod_subnet_in_ranges_of_their_own() -> None:
    ranges = [LAYOUT.node(f"n{i}", i).pod_range for i in range(MAX_NODES)]
    subnet = ipaddress.ip_network(LAYOUT.pod_subnet)
    addresses = [(int(ipaddress.ip_address(a)), int(ipaddress.ip_address(b))) for a, b in ranges]
    assert all(ipaddress.ip_address(a) in subnet and ipaddress.ip_address(b) in subnet for a, b in ranges)
    assert all(hi < lo2 for (_, hi), (lo2, _) in itertools.pairwise(addresses))  # disjoint, in order
    assert int(subnet[1]) < addresses[0][0]  # the gateway (the bridge) is no pod's
    bridge = config.cni_conflist(LAYOUT.node("t4-1", 1))["plugins"][0]
    assert bridge["bridge"] == LAYOUT.bridge and bridge["ipam"]["ranges"][0][0]["rangeStart"] == ranges[1][0]
    assert config.hosts(["localhost", "h100-0", "t4-1"]).splitlines()[0] == "127.0.0.1 localhost h100-0 t4-1"


def test_prune_keeps_only_the_current_cluster_builds(tmp_path: Path) -> None:
    root = gobuild.bin_root(tmp_path)
    current = root / binaries.COREDNS.key()
    old = root / f"{binaries.COREDNS.name}-v0.0.1-0123456789"
    other = root / "someone-else-v1-0123456789"
    for d in (current, old, other):
        d.mkdir(parents=True)
    assert gobuild.prune([binaries.COREDNS], tmp_path) == [old.name]
    assert sorted(p.name for p in root.iterdir()) == sorted([current.name, other.name])
