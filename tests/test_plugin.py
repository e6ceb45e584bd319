"""The plugin layer between the stub and the decision: raw NRI requests in, encoded adjustments out."""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.request
from pathlib import Path

import pytest

from gpumodel import edits, nodelayout, profile
from hostsetup import node
from nri_mokka import answers, decision, plugin, reply
from nri_mokka.health import Health, listen
from nri_mokka.nri import loop as poll_loop
from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as api
from nri_mokka.nri.stub import PluginError, Stub


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
    """The plugin's answer, decoded; None for an empty answer (no changes)."""
    reply = p.create_container(bytes(api.CreateContainerRequest(pod=pd, container=c)))
    return api.CreateContainerResponse().parse(reply).adjust if reply else None


def test_default_adjustment(root: Path) -> None:
    p = plugin.MokkaPlugin(root)
    adj = create(p, pod(), container())
    assert adj is not None
    layout = nodelayout.NodeLayout.load(root)
    # the GPUs' edits, and the hook showing the container the driver's procfs
    full = edits.container_edits(layout, layout.gpus)
    expected = edits.with_driver_procfs(layout, full)
    assert layout.proc_hook and [h.path for h in adj.hooks.create_container] == [layout.proc_hook]
    # which makes what the spec then leaves out: the libraries' second names as links to the
    # versioned files, the staged trees bound read-only; together, every mount of the full edits
    args = adj.hooks.create_container[0].args
    made = {
        opt: [args[i + 1].split("=", 1) for i in range(len(args)) if args[i] == opt] for opt in ("--link", "--bind")
    }
    libdir, version = edits.libdir_in_container(layout), layout.driver_version
    assert made["--link"] == [[f"{libdir}/libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"],
                              [f"{libdir}/libcuda.so.1", f"libcuda.so.{version}"]]  # fmt: skip
    assert made["--bind"] == [[f"{root}/{t}", f"{edits.TREES_IN_CONTAINER}/{t}"] for t in ("sys", "proc")]
    linked = {path for path, _ in made["--link"]} | {path for _, path in made["--bind"]}
    assert sorted({m.destination for m in adj.mounts} | linked) == sorted(m.container_path for m in full.mounts)
    assert {(e.key, e.value) for e in adj.env} == set(expected.env_dict().items())
    assert [d.path for d in adj.linux.devices] == [n.path for n in expected.device_nodes]
    assert all(d.file_mode.value == 0o666 for d in adj.linux.devices)
    assert [(m.source, m.destination) for m in adj.mounts] == [(m.host_path, m.container_path) for m in expected.mounts]
    # read-only, but for the InfiniBand relay directory, where a container may serve a MAD class (ibping -S)
    relay = f"{edits.TREES_IN_CONTAINER}/ib-relay"
    assert {m.destination: m.options for m in adj.mounts if m.options != ["ro", "nosuid", "nodev", "bind"]} == {
        relay: ["rw", "nosuid", "nodev", "bind"]
    }
    assert reply.response(reply.adjustment(expected)) == bytes(api.CreateContainerResponse(adjust=adj))


def test_answers_are_encoded_once_per_distinct_input(root: Path) -> None:
    p = plugin.MokkaPlugin(root)
    first = p.create_container(bytes(api.CreateContainerRequest(pod=pod(), container=container())))
    again = p.create_container(
        bytes(api.CreateContainerRequest(pod=pod(name="other", id="p2"), container=container(name="x", id="c9")))
    )
    assert again is first  # names do not matter: the very same bytes
    other_ns = p.create_container(bytes(api.CreateContainerRequest(pod=pod(namespace="ml"), container=container())))
    assert other_ns == first  # another input, the same adjustment: encoded once
    assert p.answers is not None and len(p.answers._cache) == 2 and len(p.answers._encoded) == 1


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


def test_external_allocator_from_the_command_line_and_the_config_string(root: Path) -> None:
    p = plugin.MokkaPlugin(root, {"allocator": "external"})
    assert create(p, pod(), container()) is None  # no allocation: nothing
    layout = nodelayout.NodeLayout.load(root)
    adj = create(p, pod(), container(env=[f"NVIDIA_VISIBLE_DEVICES={layout.gpus[2].uuid}"]))
    assert adj is not None and adj.linux.devices[0].path == "/dev/nvidia2"
    assert "NVIDIA_VISIBLE_DEVICES" not in {e.key for e in adj.env}
    q = plugin.MokkaPlugin(root)
    assert create(q, pod(), container()) is not None
    q.configure("allocator: external\n", "containerd", "v2.1.9")
    assert q.config is not None and q.config.allocator == "external"
    assert create(q, pod(), container()) is None


