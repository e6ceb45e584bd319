"""The DRA kubelet plugin without a cluster: GPU facts through the mock NVML, the ResourceSlice and
DeviceClass against the Kubernetes schema, claim bookkeeping, and both gRPC services driven by a
real grpclib client over unix sockets with the bindings compiled from kubelet's own protos.

The cluster tests (a real kubelet, scheduler and containerd) are in ``test_e2e_dra.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Staged

from fetch import kubelet_api
from hostsetup import sysfs
from k8snode.dra import gpus, nics, resources
from k8snode.dra.claims import Checkpoint, Claim, ClaimError, Claims, checkpoint_path

REPO = Path(__file__).resolve().parent.parent
NODE = "node-a"
DRIVER = "gpu.nvidia.com"
KIND = "nvidia.com/gpu"


@pytest.fixture(scope="module", autouse=True)
def bindings() -> None:
    """The kubelet API bindings, compiled from k8s.io/kubelet's protos by the setup, never by a test."""
    if not kubelet_api.current():
        pytest.fail(
            f"{kubelet_api.OUT} is missing or stale: run `.ci/setup --tests` (or `python -m fetch.kubelet_api`)"
        )


@pytest.fixture(scope="module")
def staged(stage: Callable[..., Staged]) -> Staged:
    return stage("h100", 4)


