"""CDI specs: rendered from the one edits model, valid under the official schema, written atomically."""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cdi
from fetch import cdi_schema
from gpumodel import edits, profile
from gpumodel.edits import ContainerEdits
from gpumodel.nodelayout import GpuNode, NodeLayout

CASES = [
    ("h100", True, True),
    ("h100", False, False),
    ("h100", True, False),
    ("t4:1", True, True),  # a one-GPU node
    ("t4:1", False, False),
]
CASE_IDS = [f"{p}-{'smi' if s else 'nosmi'}-{'shim' if h else 'noshim'}" for p, s, h in CASES]


def make_layout(root: Path, name: str, smi: bool, shim: bool) -> NodeLayout:
    """A node layout by hand (``name``: PROFILE[:GPUS]); its host paths exist as plain files (CDI only
    names them)."""
    name, _, count = name.partition(":")
    prof = profile.load(name).with_count(int(count) if count else None)
    version = prof.driver.version
    libdir, dev = root / "lib", root / "dev"
    for d in (libdir, dev):
        d.mkdir(parents=True, exist_ok=True)
    (libdir / f"libnvidia-ml.so.{version}").write_bytes(b"\x7fELF")
    gpus = tuple(GpuNode(d.index, d.uuid, d.bus_id, minor=d.index) for d in prof.devices())
    for node in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"] + [f"nvidia{g.minor}" for g in gpus]:
        (dev / node).touch()
    if smi:
        (root / "nvidia-smi").write_bytes(b"\x7fELF")
    if shim:
        (root / "libmokka-sysfs.so").write_bytes(b"\x7fELF")
        for tree in ("sys", "proc"):
            (root / tree).mkdir(exist_ok=True)
    return NodeLayout(
        root=str(root),
        profile=name,
        driver_version=version,
        libdir=str(libdir),
        state=str(libdir / f"libnvidia-ml.so.{version}"),
        dev_root=str(dev),
        gpu_major=195,
        uvm_major=510,
        gpus=gpus,
        nvidia_smi=str(root / "nvidia-smi") if smi else None,
        sysfs_shim=str(root / "libmokka-sysfs.so") if shim else None,
    )


@pytest.fixture(params=CASES, ids=CASE_IDS)
def layout(request: pytest.FixtureRequest, tmp_path: Path) -> NodeLayout:
    name, smi, shim = request.param
    return make_layout(tmp_path / "node", name, smi, shim)


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> NodeLayout:
    return make_layout(tmp_path_factory.mktemp("h100"), "h100", True, True)


@pytest.fixture(scope="module")
def source() -> Path:
    return cdi_schema.fetch_source()


@pytest.fixture(scope="module")
def schema_dir(source: Path) -> Path:
    path = cdi_schema.fetch_schema()
    assert (path / "schema.json").is_file() and (path / "defs.json").is_file()
    return path


def normalized(e: ContainerEdits) -> tuple[Any, ...]:
    """Device-node order does not matter to a runtime; env and mount order do."""
    return e.env, tuple(sorted(e.device_nodes, key=lambda n: n.path)), e.mounts


def without_visible(e: ContainerEdits) -> ContainerEdits:
    env = tuple(x for x in e.env if not x.startswith("NVIDIA_VISIBLE_DEVICES="))
    return ContainerEdits(env=env, device_nodes=e.device_nodes, mounts=e.mounts)


def selections(layout: NodeLayout) -> Iterator[list[str]]:
    for g in layout.gpus:
        yield [str(g.index)]
        yield [g.uuid]
    yield ["all"]
    yield [str(g.index) for g in layout.gpus]
    if len(layout.gpus) > 3:
        yield ["0", "3"]
        yield [layout.gpus[5].uuid, "2"]


# ---- the shape ----------------------------------------------------------------------------


def test_devices_by_index_uuid_and_all(layout: NodeLayout) -> None:
    spec = cdi.render(layout)
    assert spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    n = len(layout.gpus)
    assert n == (8 if layout.profile == "h100" else 1)
    assert names == [str(i) for i in range(n)] + [g.uuid for g in layout.gpus] + ["all"]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for g in layout.gpus:
        node = {
            "path": f"/dev/nvidia{g.minor}",
            "hostPath": f"{layout.dev_root}/nvidia{g.minor}",
            "type": "c",
            "major": 195,
            "minor": g.minor,
            "fileMode": 0o666,
        }
        assert by_name[str(g.index)] == {"deviceNodes": [node]}
        assert by_name[g.uuid] == {"deviceNodes": [node]}
    assert [dn["path"] for dn in by_name["all"]["deviceNodes"]] == [f"/dev/nvidia{g.minor}" for g in layout.gpus]