def test_config_string_from_containerd(root: Path) -> None:
    p = plugin.MokkaPlugin(root, {"cdiDevices": True})
    p.configure("mode: opt-in\n", "containerd", "2.1.9")
    assert create(p, pod(), container()) is None
    assert p.config is not None and p.config.mode == "opt-in" and p.config.cdi_devices  # flags stay under it
    p.configure("mode: [broken", "containerd", "2.1.9")
    assert p.config.mode == "all"  # an invalid config is logged and ignored: the command line's settings
    p.configure("colour: blue", "containerd", "2.1.9")
    assert p.config.mode == "all"


def test_internal_errors_reach_the_stub_which_fails_open(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the decision is not a refusal: it surfaces as an ordinary exception, which the
    stub answers with no changes (test_nri_stub: test_errors_and_stream_rules)."""
    p = plugin.MokkaPlugin(root)
    p.warm_up()

    def boom(*a: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(decision, "decide", boom)
    with pytest.raises(RuntimeError):
        create(p, pod(namespace="elsewhere"), container())


def test_without_layout_everything_passes(tmp_path: Path) -> None:
    p = plugin.MokkaPlugin(tmp_path / "nothing")
    assert create(p, pod(), container()) is None
    assert p.answers is None


def test_registers_before_importing_the_heavy_parts(root: Path) -> None:
    """Nothing of the decision or gpumodel is loaded until warm_up; betterproto (grpclib,
    asyncio, ssl: answers are written on the wire by ``reply``), click, pydantic and cffi never."""
    code = (
        "import sys\n"
        "from nri_mokka import main, plugin, service, supervisor, health\n"
        f"p = plugin.MokkaPlugin({str(root)!r})\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('betterproto', 'gpumodel', 'yaml', 'asyncio', 'typing', 'dataclasses') or m == 'nri_mokka.decision')\n"
        "print(loaded)\n"
        "p.warm_up()\n"
        "print(p.answers is not None)\n"
        "tops = {m.split('.')[0] for m in sys.modules}\n"
        "heavy = {'click', 'pydantic', 'cffi', 'mokka', 'fetch', 'containers', 'bench'}\n"
        "print(sorted(tops & (heavy | {'betterproto', 'grpclib', 'asyncio', 'ssl', 'dateutil'})))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == "True"
    assert out[2] == "[]", out  # and never the command line's heavy parts


def test_cdi_references_only_where_the_runtime_applies_them(root: Path) -> None:
    assert answers.runtime_takes_cdi("containerd", "v2.1.9")
    assert answers.runtime_takes_cdi("containerd", "2.2.0+unknown")
    assert not answers.runtime_takes_cdi("containerd", "v1.7.24")
    assert not answers.runtime_takes_cdi("cri-o", "1.33.0")
    p = plugin.MokkaPlugin(root, {"cdiDevices": True})
    p.configure("", "containerd", "v1.7.24")
    adj = create(p, pod(annotations={"mokka.io/gpus": "2"}), container())
    assert adj is not None and [d.path for d in adj.linux.devices][:1] == ["/dev/nvidia2"] and not adj.cdi_devices
    p.configure("", "containerd", "v2.1.9")
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


def test_health_endpoints(root: Path) -> None:
    p = plugin.MokkaPlugin(root)
    p.warm_up()
    loop = poll_loop.Loop()
    stub = Stub(p, name="mokka", idx="10", socket_path=str(root / "absent.sock"), env={}, loop=loop, retry=0.05)
    listener = listen("127.0.0.1:0")
    port = listener.getsockname()[1]
    Health(stub, p, listener)
    r, w = os.pipe()
    loop.watch(r, poll_loop.READ, lambda revents: stub.stop())
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    results = []
    try:
        for path in ("/healthz", "/readyz", "/nope"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as res:
                    results.append((res.status, json.loads(res.read())))
            except urllib.error.HTTPError as exc:
                results.append((exc.code, json.loads(exc.read())))
        idle = socket.create_connection(("127.0.0.1", port))  # a client that never asks does not block others
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as res:
            assert res.status == 200
        idle.close()
    finally:
        os.write(w, b"x")
        thread.join(5)
        listener.close()
    (h_code, h_body), (r_code, _), (n_code, _) = results
    assert h_code == 200 and h_body["layout"] is True and h_body["pid"] == os.getpid()
    assert r_code == 503  # not registered with any runtime yet
    assert n_code == 404
    with pytest.raises(ValueError, match="HOST:PORT"):
        listen("nonsense")


def test_a_replacement_keeps_the_configuration_containerd_launched_with(root: Path) -> None:
    """containerd configures only the connection it handed a launched plugin; a replacement that
    dials gets an empty config string and keeps the launched one (the supervisor passes it on)."""
    p = plugin.MokkaPlugin(root)
    p.launch_config = "allocator: external\n"
    p.configure("", "containerd", "v2.1.9")
    assert create(p, pod(), container()) is None
    assert p.config is not None and p.config.allocator == "external"
    p.configure("allocator: nri\n", "containerd", "v2.1.9")  # a config string given wins
    assert create(p, pod(), container()) is not None


def test_log_lines(capfd: pytest.CaptureFixture[str]) -> None:
    from nri_mokka import log

    logger = log.Logger("mokka.test")
    logger.info("%s/%s: %d GPUs", "ns", "pod", 8)
    logger.debug("not shown at INFO")
    log.set_level(log.DEBUG)
    try:
        logger.debug("shown %s", "now")
    finally:
        log.set_level(log.INFO)
    try:
        raise KeyError("boom")
    except KeyError:
        logger.exception("failed %d", 1)
    lines = capfd.readouterr().err.splitlines()
    assert lines[0].endswith(f" {os.getpid()} INFO mokka.test: ns/pod: 8 GPUs")
    assert lines[0][:4].isdigit() and lines[0][19] == "," and lines[0][20:23].isdigit()
    assert lines[1].endswith("DEBUG mokka.test: shown now")
    assert lines[2].endswith("ERROR mokka.test: failed 1") and "KeyError: 'boom'" in lines[-1]


def test_one_log_line_per_decision_after_the_answer(root: Path, capfd: pytest.CaptureFixture[str]) -> None:
    p = plugin.MokkaPlugin(root)
    p.warm_up()
    capfd.readouterr()
    create(p, pod(), container())
    assert capfd.readouterr().err == ""  # nothing while containerd waits for the answer
    p.replied()
    p.replied()  # nothing twice
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "INFO mokka.plugin: default/trainer/main: GPUs 0,1,2,3,4,5,6,7 (all GPUs of the node): 12 device nodes, "
        + lines[0].split("12 device nodes, ", 1)[1]
    )
    with pytest.raises(PluginError):
        create(p, pod(annotations={"mokka.io/gpus": "12"}), container())
    p.replied()
    assert "default/trainer/main: refused: mokka.io/gpus names GPU '12'" in capfd.readouterr().err


def test_state_counter_offsets_are_the_c_headers() -> None:
    """state_seq reads the latch counter by hand (the plugin loads no cffi): its offsets and magic
    numbers must be native/mokka_state.h's."""
    from gpumodel import state
    from nri_mokka import state_seq

    ffi = state.ffi()
    assert ffi.offsetof("mokka_header_t", "seq") == state_seq.SEQ_OFFSET
    assert ffi.sizeof("uint32_t") == state_seq.SEQ.size
    assert state.const("MOKKA_STATE_MAGIC") == state_seq.STATE_MAGIC
    assert state.const("MOKKA_TRAILER_MAGIC") == state_seq.TRAILER_MAGIC
    assert ffi.sizeof("mokka_trailer_t") == state_seq.TRAILER.size
    assert [ffi.offsetof("mokka_trailer_t", f) for f in ("state_offset", "state_size", "magic")] == [0, 8, 16]


def test_the_plugin_follows_a_mig_reconfiguration(tmp_path: Path) -> None:
    """A MIG device destroyed through NVML (as nvidia-smi does) is no longer handed out by the next
    decision: the plugin reads the layout again once the state's counter moved."""
    import subprocess
    import sys

    from mig_fixtures import mig_profile_data, write_profile
    from test_mig_containers import LAYOUT

    from nri_mokka import state_seq

    data = mig_profile_data("h100", 2, {1: {"mig": {"mode": False, "instances": []}}}, mode=True, instances=LAYOUT)
    r = tmp_path / "root"
    node.apply(node.plan(profile.load(write_profile(tmp_path / "p.yaml", data)), node.Options(root=r, majors="real")))
    layout = nodelayout.NodeLayout.load(r)
    from gpumodel import mig_state

    gone = mig_state.read(Path(layout.state))[0].devices[2]
    p = plugin.MokkaPlugin(r)
    adj = create(p, pod(annotations={"mokka.io/gpus": gone.uuid}), container())
    assert adj is not None and ("NVIDIA_VISIBLE_DEVICES", gone.uuid) in {(e.key, e.value) for e in adj.env}
    seq = state_seq.StateSeq(layout.state)
    before = seq.read()
    destroy = (
        "import pynvml as N\nN.nvmlInit()\nh = N.nvmlDeviceGetHandleByIndex(0)\n"
        "m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)\n"
        "gi = N.nvmlDeviceGetGpuInstanceById(h, N.nvmlDeviceGetGpuInstanceId(m))\n"
        "ci = N.nvmlGpuInstanceGetComputeInstanceById(gi, N.nvmlDeviceGetComputeInstanceId(m))\n"
        "N.nvmlComputeInstanceDestroy(ci)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": layout.libdir, "MOKKA_IGNORE_DEVICE_NODES": "1"}
    subprocess.run([sys.executable, "-c", destroy], env=env, check=True, capture_output=True, text=True)
    assert seq.read() != before
    assert gone not in mig_state.read(Path(layout.state))[0].devices
    with pytest.raises(PluginError, match=gone.uuid):
        create(p, pod(annotations={"mokka.io/gpus": gone.uuid}), container())
    seq.close()