@pytest.fixture(scope="module")
def tree(staged: Staged, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sysfs")
    sysfs.write_tree(staged.profile, root)
    return root / "sys"


@pytest.fixture(scope="module")
def info(staged: Staged, tree: Path) -> gpus.GpuInfo:
    return gpus.read(staged.libdir / "libnvidia-ml.so.1", tree)


# ---- GPU facts -------------------------------------------------------------------------------


def test_gpus_are_what_nvml_says(staged: Staged, info: gpus.GpuInfo) -> None:
    prof = staged.profile
    devices = prof.devices()
    assert info.driver_version == prof.driver.version
    assert info.cuda_driver_version == prof.driver.cuda
    assert [g.uuid for g in info.gpus] == [d.uuid for d in devices]
    assert [g.device_name for g in info.gpus] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    g = info.gpus[0]
    assert g.product_name == prof.gpu.name == "NVIDIA H100 80GB HBM3"
    assert (g.architecture, g.brand, g.addressing_mode) == ("Hopper", "Nvidia", "None")
    assert g.cuda_compute_capability == prof.gpu.compute_capability == "9.0"
    assert g.memory_bytes == prof.gpu.memory.total_mib * 1024 * 1024
    assert [g.pcie_bus_id for g in info.gpus] == [gpus.bus_id(d.bus_id) for d in devices]


def test_the_node_view_ignores_a_containers_filter(staged: Staged, tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("MOKKA_IGNORE_DEVICE_NODES", raising=False)
    info = gpus.read(staged.libdir / "libnvidia-ml.so.1", tree)
    assert len(info.gpus) == 4
    assert os.environ["NVIDIA_VISIBLE_DEVICES"] == "1"  # the process environment is left as it was
    assert "MOKKA_IGNORE_DEVICE_NODES" not in os.environ


def test_a_lost_gpu_is_left_out(tmp_path: Path) -> None:
    from gpumodel import driver_root, profile

    prof = profile.load("h100").with_count(3)
    data = prof.model_dump(mode="json")
    data["gpus"] = {1: {"lost": True}}
    staged = driver_root.stage(profile.Profile.model_validate(data), tmp_path)
    info = gpus.read(staged.libdir / "libnvidia-ml.so.1", tmp_path)
    assert [g.device_name for g in info.gpus] == ["gpu-0", "gpu-2"]
    assert info.lost == (1,)


def test_pcie_root_follows_the_sysfs_link(info: gpus.GpuInfo, tree: Path) -> None:
    for g in info.gpus:
        parts = Path(os.readlink(tree / "bus" / "pci" / "devices" / g.pcie_bus_id)).parts
        assert g.pcie_root == parts[parts.index("devices") + 1]  # ../../../devices/<root>/[bridges/]<bus id>
        assert g.pcie_root.startswith("pci0000:")


def test_pcie_root_absent_without_a_link(tmp_path: Path) -> None:
    assert gpus.pcie_root("0000:53:00.0", tmp_path) is None
    assert gpus.pcie_root("not-a-bus-id", tmp_path) is None
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    os.symlink("/elsewhere/0000:53:00.0", tmp_path / "bus" / "pci" / "devices" / "0000:53:00.0")
    assert gpus.pcie_root("0000:53:00.0", tmp_path) is None


def test_bus_id_as_go_nvlib_writes_it() -> None:
    assert gpus.bus_id("00000000:53:00.0") == "0000:53:00.0"
    assert gpus.bus_id("00000000:9A:00.0") == "0000:9a:00.0"
    assert gpus.bus_id("0001:9a:00.0") == "0001:9a:00.0"


# ---- ResourceSlice and DeviceClass ------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "published"),
    [("550.163.01", "550.163.1"), ("9.0", "9.0.0"), ("12.4", "12.4.0"), ("580.82.07", "580.82.7"), ("10", "10.0.0")],
)
def test_versions_as_masterminds_semver_prints_them(given: str, published: str) -> None:
    assert resources.semver(given) == published


def test_semver_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        resources.semver("five")


@pytest.mark.parametrize(
    ("n", "text"), [(81559 << 20, "81559Mi"), (80 << 30, "80Gi"), (1536, "1536"), (3 << 10, "3Ki"), (1 << 40, "1Ti")]
)
def test_memory_as_a_binary_quantity(n: int, text: str) -> None:
    assert resources.quantity(n) == text


def gpu_slice(info: gpus.GpuInfo, owner_uid: str | None = None) -> dict[str, Any]:
    """The slice the plugin publishes for ``info``'s GPUs (``Cluster.publish``)."""
    inventory = resources.gpu_inventory(info, cdi_kind=KIND)
    return resources.slice_of(list(inventory.devices), NODE, driver=inventory.driver, owner_uid=owner_uid)


def test_slice_has_nvidias_names_and_types(staged: Staged, info: gpus.GpuInfo) -> None:
    obj = gpu_slice(info, owner_uid="1234")
    spec = obj["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        DRIVER,
        NODE,
        {"name": NODE, "generation": 1, "resourceSliceCount": 1},
    )
    assert obj["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": "1234",
        "controller": True,
    }
    dev = spec["devices"][2]
    assert dev["name"] == "gpu-2"
    attrs = dev["attributes"]
    kinds = {name: next(iter(value)) for name, value in attrs.items()}
    assert kinds == {
        "type": "string",
        "uuid": "string",
        "index": "int",
        "minor": "int",
        "productName": "string",
        "brand": "string",
        "architecture": "string",
        "cudaComputeCapability": "version",
        "driverVersion": "version",
        "cudaDriverVersion": "version",
        "pcieBusID": "string",
        "addressingMode": "string",
        "resource.kubernetes.io/pcieRoot": "string",
    }
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["index"] == attrs["minor"] == {"int": 2}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    driver = staged.profile.driver  # e.g. 580.105.08 / 13.0: published as 580.105.8 / 13.0.0
    assert attrs["driverVersion"] == {"version": ".".join(str(int(p)) for p in driver.version.split("."))}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["cudaDriverVersion"] == {"version": f"{driver.cuda}.0"}
    assert dev["capacity"] == {"memory": {"value": "81559Mi"}}


def test_slice_and_device_class_pass_the_kubernetes_schema(info: gpus.GpuInfo) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for obj in (gpu_slice(info), resources.device_class()):
        obj = json.loads(json.dumps(obj))
        if "generateName" in obj["metadata"]:
            obj["metadata"]["name"] = obj["metadata"].pop("generateName") + "x"
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_device_class_is_nvidias() -> None:
    dc = resources.device_class()
    assert dc["metadata"]["name"] == DRIVER
    assert dc["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
            }
        }
    ]


# ---- claims ------------------------------------------------------------------------------------


