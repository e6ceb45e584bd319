"""Real kind on this machine: ``kind create cluster`` (podman provider) with the node image built here,
1 control plane + 3 workers as kind/cluster-containerd-2.yaml has them, every node Ready, then
``kind delete cluster`` and nothing left.

kind v0.33.0 (Go module proxy), Debian's podman 4.3 with bookworm's runc, the node image of
:mod:`kind.nodeimage` (Debian bookworm, systemd, Debian's containerd 2.1, the project's Kubernetes
v1.34 with kubeadm, the control-plane images preloaded), all run by :mod:`kind.provider` in private
network and mount namespaces with podman's state under one directory. After the delete: no podman
container or volume, and once the environment is closed no process, mount or cgroup of it, and the
host's network namespace (links, addresses, routes, iptables chains, forwarding sysctls) exactly as
before. Needs root and podman; kind, the Kubernetes build and the node image come from
``.ci/setup --tests`` (a missing one fails naming that command).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fetch import prepare, versions
from fetch.kube import binaries

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kind import nodeimage, provider  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (private namespaces, podman's private store)"),
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman is not installed (.ci/setup --tests installs it)"
    ),
]

NAME = "mokka"
CONFIG = REPO / "kind" / "cluster-containerd-2.yaml"
POOL = "run.ai/simulated-gpu-node-pool"
HOW = prepare.HOW


@pytest.fixture
def parts() -> dict[str, Path]:
    """kind, kubectl and the node image, as `.ci/setup --tests` left them (never built here)."""
    try:
        kind = prepare.go_binary(versions.KIND)
    except prepare.NotPrepared as exc:
        pytest.fail(str(exc))
    kube = binaries.cached()
    if kube is None:
        pytest.fail(f"the Kubernetes build is missing: {HOW}")
    try:
        image = nodeimage.cached()
    except nodeimage.ImageError as exc:
        pytest.fail(str(exc))
    if image is None:
        pytest.fail(f"kind's node image is not built: {HOW}")
    if not provider.dns_tools_cached():
        pytest.fail(f"the dnsname CNI plugin and dnsmasq for podman are not fetched: {HOW}")
    return {"kind": kind, "kubectl": kube.kubernetes / "kubectl", "image": image}


@pytest.fixture
def base() -> Iterator[Path]:
    # short: podman's sockets live below it (a Unix socket path has 108 bytes)
    path = Path(tempfile.mkdtemp(prefix="mokka-kind-", dir="/tmp"))
    yield path
    if path.exists() and not any(path.iterdir()):
        path.rmdir()


def test_kind_create_ready_delete_leaves_nothing(parts: dict[str, Path], base: Path) -> None:
    before = provider.host_state()
    env = provider.KindEnvironment(base, parts["kind"], parts["kubectl"])
    times: dict[str, float] = {}
    t = time.monotonic()

    def lap(what: str) -> None:
        nonlocal t
        times[what] = round(time.monotonic() - t, 1)
        t = time.monotonic()

    try:
        env.start()
        env.load_image(parts["image"], nodeimage.NODE_IMAGE)
        lap("podman load")
        config = base / "cluster.yaml"
        config.write_text(provider.cluster_config(CONFIG, nodeimage.NODE_IMAGE, nodeimage.etcd_image_tag()))
        created = env.kind("create", "cluster", "--name", NAME, "--config", str(config), check=False)
        assert created.returncode == 0, (created.stdout + created.stderr)[-3000:]
        assert len(env.record_containers()) == 4
        lap("kind create cluster")

        env.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=180s", timeout=200)
        lap("nodes Ready")
        columns = (
            "N:.metadata.name,V:.status.nodeInfo.kubeletVersion,R:.status.nodeInfo.containerRuntimeVersion,"
            "P:.metadata.labels.run\\.ai/simulated-gpu-node-pool"
        )
        nodes = env.kubectl("get", "nodes", "--no-headers", "-o", f"custom-columns={columns}").split("\n")
        rows = sorted(line.split() for line in nodes if line.strip())
        assert [r[0] for r in rows] == [f"{NAME}-control-plane", f"{NAME}-worker", f"{NAME}-worker2", f"{NAME}-worker3"]
        assert {r[1] for r in rows} == {"v1.34.4"}
        assert all(r[2].startswith("containerd://2.1.") for r in rows), rows
        assert sorted(r[3] for r in rows[1:]) == ["integration", "scale", "scale"]

        # what podman's CNI made lives in the private network namespace, not the host's
        inside = env.run(["ip", "-o", "link"]).stdout + env.run(["iptables-save"]).stdout
        assert "cni-podman" in inside and "CNI-" in inside
        links = provider.host_state()["links"]
        assert isinstance(links, list) and not any("cni-podman" in link for link in links)

        env.kind("delete", "cluster", "--name", NAME, timeout=180)
        lap("kind delete cluster")
        assert env.podman("ps", "--all", "--quiet").split() == []
        assert env.podman("volume", "ls", "--quiet").split() == []
        assert NAME not in env.kind("get", "clusters").stdout.split()
        # kind leaves its podman network (bridge, CNI chains, forwarding): close() removes it and
        # ends the namespace it lives in
        assert "kind" in env.podman("network", "ls", "--format", "{{.Name}}").split()
    finally:
        problems = env.close()
        lap("close (namespaces, cgroups, storage)")
        print(f"kind cluster timings (s): {times}")
    assert problems == []
    assert env.leftovers() == []
    after = provider.host_state()
    assert {k: after[k] for k in before if after[k] != before[k]} == {}, "the host's network namespace changed"