def test_spec_level_edits(layout: NodeLayout) -> None:
    shared = cdi.render(layout)["containerEdits"]
    assert [dn["path"] for dn in shared["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    for m in shared["mounts"]:
        assert m["options"] == ["ro", "nosuid", "nodev", "bind"] and m["type"] == "bind"
        assert Path(m["hostPath"]).exists()  # files, or the staged sys/ and proc/ trees
    targets = [m["containerPath"] for m in shared["mounts"]]
    assert (edits.SMI_IN_CONTAINER in targets) == bool(layout.nvidia_smi)
    assert (edits.SHIM_IN_CONTAINER in targets) == bool(layout.sysfs_shim)
    assert any(e.startswith("LD_PRELOAD=") for e in shared.get("env", [])) == bool(layout.sysfs_shim)
    assert not any(e.startswith("MOKKA_STATE=") for e in shared.get("env", []))  # the library carries the state


def test_render_is_pure(layout: NodeLayout) -> None:
    assert cdi.render(layout) == cdi.render(layout)
    assert json.loads(json.dumps(cdi.render(layout))) == cdi.render(layout)


# ---- one model: the CDI path and container_edits cannot drift ------------------------------


def test_cannot_drift(layout: NodeLayout) -> None:
    spec = cdi.render(layout)
    assert normalized(cdi.resolve(spec, [])) == normalized(edits.common_edits(layout))
    for names in selections(layout):
        want = without_visible(edits.container_edits(layout, layout.select(names)))
        assert normalized(cdi.resolve(spec, names)) == normalized(want), names


def test_no_visible_devices_env(layout: NodeLayout) -> None:
    """The mock library shows the GPUs whose /dev/nvidiaN exist; a per-device variable would clash."""
    spec = cdi.render(layout)
    envs = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    envs += spec["containerEdits"].get("env", [])
    assert not [e for e in envs if e.startswith("NVIDIA_VISIBLE_DEVICES=")]


def test_unknown_device(h100: NodeLayout) -> None:
    with pytest.raises(cdi.CdiError, match=re.escape("unresolvable CDI device nvidia.com/gpu=8")):
        cdi.resolve(cdi.render(h100), ["0", "8"])


# ---- versions -----------------------------------------------------------------------------


def test_declared_version_is_minimum(layout: NodeLayout) -> None:
    spec = cdi.render(layout)
    # hostPath on device nodes and device names starting with a digit both need 0.5.0.
    assert spec["cdiVersion"] == cdi.minimum_version(spec) == "0.5.0"
    named = copy.deepcopy(spec)
    named["devices"] = [d for d in named["devices"] if d["name"][0].isalpha()]
    assert cdi.minimum_version(named) == "0.5.0"  # hostPath alone
    for d in [*named["devices"], named]:
        for dn in d["containerEdits"].get("deviceNodes", []):
            del dn["hostPath"]
    assert cdi.minimum_version(named) == "0.4.0"  # mount type
    for m in named["containerEdits"]["mounts"]:
        del m["type"]
    assert cdi.minimum_version(named) == "0.3.0"


@pytest.mark.parametrize(
    ("change", "version"),
    [
        (lambda s: s, "0.3.0"),
        (
            lambda s: s["containerEdits"].update(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]),
            "0.4.0",
        ),
        (lambda s: s["devices"][0].update(name="0"), "0.5.0"),
        (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(hostPath="/dev/x"), "0.5.0"),
        (lambda s: s.update(annotations={"a": "b"}), "0.6.0"),
        (lambda s: s["devices"][0].update(annotations={"a": "b"}), "0.6.0"),
        (lambda s: s.update(kind="vendor.com/dev.ice"), "0.6.0"),
        (lambda s: s["containerEdits"].update(additionalGids=[5]), "0.7.0"),
        (lambda s: s["devices"][0]["containerEdits"].update(intelRdt={"closID": "x"}), "0.7.0"),
    ],
)
def test_minimum_version_rules(change: Any, version: str) -> None:
    spec: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "vendor.com/device",
        "devices": [{"name": "myDevice", "containerEdits": {"deviceNodes": [{"path": "/dev/card1"}]}}],
        "containerEdits": {},
    }
    change(spec)
    assert cdi.minimum_version(spec) == version


def test_kind_is_configurable(h100: NodeLayout) -> None:
    assert cdi.render(h100, kind="example.com/mock-gpu")["kind"] == "example.com/mock-gpu"
    assert cdi.render(h100, kind="example.com/gpu.mock")["cdiVersion"] == "0.6.0"
    for bad in ("gpu", "nvidia.com/", "nvidia.com/-gpu", "/gpu", "nvidia.com/g/pu"):
        with pytest.raises(cdi.CdiError, match="invalid CDI kind"):
            cdi.render(h100, kind=bad)


# ---- the official schema --------------------------------------------------------------------


@pytest.mark.consumers
def test_valid_against_official_schema(layout: NodeLayout, schema_dir: Path) -> None:
    cdi.validate(cdi.render(layout), schema_dir)
    cdi.validate(cdi.render(layout, kind="example.com/gpu.mock"), schema_dir)