def claim_object(claim: Claim, *results: dict[str, Any]) -> dict[str, Any]:
    """A ResourceClaim as the API server returns it after the scheduler allocated ``results``."""
    return {
        "metadata": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(
    device: str, request: str = "gpu", *, pool: str = NODE, driver: str = DRIVER, **extra: Any
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


class ApiClaims:
    """The ResourceClaims the API server holds, read as the plugin reads them (namespace, name)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, claim: Claim, *results: dict[str, Any]) -> None:
        self.objects[(claim.namespace, claim.name)] = claim_object(claim, *results)

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return self.objects.get((namespace, name))


@pytest.fixture
def spec_file(tmp_path: Path, info: gpus.GpuInfo) -> Path:
    path = tmp_path / "cdi" / "nvidia.com-gpu.json"
    path.parent.mkdir()
    devices = [{"name": str(g.index)} for g in info.gpus] + [{"name": g.uuid} for g in info.gpus]
    path.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": KIND, "devices": devices}))
    return path


def make_claims(tmp_path: Path, info: gpus.GpuInfo, api: ApiClaims, spec: Path | None) -> Claims:
    return Claims(
        driver=DRIVER,
        pool=NODE,
        cdi_ids=resources.gpu_inventory(info, cdi_kind=KIND).cdi_ids,
        checkpoint=Checkpoint.load(checkpoint_path(tmp_path / "plugin"), DRIVER),
        read_claim=api.read,
        cdi_spec=spec,
    )


def test_prepare_answers_cdi_ids_by_uuid_and_checkpoints(tmp_path: Path, info: gpus.GpuInfo, spec_file: Path) -> None:
    api = ApiClaims()
    c = Claim("ns", "pod-gpu", "uid-1")
    api.add(c, result("gpu-1"), result("gpu-3", "second"))
    claims = make_claims(tmp_path, info, api, spec_file)
    devices = claims.prepare(c)
    assert [(d.device, d.requests, d.cdi_ids) for d in devices] == [
        ("gpu-1", ("gpu",), (f"{KIND}={info.gpus[1].uuid}",)),
        ("gpu-3", ("second",), (f"{KIND}={info.gpus[3].uuid}",)),
    ]
    saved = json.loads(checkpoint_path(tmp_path / "plugin").read_text())
    assert saved["claims"]["uid-1"]["devices"][0]["cdiDeviceIDs"] == [f"{KIND}={info.gpus[1].uuid}"]
    assert stat.S_IMODE(checkpoint_path(tmp_path / "plugin").stat().st_mode) == 0o600


def test_prepare_twice_and_after_a_restart_gives_the_same_answer_without_asking_again(
    tmp_path: Path, info: gpus.GpuInfo, spec_file: Path
) -> None:
    api = ApiClaims()
    c = Claim("ns", "pod-gpu", "uid-1")
    api.add(c, result("gpu-2"))
    first = make_claims(tmp_path, info, api, spec_file).prepare(c)
    assert api.reads == 1
    again = make_claims(tmp_path, info, api, spec_file)  # a restarted plugin: the checkpoint answers
    del api.objects[("ns", "pod-gpu")]
    assert again.prepare(c) == first
    assert again.prepare(c) == first
    assert api.reads == 1


def test_unprepare_is_idempotent(tmp_path: Path, info: gpus.GpuInfo, spec_file: Path) -> None:
    api = ApiClaims()
    c = Claim("ns", "pod-gpu", "uid-1")
    api.add(c, result("gpu-0"))
    claims = make_claims(tmp_path, info, api, spec_file)
    claims.prepare(c)
    claims.unprepare(c)
    claims.unprepare(c)
    make_claims(tmp_path, info, api, spec_file).unprepare(c)
    assert json.loads(checkpoint_path(tmp_path / "plugin").read_text())["claims"] == {}
    claims.unprepare(Claim("ns", "never-seen", "uid-x"))


def test_two_claims_never_share_a_gpu(tmp_path: Path, info: gpus.GpuInfo, spec_file: Path) -> None:
    api = ApiClaims()
    a, b, admin = Claim("ns", "a", "uid-a"), Claim("ns", "b", "uid-b"), Claim("ns", "admin", "uid-admin")
    api.add(a, result("gpu-1"))
    api.add(b, result("gpu-1"))
    api.add(admin, result("gpu-1", adminAccess=True))
    claims = make_claims(tmp_path, info, api, spec_file)
    claims.prepare(a)
    with pytest.raises(ClaimError, match=r"gpu-1 is already prepared for ResourceClaim ns/a"):
        claims.prepare(b)
    assert claims.prepare(admin)[0].admin_access  # admin access (monitoring) may look at a GPU in use
    claims.unprepare(a)
    assert claims.prepare(b)[0].device == "gpu-1"


def test_a_device_whose_claim_is_gone_is_prepared_for_the_next(
    tmp_path: Path, info: gpus.GpuInfo, spec_file: Path
) -> None:
    """The scheduler hands a GPU on once its claim is deleted or deallocated, before kubelet asks to
    unprepare the old claim (it does once the old pod's containers are gone): the new claim gets it
    at once, not after kubelet's back-off; a later Unprepare of the old one changes nothing of it."""
    api = ApiClaims()
    old, new, late = Claim("ns", "old", "uid-old"), Claim("ns", "new", "uid-new"), Claim("ns", "late", "uid-late")
    api.add(old, result("gpu-1"))
    claims = make_claims(tmp_path, info, api, spec_file)
    claims.prepare(old)
    del api.objects[("ns", "old")]  # deleted in the API; kubelet's Unprepare still to come
    api.add(new, result("gpu-1"))
    assert claims.prepare(new)[0].device == "gpu-1"
    api.add(late, result("gpu-1"))
    with pytest.raises(ClaimError, match=r"gpu-1 is already prepared for ResourceClaim ns/new"):
        claims.prepare(late)  # ns/new does hold it
    api.objects[("ns", "new")]["status"] = {}  # deallocated
    assert claims.prepare(late)[0].device == "gpu-1"
    claims.unprepare(old)
    assert set(claims.prepared()) == {"uid-new", "uid-late"}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, "ResourceClaim ns/c not found"),
        ({"metadata": {"uid": "other"}}, "has UID other, kubelet asked for uid-c"),
        ({"metadata": {"uid": "uid-c"}, "status": {}}, "is not allocated"),
        (claim_object(Claim("ns", "c", "uid-c"), result("gpu-0", driver="other.example.com")), "no device of driver"),
        (claim_object(Claim("ns", "c", "uid-c"), result("gpu-0", pool="node-b")), "is in pool node-b"),
        (claim_object(Claim("ns", "c", "uid-c"), result("gpu-9")), r"no device gpu-9 on this node \(it has gpu-0"),
    ],
)
def test_prepare_refuses_with_the_reason(
    tmp_path: Path, info: gpus.GpuInfo, spec_file: Path, obj: dict[str, Any] | None, message: str
) -> None:
    claims = make_claims(tmp_path, info, ApiClaims(), spec_file)
    claims.read_claim = lambda _ns, _name: obj
    with pytest.raises(ClaimError, match=message):
        claims.prepare(Claim("ns", "c", "uid-c"))
    assert claims.prepared() == {}


