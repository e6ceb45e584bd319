"""InfiniBand between pods on two nodes of the local cluster: each pod claims one adapter of its node
from Mokka's DRA driver (``nic.mokka.io``: its /dev/infiniband nodes, the node's tree and the shim,
and the subnet's relay directory) and runs Debian's infiniband-diags and ibverbs-utils unmodified.
``ibping -S`` in one pod answers ``ibping`` from the other node's pod; every tool reads the pod's
adapter and the subnet of both nodes from a pod; a ping to a LID nobody serves goes unanswered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster_fixtures import claim_pod, start_cluster, wait_for

from localcluster.cluster import Cluster
from localcluster.nodespec import NodeSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

SPECS = (NodeSpec("h100", 1), NodeSpec("h100", 1))  # one GPU, one ConnectX-7 each
NODES = ("h100-0", "h100-1")
IMAGE = "localhost/mokka/ib-diags:1"
ONE_ADAPTER = "{requests: [{name: nic, exactly: {deviceClassName: nic.mokka.io}}]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    import rdma_image

    from gpumodel import native

    with start_cluster(tmp_path_factory.mktemp("ib-cluster"), nodes=SPECS, allocator="dra") as c:
        shim = native.library_path(native.SYSFS_SHIM)  # the adapters' CDI device mounts it
        archive = rdma_image.build(tmp_path_factory.mktemp("image"), IMAGE, list(TOOLS), mounted=[shim])
        c.import_image(archive)
        yield c


def lid_of(cluster: Cluster, node: str) -> int:
    """The LID the subnet manager gave the node's adapter port (its staged tree)."""
    path = cluster.node(node).layout.node_root / "sys/class/infiniband/mlx5_0/ports/1/lid"
    return int(path.read_text(), 16)


def adapter_pod(cluster: Cluster, name: str, node: str, script: str) -> None:
    """Pod ``name`` on ``node``, one adapter of it claimed, running ``script``."""
    docs = list(yaml.safe_load_all(claim_pod(name, probe=script, devices=ONE_ADAPTER, image=IMAGE)))
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def pod(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pod", name, "-o", "json").stdout))


def logs(cluster: Cluster, name: str) -> str:
    return cluster.kubectl("logs", name, check=False).stdout


def finished(cluster: Cluster, name: str, timeout: float = 120) -> str:
    def phase() -> str | None:
        got = pod(cluster, name)["status"].get("phase")
        return got if got in ("Succeeded", "Failed") else None

    phase_ = wait_for(f"pod {name} finished", phase, timeout)
    out = logs(cluster, name)
    assert phase_ == "Succeeded", out
    return out


def delete(cluster: Cluster, *names: str) -> None:
    for name in names:
        cluster.kubectl("delete", "pod", name, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceclaimtemplate", name, check=False)


def test_ibping_between_pods_on_two_nodes(cluster: Cluster) -> None:
    server_lid = lid_of(cluster, NODES[0])
    adapter_pod(cluster, "pong", NODES[0], "exec ibping -S")
    adapter_pod(cluster, "ping", NODES[1], f"sleep 2; ibping -c 3 {server_lid}")
    try:
        wait_for("pod pong Running", lambda: pod(cluster, "pong")["status"].get("phase") == "Running", 120)
        out = finished(cluster, "ping")
        pongs = [line for line in out.splitlines() if line.startswith("Pong from pong")]
        assert len(pongs) == 3 and all(f"(Lid {server_lid})" in p for p in pongs), out
        assert "3 packets transmitted, 3 received, 0% packet loss" in out, out
        assert pod(cluster, "pong")["spec"]["nodeName"] == NODES[0]
        assert pod(cluster, "ping")["spec"]["nodeName"] == NODES[1]
    finally:
        delete(cluster, "pong", "ping")


TOOLS = ("ibstat", "ibstatus", "ibv_devices", "ibv_devinfo", "perfquery", "ibaddr", "sminfo", "ibnetdiscover",
         "iblinkinfo", "ibping")  # fmt: skip


def test_every_tool_in_a_pod_and_a_ping_nobody_answers(cluster: Cluster) -> None:
    """Debian's tools in a pod given one adapter of h100-1: its own adapter from its files and its
    port's agents, the subnet with the other node's adapter behind the rails' switches; a ping to
    its own LID, where no ibping -S runs, is lost as on a fabric without the server."""
    own = lid_of(cluster, NODES[1])
    # ibstatus is a shell script: on the image's dynamically linked dash, as in a Debian image (the
    # image's static busybox is out of any LD_PRELOAD's reach)
    commands = [
        "ibstat",
        "dash /usr/sbin/ibstatus",
        "ibv_devices",
        "ibv_devinfo -v",
        "perfquery -x",
        "ibaddr",
        "sminfo",
    ]
    commands += ["ibnetdiscover -p", "iblinkinfo -l", f"ibping -c 1 -t 200 {own}"]
    script = "; ".join(f"echo '== {cmd}'; {cmd}" for cmd in commands)
    adapter_pod(cluster, "tools", NODES[1], script + "; true")
    try:
        out = finished(cluster, "tools")
        part = {chunk.split("\n", 1)[0]: chunk.split("\n", 1)[1] for chunk in out.split("== ")[1:]}
        assert "CA 'mlx5_0'" in part["ibstat"] and "State: Active" in part["ibstat"], out
        assert "Infiniband device 'mlx5_0' port 1 status:" in part["dash /usr/sbin/ibstatus"], out
        assert [ln.split()[0] for ln in part["ibv_devices"].splitlines()[2:] if ln.strip()] == ["mlx5_0"], out
        assert "hca_id:\tmlx5_0" in part["ibv_devinfo -v"] and "PORT_ACTIVE" in part["ibv_devinfo -v"], out
        assert f"# Port extended counters: Lid {own} port 1" in part["perfquery -x"], out
        assert f"LID start 0x{own:x} end 0x{own:x}" in part["ibaddr"], out
        assert part["sminfo"].startswith("sminfo: sm lid 1 "), out
        cas = sorted(ln.split("'")[1] for ln in part["ibnetdiscover -p"].splitlines() if ln.startswith("CA "))
        assert cas == [f"{n} mlx5_0" for n in NODES], out
        assert "spine" in part["iblinkinfo -l"], out
        assert "1 packets transmitted, 0 received, 100% packet loss" in part[f"ibping -c 1 -t 200 {own}"], out
    finally:
        delete(cluster, "tools")