@pytest.mark.consumers
def test_official_examples(source: Path, schema_dir: Path) -> None:
    good = sorted((source / "schema/testdata/good").glob("*.json"))
    bad = sorted((source / "schema/testdata/bad").glob("*.json"))
    assert good and bad
    for path in good:
        cdi.validate(json.loads(path.read_text()), schema_dir)
    for path in bad:
        text = path.read_text()  # empty.json is empty: "unloadable" in the Go tests
        with pytest.raises(cdi.SpecError) as err:
            cdi.validate(json.loads(text) if text.strip() else None, schema_dir)
        assert err.value.path == "$", path


@pytest.mark.consumers
@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (
            lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(major="195"),
            ".deviceNodes[0].major",
            "not of type 'integer'",
        ),
        (lambda s: s["devices"][2].pop("containerEdits"), "$.devices[2]", "containerEdits"),
        (lambda s: s["containerEdits"]["mounts"][1].pop("hostPath"), "$.containerEdits.mounts[1]", "hostPath"),
        (lambda s: s.update(devices={}), "$.devices", "array"),
        (lambda s: s.update(cdiVersion="0.4.0"), "$.cdiVersion", "at least 0.5.0"),
        (lambda s: s.update(cdiVersion="9.9.9"), "$.cdiVersion", "unknown version"),
        (lambda s: s.update(kind="nvidia.com"), "$.kind", "invalid CDI kind"),
        (lambda s: s["devices"][1].update(name="0"), "$.devices[1].name", "twice"),
        (lambda s: s["devices"][1].update(name="gpu/1"), "$.devices[1].name", "invalid device name"),
        (lambda s: s["devices"][0].update(containerEdits={}), "$.devices[0].containerEdits", "empty edits"),
        (lambda s: s["containerEdits"]["env"].append("NOVALUE"), "$.containerEdits.env[", "KEY=VALUE"),
    ],
)
def test_validate_names_the_path(h100: NodeLayout, schema_dir: Path, change: Any, path: str, message: str) -> None:
    spec = cdi.render(h100)
    change(spec)
    with pytest.raises(cdi.SpecError, match=re.escape(message)) as err:
        cdi.validate(spec, schema_dir)
    assert path in err.value.path and err.value.path in str(err.value)


# ---- writing --------------------------------------------------------------------------------


def test_write_is_atomic_and_idempotent(h100: NodeLayout, tmp_path: Path) -> None:
    spec = cdi.render(h100)
    out = tmp_path / "run" / "cdi"
    path = cdi.write(spec, out)
    assert path == out / "nvidia.com-gpu.json"
    assert json.loads(path.read_text()) == spec
    assert path.stat().st_mode & 0o777 == 0o644
    before = path.stat()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))
    pinned = path.stat()
    assert cdi.write(cdi.render(h100), out) == path
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (pinned.st_ino, pinned.st_mtime_ns)
    assert sorted(p.name for p in out.iterdir()) == ["nvidia.com-gpu.json"]
    # A changed spec replaces the file (new inode: rename), leaving no temporary behind.
    other = cdi.render(h100, kind="nvidia.com/gpu")
    other["containerEdits"]["env"].append("X=1")
    cdi.write(other, out)
    assert path.stat().st_ino != pinned.st_ino
    assert json.loads(path.read_text()) == other
    assert sorted(p.name for p in out.iterdir()) == ["nvidia.com-gpu.json"]
    assert cdi.write(cdi.render(h100, kind="example.com/mock"), out).name == "example.com-mock.json"


def test_write_unwritable_dir(h100: NodeLayout, tmp_path: Path) -> None:
    spec = cdi.render(h100)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(cdi.CdiError, match=re.escape(f"cannot write CDI spec into {blocker}/cdi")):
        cdi.write(spec, blocker / "cdi")
    assert blocker.read_text() == "x"

    readonly = tmp_path / "ro"
    readonly.mkdir()
    (readonly / "nvidia.com-gpu.json").write_text("old")
    readonly.chmod(0o555)
    try:
        if os.access(readonly, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes")
        with pytest.raises(cdi.CdiError, match="cannot write CDI spec into"):
            cdi.write(spec, readonly)
        assert [p.name for p in readonly.iterdir()] == ["nvidia.com-gpu.json"]
        assert (readonly / "nvidia.com-gpu.json").read_text() == "old"
    finally:
        readonly.chmod(0o755)


def test_write_target_is_a_directory(h100: NodeLayout, tmp_path: Path) -> None:
    (tmp_path / "nvidia.com-gpu.json").mkdir()
    with pytest.raises(cdi.CdiError, match=re.escape("nvidia.com-gpu.json")):
        cdi.write(cdi.render(h100), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.com-gpu.json"]
