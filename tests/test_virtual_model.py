"""The virtual pools' model (virtualfleet.pool, localcluster.addons.fgo): specs, what a node carries,
faults as the device plugin reports them. No cluster: the API side is in test_cluster_virtual."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpumodel import fleet, profile
from k8snode import deviceplugin
from localcluster.addons import fgo
from localcluster.addons.fgo import FgoSpec
from virtualfleet import faults as virtual_faults
from virtualfleet import pool as virtual
from virtualfleet.pool import Pool, VirtualSpec


def pool(profile_name: str = "h100", gpus: int = 8, count: int = 3, racked: bool = False) -> Pool:
    prof = profile.load(profile_name).with_count(gpus)
    return Pool(
        name=profile_name,
        spec=f"{profile_name}={count}",
        profile=prof.name,
        product=prof.gpu.name,
        gpus=gpus,
        count=count,
        labels={"nvidia.com/gpu.product": "X", **({virtual.CLIQUE_LABEL: "abc.7"} if racked else {})},
        per_gpu=deviceplugin.allocatable_by_gpu(prof, "none"),
        devices=[{"name": f"gpu-{i}", "attributes": {"uuid": {"string": "template"}}} for i in range(gpus)],
        racked=racked,
    )


def test_specs_parse_and_name_their_pools() -> None:
    assert VirtualSpec.parse("h100=1000") == VirtualSpec("h100", None, 1000)
    assert VirtualSpec.parse("h100=0").count == 0  # an empty pool (Karpenter, or nodes someone labels, fill it)
    assert VirtualSpec.parse("t4:4=200").pool == "t4-4"
    assert str(VirtualSpec.parse("t4:4=200")) == "t4:4=200"
    for bad, words in (
        ("h100", "PROFILE[:GPUS]=COUNT"),
        ("h100=x", "from 0"),
        ("h100:x=2", "GPU count"),
        ("=3", "PROFILE"),
    ):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            VirtualSpec.parse(bad)
    with pytest.raises(ValueError, match="at most"):
        virtual.check_total([VirtualSpec("h100", None, 6000), VirtualSpec("t4", None, 5000)])
    with pytest.raises(ValueError, match="given twice"):
        virtual.check_total([VirtualSpec("h100", None, 6), VirtualSpec("h100", None, 5)])


def test_a_node_body_is_kwoks_and_carries_the_gpus() -> None:
    body = virtual.node_body(pool(), 2)
    meta = body["metadata"]
    assert meta["name"] == "virtual-h100-2" and meta["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert meta["labels"]["type"] == "kwok" and meta["labels"]["mokka.io/virtual"] == "true"
    assert meta["labels"]["mokka.io/virtual-pool"] == "h100" and meta["labels"]["nvidia.com/gpu.product"] == "X"
    assert body["status"]["capacity"]["nvidia.com/gpu"] == "8" == body["status"]["allocatable"]["nvidia.com/gpu"]


def test_unhealthy_gpus_leave_allocatable_and_the_slice() -> None:
    p = pool()
    p.health["virtual-h100-1"] = virtual_faults.Health(unhealthy={"3": "Xid 79"})
    assert p.resources("virtual-h100-1", allocatable=True) == {"nvidia.com/gpu": "7"}
    assert p.resources("virtual-h100-1", allocatable=False) == {"nvidia.com/gpu": "8"}
    assert p.resources("virtual-h100-0", allocatable=True) == {"nvidia.com/gpu": "8"}
    devices = p.slice_devices("virtual-h100-1")
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in (0, 1, 2, 4, 5, 6, 7)]
    assert devices[0]["attributes"]["uuid"]["string"] == fleet.gpu_identity("h100", "virtual-h100-1", 0)[0]
    assert p.devices[0]["attributes"]["uuid"]["string"] == "template"  # the pool's own stay as they were


def test_every_virtual_gpu_has_its_own_uuid() -> None:
    p = pool(count=50)
    uuids = {d["attributes"]["uuid"]["string"] for n in p.nodes for d in p.slice_devices(n)}
    assert len(uuids) == 50 * 8


def test_racked_boards_get_one_clique_per_rack() -> None:
    p = pool("gb200", 4, count=40, racked=True)
    cliques = [p.node_labels(i)[virtual.CLIQUE_LABEL] for i in range(40)]
    assert len(set(cliques[:18])) == 1 and cliques[18] != cliques[0] and len(set(cliques)) == 3
    assert all(c.endswith(".7") for c in cliques)
    assert cliques[0].startswith(fleet.rack_cluster_uuid(p.rack(0) or ""))


def test_faults_map_to_what_the_device_plugin_reports() -> None:
    assert virtual_faults.fault_effect("xid", {"code": 79}) == ("unhealthy", "Xid 79")
    assert virtual_faults.fault_effect("xid", {"code": 13})[0] == "unchanged"
    assert virtual_faults.fault_effect("lost", {})[0] == "unhealthy"
    assert virtual_faults.fault_effect("ecc", {"uncorrected": 1})[0] == "unhealthy"
    assert virtual_faults.fault_effect("clear", {"all": False}) == ("healthy", "")
    assert virtual_faults.fault_effect("nvlink", {"link": 2, "state": "down"})[0] == "unchanged"
    assert virtual_faults.fault_effect("fabric", {"state": "in-progress"})[0] == "unchanged"
    with pytest.raises(ValueError, match="no NVML"):
        virtual_faults.fault_effect("temperature", {"celsius": 95})


def test_fgo_specs_topology_and_profiles() -> None:
    spec = FgoSpec.parse("big=h100:20")
    assert spec == FgoSpec("big", "h100", 20) and spec.nodes[0] == "fgo-big-0"
    for bad in ("big", "big=h100", "Big=h100:2", "big=nope:2", "big=h100:0"):
        with pytest.raises(ValueError):
            FgoSpec.parse(bad)
    topo = yaml.safe_load(fgo.topology([spec], "none")["data"]["topology.yml"])
    assert topo["nodePools"] == {"big": {"gpu": {"backend": "fake", "profile": "h100"}}}
    assert topo["nodePoolLabelKey"] == fgo.POOL_KEY
    cms = {cm["metadata"]["name"]: cm for cm in fgo.profile_configmaps()}
    assert set(cms) == {f"gpu-profile-{n}" for n in profile.builtin_names()}
    h100 = yaml.safe_load(cms["gpu-profile-h100"]["data"]["profile.yaml"])
    assert h100["device_defaults"]["name"] == "NVIDIA H100 80GB HBM3"
    assert cms["gpu-profile-h100"]["metadata"]["labels"]["fake-gpu-operator/gpu-profile"] == "true"


def test_the_chart_publishes_the_same_fgo_profiles() -> None:
    from pathlib import Path

    chart = Path(__file__).resolve().parent.parent / "charts" / "mokka" / "profiles"
    for cm in fgo.profile_configmaps():
        name = cm["metadata"]["name"].removeprefix("gpu-profile-")
        assert yaml.safe_load((chart / f"{name}.yaml").read_text()) == yaml.safe_load(cm["data"]["profile.yaml"])


def test_fgo_binaries_missing_say_where(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv(fgo.ENV_DIR, raising=False)
    with pytest.raises(fgo.FgoError, match=fgo.ENV_DIR):
        fgo.find_binaries(tmp_path)  # type: ignore[arg-type]
    monkeypatch.setenv(fgo.ENV_DIR, str(tmp_path))
    with pytest.raises(fgo.FgoError, match="no status-updater"):
        fgo.find_binaries(tmp_path)  # type: ignore[arg-type]


def test_a_pool_tells_its_own_node_names_from_others() -> None:
    p = pool()
    assert p.owns("virtual-h100-0") and p.owns("virtual-h100-17")
    assert not p.owns("virtual-h100-2-0")  # pool h100-2's
    assert not p.owns("provisioned-1") and not p.owns("virtual-h100-x")


def test_a_node_made_elsewhere_gets_the_body_of_its_place() -> None:
    p = pool("gb200", 4, count=1, racked=True)
    body = virtual.node_body(p, 1, "provisioned-1")
    assert body["metadata"]["name"] == "provisioned-1"
    assert body["metadata"]["labels"][virtual.CLIQUE_LABEL] == p.node_labels(1)[virtual.CLIQUE_LABEL]


def test_a_node_with_faults_says_which_gpus_are_unhealthy() -> None:
    p = pool()
    p.health["virtual-h100-1"] = virtual_faults.Health(unhealthy={"3": "Xid 79"})
    assert virtual.UNHEALTHY_ANNOTATION not in virtual.node_body(p, 0)["metadata"]["annotations"]
    assert virtual.node_body(p, 1)["metadata"]["annotations"][virtual.UNHEALTHY_ANNOTATION] == '{"3": "Xid 79"}'


def unhealthy_of(text: str, gpus: list[object]) -> dict[str, str]:
    return virtual_faults.health_of([("entry", text)], gpus).unhealthy


def test_a_fault_entry_is_read_as_the_device_plugin_shows_it() -> None:
    gpus = virtual_faults.node_gpus("h100", "NVIDIA H100 80GB HBM3", 8, "virtual-h100-1")
    entry = "steps: [{gpu: 3, xid: 79}, {gpu: [4, 5], xid: 13}, {gpu: 6, lost: true}, {gpu: 6, clear: true}]"
    assert unhealthy_of(entry, gpus) == {"3": "Xid 79"}
    uuid = gpus[2].uuid
    assert unhealthy_of(f"steps: [{{gpu: {uuid}, ecc: {{uncorrected: 1}}}}]", gpus) == {
        "2": "Xid 48 (double-bit ECC error)"
    }


def test_a_fault_entry_sets_the_health_agents_condition() -> None:
    """AcceleratedHardwareReady with the EKS node monitoring agent's reasons, also for what the
    device plugin does not watch (NVLink, the fabric); nvlink up, fabric healthy and clear undo."""
    gpus = virtual_faults.node_gpus("gb200", "NVIDIA GB200", 4, "virtual-gb200-0")
    healthy = virtual_faults.Health()
    assert not healthy and healthy.condition() == {
        "type": "AcceleratedHardwareReady",
        "status": "True",
        "reason": "NvidiaAcceleratedHardwareIsReady",
        "message": "Monitoring for the Nvidia AcceleratedHardware system is active",
    }
    entry = "steps: [{gpu: 2, nvlink: {link: 1, state: down}}, {gpu: 0, xid: 13}, {gpu: 1, xid: 94}]"
    h = virtual_faults.health_of([("entry", entry)], gpus)
    assert h.unhealthy == {"1": "Xid 94"}  # NVLink is not the device plugin's
    assert h.condition()["status"] == "False" and h.condition()["reason"] == "NvidiaXID94Error"
    assert h.condition()["message"] == "GPU 1: Xid 94; GPU 2: NVLink 1 down"
    up = entry.replace("]", ", {gpu: 2, nvlink: {link: 1, state: up}}, {gpu: 1, clear: true}]")
    assert not virtual_faults.health_of([("entry", up)], gpus)
    # a rack's entry first, then the node's own: the fabric probe on every GPU, so no clique
    rack = ("rack", "steps: [{fabric: {state: in-progress}}]")
    h = virtual_faults.health_of([rack], gpus)
    assert h.probing == ["0", "1", "2", "3"] and not h.clique(4)
    assert h.condition()["reason"] == "FabricManagerNotRunning"
    h = virtual_faults.health_of([rack, ("node", "steps: [{gpu: 3, fabric: {state: degraded}}]")], gpus)
    assert h.clique(4) and h.findings["3"] == [["NvidiaFabricError", "fabric bandwidth degraded"]]
    assert not virtual_faults.health_of([rack, ("node", "steps: [{fabric: {state: healthy}}]")], gpus)


def test_a_node_shows_its_health_in_labels_and_condition() -> None:
    p = pool("gb200", 4, count=4, racked=True)
    p.rack_gpus = 8  # 2 nodes a rack
    gpus = virtual_faults.node_gpus("gb200", "NVIDIA GB200", 4, "virtual-gb200-1")
    p.health["virtual-gb200-1"] = virtual_faults.health_of([("e", "steps: [{fabric: {state: in-progress}}]")], gpus)
    p.health["virtual-gb200-2"] = virtual_faults.Health(probing=["0"], findings={"0": [["R", "m"]]})
    bodies = [virtual.node_body(p, i) for i in range(4)]
    labels = [b["metadata"]["labels"] for b in bodies]
    assert [virtual.CLIQUE_LABEL in ls for ls in labels] == [True, False, True, True]
    assert [ls[virtual.RACK_LABEL] for ls in labels] == [p.rack(i) for i in range(4)]
    assert p.rack(0) == p.rack(1) != p.rack(2)
    conditions = [b["status"]["conditions"][0] for b in bodies]
    assert [(c["status"], c["reason"]) for c in conditions] == [
        ("True", "NvidiaAcceleratedHardwareIsReady"),
        ("False", "FabricManagerNotRunning"),
        ("False", "R"),
        ("True", "NvidiaAcceleratedHardwareIsReady"),
    ]
    assert all(virtual.shows(b, p.health_of(b["metadata"]["name"])) for b in bodies)
    assert not virtual.shows(bodies[0], p.health_of("virtual-gb200-2"))


def test_karpenter_config_gives_each_pool_an_instance_type_and_a_node_pool(tmp_path: Path) -> None:
    """`mokka karpenter-config`: the instance-types file and the objects `mokka cluster up --karpenter`
    uses too (virtualfleet.karpenter); bad input in one line, nothing written."""
    import json
    import subprocess
    import sys

    types = tmp_path / "types.json"
    argv = [sys.executable, "-m", "mokka.cli", "karpenter-config", "--types-out", str(types)]
    res = subprocess.run([*argv, "--pool", "h100=h100", "--pool", "small=t4:1"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    objects = list(yaml.safe_load_all(res.stdout))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("KWOKNodeClass", "mokka"), ("NodePool", "h100"), ("NodePool", "small")
    ]  # fmt: skip
    assert objects[2]["spec"]["template"]["metadata"]["labels"] == {virtual.POOL_LABEL: "small"}
    listed = {t["name"]: t for t in json.loads(types.read_text())}
    assert {n: t["resources"]["nvidia.com/gpu"] for n, t in listed.items()} == {"mokka-h100": "8", "mokka-small": "1"}
    offered = {r["key"]: r["values"] for r in listed["mokka-small"]["offerings"][0]["Requirements"]}
    assert offered[virtual.POOL_LABEL] == ["small"] and offered["nvidia.com/gpu.product"] == ["Tesla-T4"]
    assert listed["mokka-small"]["offerings"][0]["Price"] < listed["mokka-h100"]["offerings"][0]["Price"]
    types.unlink()
    for bad in ("h100", "H100=h100", "x=nope", "x=t4:y"):
        res = subprocess.run([*argv, "--pool", bad], capture_output=True, text=True)
        assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1 and "--pool" in res.stderr, bad
        assert not types.exists()