def test_prepare_refuses_devices_the_cdi_spec_lacks(tmp_path: Path, info: gpus.GpuInfo) -> None:
    api = ApiClaims()
    c = Claim("ns", "c", "uid-c")
    api.add(c, result("gpu-0"))
    missing = tmp_path / "none.json"
    with pytest.raises(ClaimError, match=r"cannot read CDI spec .*none.json.*mokka cdi generate"):
        make_claims(tmp_path, info, api, missing).prepare(c)
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"kind": KIND, "devices": [{"name": "0"}]}))
    with pytest.raises(ClaimError, match=rf"has no device {KIND}={info.gpus[0].uuid}"):
        make_claims(tmp_path, info, api, stale).prepare(c)


def test_a_broken_checkpoint_is_an_error_not_a_reset(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("{not json")
    with pytest.raises(ClaimError, match="cannot read checkpoint"):
        Checkpoint.load(path, DRIVER)
    path.write_text(json.dumps({"version": 1, "driver": "other.example.com", "claims": {}}))
    with pytest.raises(ClaimError, match=r"of driver 'other\.example\.com'"):
        Checkpoint.load(path, DRIVER)


# ---- the kubelet's own definitions ------------------------------------------------------------


def test_registration_names_are_the_kubelets() -> None:
    """PluginInfo's type and the services listed as versions are k8s.io/kubelet's own constants."""
    from k8snode.dra import api, service

    kubelet = kubelet_api.module_dir(*kubelet_api.KUBELET_MODULE)
    assert kubelet is not None, "k8s.io/kubelet is not in the module cache: run .ci/setup --tests"
    constants = (kubelet / "pkg/apis/pluginregistration/v1/constants.go").read_text()
    assert f'DRAPlugin = "{service.PLUGIN_TYPE}"' in constants
    for version, module in api.DRA_SERVICES:
        package = version.split(".")[0]
        types = (kubelet / f"pkg/apis/dra/{package}/types.go").read_text()
        assert re.search(rf'DRAPluginService = "{re.escape(version)}"', types), package
        assert f"k8s.io.kubelet.pkg.apis.dra.{package}.DRAPlugin/NodePrepareResources" in "".join(
            module.DraPluginBase().__mapping__()
        )


# ---- gRPC: a real grpclib client over unix sockets ---------------------------------------------


class ApiServer:
    """What the plugin asks of the API server at start, answered from memory for these tests."""

    def __init__(self, api: ApiClaims) -> None:
        self.api = api
        self.published: list[resources.Inventory] = []

    def publish(self, inventory: resources.Inventory) -> str:
        self.published.append(inventory)
        return "slice"

    def ensure_device_class(self, body: dict[str, Any]) -> bool:
        return False

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api.read(namespace, name)


@pytest.fixture
def node_root(staged: Staged, tmp_path: Path, tree: Path) -> Path:
    """A node.json naming the staged library, as host setup writes it."""
    from gpumodel.nodelayout import GpuNode, NodeLayout

    devices = staged.profile.devices()
    layout = NodeLayout(
        root=str(tree.parent),
        profile="h100",
        driver_version=staged.profile.driver.version,
        libdir=str(staged.libdir),
        state=str(staged.root.state),
        dev_root=str(tmp_path / "dev"),
        gpu_major=195,
        uvm_major=510,
        gpus=tuple(GpuNode(d.index, d.uuid, d.bus_id, d.index) for d in devices),
    )
    root = tmp_path / "mokka"
    root.mkdir()
    (root / "node.json").write_text(layout.to_json())
    return root


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """A kubelet directory with a short path: a unix socket path has at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_services_over_unix_sockets(node_root: Path, kubelet_dir: Path, spec_file: Path, info: gpus.GpuInfo) -> None:
    from grpclib.client import Channel

    from k8snode.dra import api
    from k8snode.dra.plugin import Config, start

    claims_api = ApiClaims()
    one, two = Claim("ns", "one", "uid-1"), Claim("ns", "two", "uid-2")
    claims_api.add(one, result("gpu-3"))
    claims_api.add(two, result("gpu-3"))  # the scheduler would never: the plugin refuses it
    config = Config(root=node_root, node=NODE, kubelet_dir=kubelet_dir, cdi_spec=spec_file)
    (kubelet_dir / "plugins_registry").mkdir()
    stale = config.registration_socket
    stale.write_text("left over by a killed plugin")

    async def scenario() -> None:
        server = ApiServer(claims_api)
        running = await start(config, cluster=server)  # type: ignore[arg-type]  # API calls answered from memory
        assert server.published and list(server.published[0].devices) == [resources.device(g, info) for g in info.gpus]
        assert stat.S_ISSOCK(config.registration_socket.stat().st_mode)
        assert stat.S_ISSOCK(config.dra_socket.stat().st_mode)
        assert config.dra_socket.parent == kubelet_dir / "plugins" / DRIVER
        assert not [p for p in config.dra_socket.parent.iterdir() if p.name.startswith(".")]
        try:
            reg_channel = Channel(path=str(config.registration_socket))
            reg = api.registration.RegistrationStub(reg_channel)
            got = await reg.get_info(api.registration.InfoRequest())
            assert (got.type, got.name, got.endpoint) == ("DRAPlugin", DRIVER, str(config.dra_socket))
            assert got.supported_versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            await reg.notify_registration_status(api.registration.RegistrationStatus(plugin_registered=True))
            assert running.registered.is_set()
            reg_channel.close()

            for module in (api.dra_v1, api.dra_v1beta1):
                channel = Channel(path=str(config.dra_socket))
                stub = module.DraPluginStub(channel)
                request = module.NodePrepareResourcesRequest(
                    claims=[module.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in (one, two)]
                )
                answer = await stub.node_prepare_resources(request)
                assert set(answer.claims) == {"uid-1", "uid-2"}
                ok = answer.claims["uid-1"]
                assert ok.error == ""
                assert [(d.request_names, d.pool_name, d.device_name, d.cdi_device_ids) for d in ok.devices] == [
                    (["gpu"], NODE, "gpu-3", [f"{KIND}={info.gpus[3].uuid}"])
                ]
                assert answer.claims["uid-2"].devices == []
                assert "gpu-3 is already prepared for ResourceClaim ns/one" in answer.claims["uid-2"].error

                gone = await stub.node_unprepare_resources(
                    module.NodeUnprepareResourcesRequest(
                        claims=[module.Claim(namespace="ns", name="one", uid="uid-1"), module.Claim(uid="uid-never")]
                    )
                )
                assert {uid: r.error for uid, r in gone.claims.items()} == {"uid-1": "", "uid-never": ""}
                channel.close()
        finally:
            await running.close()
        assert not config.registration_socket.exists()
        assert not config.dra_socket.exists()

    run(scenario())


def test_a_restarted_plugin_answers_from_its_checkpoint(
    node_root: Path, kubelet_dir: Path, spec_file: Path, info: gpus.GpuInfo
) -> None:
    from grpclib.client import Channel

    from k8snode.dra import api
    from k8snode.dra.plugin import Config, start

    claims_api = ApiClaims()
    claims_api.add(Claim("ns", "one", "uid-1"), result("gpu-0"))
    config = Config(root=node_root, node=NODE, kubelet_dir=kubelet_dir, cdi_spec=spec_file)

    async def prepare() -> Any:
        running = await start(config, cluster=ApiServer(claims_api))  # type: ignore[arg-type]
        try:
            channel = Channel(path=str(config.dra_socket))
            answer = await api.dra_v1.DraPluginStub(channel).node_prepare_resources(
                api.dra_v1.NodePrepareResourcesRequest(
                    claims=[api.dra_v1.Claim(namespace="ns", name="one", uid="uid-1")]
                )
            )
            channel.close()
            return answer.claims["uid-1"]
        finally:
            await running.close()

    first = run(prepare())
    claims_api.objects.clear()  # the API server no longer has it: only the checkpoint can answer
    second = run(prepare())
    assert first.error == second.error == ""
    assert first.devices == second.devices
    assert claims_api.reads == 1


def test_start_fails_cleanly_without_a_staged_node(tmp_path: Path, kubelet_dir: Path) -> None:
    from k8snode.dra.plugin import Config, PluginError, start

    config = Config(root=tmp_path / "nothing", node=NODE, kubelet_dir=kubelet_dir)
    with pytest.raises(PluginError, match=r"nothing/node.json not found: run `mokka host setup"):
        run(start(config, cluster=ApiServer(ApiClaims())))  # type: ignore[arg-type]
    assert list(kubelet_dir.iterdir()) == []


# ---- the command --------------------------------------------------------------------------------


def mokka(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mokka.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_help_explains() -> None:
    res = mokka("dra-plugin", "--help")
    assert res.returncode == 0
    for word in ("ResourceSlice", "gpu.nvidia.com", "NodePrepareResources", "nvidia.com/gpu=<UUID>", "checkpoint"):
        assert word in " ".join(res.stdout.split()), word


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--root", "/nonexistent"], "mokka: error: /nonexistent/node.json not found: run `mokka host setup"),
        (["--cdi-kind", "bad kind"], "mokka: error: invalid CDI kind 'bad kind'"),
        (
            ["--no-write-cdi-spec", "--cdi-dir", "/nonexistent"],
            "mokka: error: no CDI spec /nonexistent/nvidia.com-gpu.json",
        ),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "mokka: error: no Kubernetes API configuration"),
        (["--unpublish", "--kubeconfig", "/nonexistent/kubeconfig"], "mokka: error: no Kubernetes API configuration"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    node_root: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    kubelet = tmp_path / "kubelet"
    cdi_dir = tmp_path / "cdi-out"
    base = ["dra-plugin", "--root", str(node_root), "--kubelet-dir", str(kubelet), "--cdi-dir", str(cdi_dir)]
    res = mokka(*base, *args, env={"KUBECONFIG": "/nonexistent/kubeconfig", "KUBERNETES_SERVICE_HOST": ""})
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith(message), res.stderr
    assert "Traceback" not in res.stderr
    assert not kubelet.exists()
    assert not cdi_dir.exists()


def test_missing_bindings_are_one_line(node_root: Path) -> None:
    code = (
        "import sys; sys.modules['k8snode.dra._pb'] = None  # as if never generated\n"
        "from mokka.cli import main; main(['dra-plugin', '--root', sys.argv[1]])"
    )
    res = subprocess.run([sys.executable, "-c", code, str(node_root)], capture_output=True, text=True, cwd=REPO)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == [
        "mokka: error: the kubelet API bindings (k8snode/dra/_pb) are missing (import of k8snode.dra._pb halted; "
        "None in sys.modules): run `python -m fetch.kubelet_api` (or .ci/setup --tests)"
    ]


def test_the_plugin_process_loads_no_tooling() -> None:
    code = "import mokka.cli, k8snode.dra.plugin, k8snode.dra.service, k8snode.dra.cluster, kubernetes.client, pynvml"
    res = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    tops = {m.split(".")[0] for m in res.stdout.split()}
    assert not tops & {"fetch", "containers", "bench", "hostsetup", "nri_mokka"}
    assert not tops & {"pydantic", "cffi"}, "the plugin process stays small"


# ---- the InfiniBand adapters: a second driver ---------------------------------------------------

NIC_KIND = "mokka.io/hca"


def test_adapters_are_what_sysfs_says_each_beside_its_gpu(info: gpus.GpuInfo, tree: Path) -> None:
    """One adapter per GPU of the h100 server, read from the class files as a NIC driver reads them:
    its character devices, its PCI function, and the PCIe root it shares with its GPU (the pairing
    a claim's matchAttribute makes)."""
    found = nics.read(tree)
    assert [n.name for n in found] == [f"mlx5_{i}" for i in range(4)]
    for i, nic in enumerate(found):
        assert nic.device_nodes == (
            (f"uverbs{i}", 231, 192 + i), (f"issm{i}", 231, 64 + i), (f"umad{i}", 231, i)
        )  # fmt: skip
        assert (nic.hca_type, nic.link_layer, nic.rate_gbps, nic.ports) == ("MT4129", "InfiniBand", 400, 1)
        assert nic.pcie_root is not None and nic.pcie_root == info.gpus[i].pcie_root
        assert [g.index for g in info.gpus if g.pcie_root == nic.pcie_root] == [i]
        assert os.path.isdir(tree / "bus/pci/devices" / nic.pcie_bus_id)
    dev = resources.nic_device(found[2])
    assert dev["name"] == "mlx5-2"
    attrs = dev["attributes"]
    assert attrs["type"] == {"string": "hca"} and attrs["rdmaDevice"] == {"string": "mlx5_2"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": info.gpus[2].pcie_root}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": found[2].pcie_bus_id}
    assert attrs["firmwareVersion"] == {"version": resources.semver(found[2].firmware)}
    assert nics.read(tree.parent / "absent") == ()


def test_the_adapters_slice_and_class_pass_the_kubernetes_schema(tree: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    inventory = resources.nic_inventory(nics.read(tree), cdi_kind=NIC_KIND)
    assert inventory.cdi_ids == {f"mlx5-{i}": f"{NIC_KIND}=mlx5_{i}" for i in range(4)}
    body = resources.slice_of(list(inventory.devices), NODE, driver=resources.NIC_DRIVER)
    for obj in (body, inventory.device_class):
        obj = json.loads(json.dumps(obj))
        if "generateName" in obj["metadata"]:
            obj["metadata"]["name"] = obj["metadata"].pop("generateName") + "x"
        kubernetes_validate.validate(obj, "1.34.0", strict=True)
    assert inventory.device_class["spec"]["selectors"] == [{"cel": {"expression": "device.driver == 'nic.mokka.io'"}}]


def test_the_adapters_cdi_spec_gives_each_its_device_nodes_and_the_sysfs_view(node_root: Path, tree: Path) -> None:
    import cdi
    from fetch import cdi_schema
    from gpumodel.nodelayout import NodeLayout

    layout = NodeLayout.load(node_root)
    found = nics.read(tree)
    spec = cdi.render_adapters(layout, [(n.name, n.device_nodes) for n in found])
    cdi.validate(spec, cdi_schema.fetch_schema())
    assert spec["kind"] == NIC_KIND and cdi.file_name(spec) == "mokka.io-hca.json"
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert sorted(devices) == ["all", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [(n["path"], n["hostPath"], n["major"], n["minor"]) for n in devices["mlx5_1"]] == [
        (f"/dev/infiniband/{name}", f"{layout.dev_root}/infiniband/{name}", 231, minor)
        for name, minor in (("uverbs1", 193), ("issm1", 65), ("umad1", 1))
    ]
    assert len(devices["all"]) == 12
    # every adapter's: the connection manager's one device (librdmacm)
    common = spec["containerEdits"]["deviceNodes"]
    assert [(n["path"], n["hostPath"], n["major"], n["minor"]) for n in common] == [
        ("/dev/infiniband/rdma_cm", f"{layout.dev_root}/infiniband/rdma_cm", 10, 58)
    ]
    gpu_spec = cdi.render(layout)
    assert all(m in gpu_spec["containerEdits"]["mounts"] for m in spec["containerEdits"].get("mounts", []))
    with pytest.raises(cdi.CdiError, match="has no InfiniBand adapters"):
        cdi.render_adapters(layout, [])


def test_the_nic_driver_prepares_an_adapter_as_its_cdi_device(node_root: Path, kubelet_dir: Path) -> None:
    from grpclib.client import Channel

    from k8snode.dra import api
    from k8snode.dra.plugin import NICS, Config, start

    claims_api = ApiClaims()
    pair = Claim("ns", "pair", "uid-p")
    claims_api.add(pair, result("gpu-2"), result("mlx5-2", "nic", driver=resources.NIC_DRIVER))
    config = Config(
        root=node_root, node=NODE, driver=resources.NIC_DRIVER, devices=NICS, kubelet_dir=kubelet_dir, cdi_kind=NIC_KIND
    )

    async def scenario() -> None:
        server = ApiServer(claims_api)
        running = await start(config, cluster=server)  # type: ignore[arg-type]  # API calls answered from memory
        assert [d["name"] for d in server.published[0].devices] == [f"mlx5-{i}" for i in range(4)]
        assert config.dra_socket.parent == kubelet_dir / "plugins" / resources.NIC_DRIVER
        try:
            channel = Channel(path=str(config.dra_socket))
            stub = api.dra_v1.DraPluginStub(channel)
            answer = await stub.node_prepare_resources(
                api.dra_v1.NodePrepareResourcesRequest(
                    claims=[api.dra_v1.Claim(namespace="ns", name="pair", uid="uid-p")]
                )
            )
            ok = answer.claims["uid-p"]
            assert ok.error == ""  # the GPU of the claim is the other driver's to prepare
            assert [(d.request_names, d.device_name, d.cdi_device_ids) for d in ok.devices] == [
                (["nic"], "mlx5-2", [f"{NIC_KIND}=mlx5_2"])
            ]
            channel.close()
        finally:
            await running.close()

    run(scenario())
