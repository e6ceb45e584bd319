"""The plugin layer between the stub and the decision: NRI messages in, adjustments out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpumodel import edits, nodelayout, profile
from hostsetup import node
from nri_mokka import plugin
from nri_mokka.nri.stub import PluginError, Stub, api


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("node") / "root"
    node.apply(node.plan(profile.load("h100"), node.Options(root=r, majors="real")))
    return r


def pod(**kw: object) -> api.PodSandbox:
    base: dict[str, object] = {"id": "p1", "name": "trainer", "namespace": "default", "annotations": {}}
    base.update(kw)
    return api.PodSandbox(**base)  # type: ignore[arg-type]


def container(**kw: object) -> api.Container:
    base: dict[str, object] = {"id": "c1", "pod_sandbox_id": "p1", "name": "main", "env": ["PATH=/bin"]}
    base.update(kw)
    return api.Container(**base)  # type: ignore[arg-type]


def create(p: plugin.MokkaPlugin, pd: api.PodSandbox, c: api.Container) -> api.ContainerAdjustment | None:
    return asyncio.run(p.create_container(pd, c))


def test_default_adjustment(root: Path) -> None:
    adj = create(plugin.MokkaPlugin(root), pod(), container())
    assert adj is not None
    layout = nodelayout.NodeLayout.load(root)
    expected = edits.container_edits(layout, layout.gpus)
    assert {(e.key, e.value) for e in adj.env} == set(expected.env_dict().items())
    assert [d.path for d in adj.linux.devices] == [n.path for n in expected.device_nodes]
    assert all(d.file_mode.value == 0o666 for d in adj.linux.devices)
    assert [(m.source, m.destination) for m in adj.mounts] == [(m.host_path, m.container_path) for m in expected.mounts]
    assert all(m.options == ["ro", "nosuid", "nodev", "bind"] for m in adj.mounts)
    # the adjustment survives the wire: it serializes and parses back equal
    assert api.ContainerAdjustment().parse(bytes(adj)) == adj


def test_existing_ld_preload_is_kept(root: Path) -> None:
    adj = create(plugin.MokkaPlugin(root), pod(), container(env=["LD_PRELOAD=/opt/libfoo.so"]))
    assert adj is not None
    preload = {e.key: e.value for e in adj.env}.get("LD_PRELOAD")
    if nodelayout.NodeLayout.load(root).sysfs_shim:
        assert preload == f"{edits.SHIM_IN_CONTAINER}:/opt/libfoo.so"


def test_opted_out_and_cdi_containers_are_untouched(root: Path) -> None:
    p = plugin.MokkaPlugin(root)
    assert create(p, pod(annotations={"mokka.io/inject": "false"}), container()) is None
    assert create(p, pod(namespace="kube-system"), container()) is None
    assert create(p, pod(), container(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"})) is None


def test_unknown_gpus_fail_the_container(root: Path) -> None:
    with pytest.raises(PluginError, match="'12'"):
        create(plugin.MokkaPlugin(root), pod(annotations={"mokka.io/gpus": "12"}), container())


def test_internal_errors_fail_open(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = plugin.MokkaPlugin(root)

    def boom(*a: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(plugin.decision, "decide", boom)
    assert create(p, pod(), container()) is None
    assert p.decisions == 1


def test_without_layout_everything_passes(tmp_path: Path) -> None:
    p = plugin.MokkaPlugin(tmp_path / "nothing")
    assert p.layout is None
    assert create(p, pod(), container()) is None


def test_config_string_from_containerd(root: Path) -> None:
    p = plugin.MokkaPlugin(root)
    asyncio.run(p.configure("mode: opt-in\n", "containerd", "2.1.9"))
    assert p.config.mode == "opt-in"
    assert create(p, pod(), container()) is None
    asyncio.run(p.configure("mode: [broken", "containerd", "2.1.9"))
    assert p.config.mode == "opt-in"  # an invalid config is logged and ignored


def test_health_endpoints(root: Path) -> None:
    async def scenario() -> list[tuple[int, dict[str, object]]]:
        p = plugin.MokkaPlugin(root)
        stub = Stub(p, name="mokka", idx="10", socket_path=str(root / "absent.sock"))
        health = plugin.Health(stub, p)
        server = await health.serve("127.0.0.1:0")
        port = server.sockets[0].getsockname()[1]
        out = []
        for path in ("/healthz", "/readyz", "/nope"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            data = await reader.read()
            writer.close()
            head, _, body = data.partition(b"\r\n\r\n")
            out.append((int(head.split()[1]), json.loads(body)))
        server.close()
        return out

    (h_code, h_body), (r_code, _), (n_code, _) = asyncio.run(scenario())
    assert h_code == 200 and h_body["layout"] is True
    assert r_code == 503  # not registered with any runtime yet
    assert n_code == 404


def test_cdi_references_only_where_the_runtime_applies_them(root: Path) -> None:
    assert plugin.runtime_takes_cdi("containerd", "v2.1.9")
    assert plugin.runtime_takes_cdi("containerd", "2.2.0+unknown")
    assert not plugin.runtime_takes_cdi("containerd", "v1.7.24")
    assert not plugin.runtime_takes_cdi("cri-o", "1.33.0")
    p = plugin.MokkaPlugin(root, plugin.decision.Config(cdi_devices=True))
    asyncio.run(p.configure("", "containerd", "v1.7.24"))
    adj = create(p, pod(annotations={"mokka.io/gpus": "2"}), container())
    assert adj is not None and [d.path for d in adj.linux.devices][:1] == ["/dev/nvidia2"] and not adj.cdi_devices
    asyncio.run(p.configure("", "containerd", "v2.1.9"))
    adj = create(p, pod(annotations={"mokka.io/gpus": "2"}), container())
    assert adj is not None and [c.name for c in adj.cdi_devices] == ["nvidia.com/gpu=2"]
    assert not adj.mounts and not adj.env  # the CDI spec carries those


def test_layout_is_reloaded_when_host_setup_runs_again(tmp_path: Path) -> None:
    r = tmp_path / "root"
    node.apply(node.plan(profile.load("h100").with_count(2), node.Options(root=r, majors="real")))
    p = plugin.MokkaPlugin(r)
    adj = create(p, pod(), container())
    assert adj is not None and len([d for d in adj.linux.devices if d.path[11:].isdigit()]) == 2
    node.apply(node.plan(profile.load("h100").with_count(4), node.Options(root=r, majors="real")))
    adj = create(p, pod(), container())
    assert adj is not None and len([d for d in adj.linux.devices if d.path[11:].isdigit()]) == 4
