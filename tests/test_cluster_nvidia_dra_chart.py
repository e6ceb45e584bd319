"""NVIDIA's DRA driver beside Mokka's chart, as a user installs them on a real cluster: Mokka's chart
(its DaemonSet from Mokka's node image) stages the node at its default root, /var/lib/mokka, and
runs the NRI plugin (allocator external) and the node labeller; NVIDIA's chart is installed as
usual with the values docs/guides/nvidia-dra.md gives (``nvidiaDriverRoot: /var/lib/mokka/driver``,
``altProcDevices: /var/lib/mokka/driver/proc/devices``). The node's profile is Mokka's chart's
``customProfile``: two H100s, the first in MIG mode (four MIG devices). The cluster runs no GPU
stack of its own. Skips where NVIDIA's binaries and chart are not at hand."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import claim_pod, install_chart, needs_nvidia_dra, start_cluster, wait_for
from mig_fixtures import mig_profile_data

from gpumodel import mig_state
from localcluster.addons import nvidia_dra
from localcluster.addons.nvidia_dra.install import install
from localcluster.cluster import Cluster

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    needs_nvidia_dra,
]

MOKKA_NS = "mokka-system"
MIXED = mig_profile_data(
    "h100",
    2,
    {1: {"mig": {"mode": False, "instances": []}}},
    mode=True,
    instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}, {"profile": "1g.10gb"}, {"profile": "1g.10gb"}],
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(
        tmp_path_factory.mktemp("nvidia-dra-chart"), profile="h100", gpus=2, allocator="none", nri_plugin=False
    ) as c:
        yield c


def get(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def installed(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Mokka's chart (its defaults: root /var/lib/mokka, node labels; the GPUs handed out by a DRA
    driver; the profile :data:`MIXED`), then NVIDIA's; the staged root as the host sees it."""
    from fetch import debcache, prepare, versions
    from fetch.kube import binaries

    values = {"gpu": {"customProfile": MIXED}, "plugin": {"allocator": "external"}}
    mokka = install_chart(cluster, MOKKA_NS, values, tmp_path_factory.mktemp("mokka-chart"))

    def staged() -> bool:
        ds = get(cluster, "daemonset", "-n", MOKKA_NS)["items"]
        return bool(ds) and ds[0]["status"].get("numberReady", 0) == 1

    wait_for("Mokka's DaemonSet Ready (the node staged at /var/lib/mokka)", staged, 180)
    bins = binaries.cached(None)
    assert bins is not None
    install(cluster, bins["nvidia-cdi-hook"], prepare.go_binary(versions.HELM), debcache.default_cache())
    yield cluster.node().layout.private("/var/lib/mokka")  # /var/lib/mokka in the node's namespace
    cluster.kubectl("delete", "namespace", nvidia_dra.NAMESPACE, "--wait=false", check=False)
    cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=mokka, check=False)


def test_nvidias_plugins_run_on_the_node_mokkas_chart_staged(cluster: Cluster, installed: Path) -> None:
    """The staged root's driver/ is a whole driver root (usr, dev, proc); NVIDIA's kubelet plugins
    (placed by the node label Mokka's chart sets) publish the node's whole GPU, the MIG devices of
    the GPU in MIG mode (their profiles and UUIDs the mock's), and its IMEX devices."""
    driver = installed / "driver"
    assert (driver / "usr" / "bin" / "nvidia-smi").is_file() and (driver / "dev" / "nvidia1").is_char_device()
    assert "nvidia-caps-imex-channels" in (driver / "proc" / "devices").read_text()
    node = get(cluster, "node", cluster.node_name)
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"  # Mokka's node labeller
    slices = get(cluster, "resourceslices")["items"]
    devices = {driver: [d for s in slices if s["spec"]["driver"] == driver for d in s["spec"]["devices"]]
               for driver in (nvidia_dra.GPU_DRIVER, nvidia_dra.COMPUTE_DOMAIN_DRIVER)}  # fmt: skip
    layout = mig_state.read(installed / "driver" / "usr" / "lib64" / "libnvidia-ml.so.1")
    staged = {g.uuid: "gpu" for g in layout if not g.current}
    staged |= {d.uuid: f"mig {d.profile}" for g in layout if g.current for d in g.devices}

    def kind(attributes: dict[str, Any]) -> str:
        profile = attributes.get("profile", {}).get("string")
        return attributes["type"]["string"] + (f" {profile}" if profile else "")

    published = {d["attributes"]["uuid"]["string"]: kind(d["attributes"]) for d in devices[nvidia_dra.GPU_DRIVER]}
    assert published == staged
    assert sorted(staged.values()) == ["gpu", "mig 1g.10gb", "mig 1g.10gb", "mig 2g.20gb", "mig 3g.40gb"]
    assert {"channel-0", "daemon-0"} <= {d["name"] for d in devices[nvidia_dra.COMPUTE_DOMAIN_DRIVER]}


def test_a_claim_pod_runs_with_its_gpu_through_both_charts(cluster: Cluster, installed: Path) -> None:
    """NVIDIA's CDI spec gives the pod its GPU (the whole one: DeviceClass gpu.nvidia.com) from the
    staged driver root; Mokka's NRI plugin adds the kernel's view."""
    cluster.kubectl("apply", "-f", "-", input=claim_pod("both"))
    try:

        def logged() -> str | None:
            out = cluster.kubectl("logs", "both", check=False).stdout
            return out if "devices:" in out else None

        out = wait_for("pod both Running with its GPU", logged, 120)
        assert len(re.findall(r"^GPU \d+: NVIDIA H100 80GB HBM3", out, re.M)) == 1, out
        assert len(out.split("devices:", 1)[1].split()) == 1, out
        pods = get(cluster, "pods", "-n", MOKKA_NS)["items"]
        log = cluster.kubectl("logs", "-n", MOKKA_NS, pods[0]["metadata"]["name"], "-c", "nri-plugin").stdout
        assert "default/both/probe: GPUs" in log and "the driver at /usr/lib64/libnvidia-ml.so." in log, log[-2000:]
    finally:
        cluster.kubectl("delete", "pod", "both", "--wait=false", check=False)
        cluster.kubectl("delete", "resourceclaimtemplate", "both", check=False)
