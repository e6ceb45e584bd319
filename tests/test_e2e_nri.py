"""End to end: the NRI plugin on a real containerd (1.7 and 2.1), driven through CRI.

Host setup stages the h100 profile with Debian's nvidia-smi; a private containerd with NRI on
runs the plugin (``python -m nri_mokka``, under its supervisor) as a node would. A container
from a local image with nothing NVIDIA inside runs ``nvidia-smi -L`` and sees the profile's
GPUs; ``NVIDIA_VISIBLE_DEVICES=1,3`` narrows that to two, renumbered; an opted-out pod sees
none; after containerd restarts the plugin registers again and the next container is
injected; a killed or stopped plugin process is replaced and the next container injected; a
stopped plugin without its supervisor does not keep containers from starting; containerd can
launch the plugin itself. With ``--allocator external`` a container without an allocation
sees no GPU, one whose device plugin set ``NVIDIA_VISIBLE_DEVICES`` sees exactly its GPUs with
their device nodes, and CDI requests (annotation and CRI field) see theirs from the CDI spec,
with or without the plugin running.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rdma_image
from test_e2e_cdi import PROBE, PROFILE, assert_sees_exactly, device_nodes, sections

import cdi
from containers import cleanup, images, sandbox
from containers.plugin_process import PluginProcess
from gpumodel import nodelayout, profile
from gpumodel.edits import SHIM_IN_CONTAINER
from hostsetup import infiniband

pytestmark = [pytest.mark.consumers, pytest.mark.slow, pytest.mark.root]

VERSIONS = ["1.7", "2.1"]


def plugin_node(
    tmp_path_factory: pytest.TempPathFactory,
    version: str,
    layout: nodelayout.NodeLayout,
    workload_image: Path,
    *,
    cdi_dirs: list[Path] | None = None,
    args: tuple[str, ...] = (),
) -> Iterator[tuple[sandbox.Sandbox, PluginProcess]]:
    """A private containerd with NRI (and ``cdi_dirs``), the workload image and a registered plugin
    started with ``args``; afterwards nothing may be left behind."""
    base = tmp_path_factory.mktemp("nb")
    shutil.rmtree(base)
    logs = tmp_path_factory.mktemp("logs")
    box = sandbox.Sandbox(base, version, nri=True, cdi_dirs=cdi_dirs, log_file=logs / "containerd.log")
    with box:
        box.import_image(workload_image)
        plugin = PluginProcess(box.nri_socket, Path(layout.root), (logs / "plugin.log").open("ab"), args=args)
        try:
            plugin.wait_registered()
            yield box, plugin
        finally:
            plugin.stop()
    assert cleanup.leftovers(base) == []


@pytest.fixture(params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def node_with_plugin(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    layout: nodelayout.NodeLayout,
    workload_image: Path,
) -> Iterator[tuple[sandbox.Sandbox, PluginProcess]]:
    yield from plugin_node(tmp_path_factory, request.param, layout, workload_image)


def run_probe(box: sandbox.Sandbox, pod_annotations: dict[str, str] | None = None, **container: Any) -> str:
    """PROBE in a new pod (annotated ``pod_annotations``); ``container``: env, annotations, cdi_devices."""
    pod = box.run_pod(f"p{time.monotonic_ns() % 10**8}", annotations=pod_annotations or {})
    result = box.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], **container)
    box.remove_pod(pod)
    return result.logs


def smi_lines(output: str) -> list[str]:
    return [ln for ln in sections(output)["smi"] if ln.startswith("GPU ")]


def test_unmodified_container_sees_every_gpu(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, _ = node_with_plugin
    out = run_probe(box)
    devices = profile.load(PROFILE).devices()
    assert smi_lines(out) == [f"GPU {d.index}: {d.spec.name} (UUID: {d.uuid})" for d in devices], out
    nodes = device_nodes(sections(out)["dev"])
    assert {f"nvidia{i}" for i in range(8)} | {"nvidiactl", "nvidia-uvm"} <= set(nodes)
    assert "read-only" in sections(out)["write"]


def test_visible_devices_narrow_and_renumber(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, _ = node_with_plugin
    out = run_probe(box, env={"NVIDIA_VISIBLE_DEVICES": "1,3"})
    d = profile.load(PROFILE).devices()
    assert smi_lines(out) == [
        f"GPU 0: {d[1].spec.name} (UUID: {d[1].uuid})",
        f"GPU 1: {d[3].spec.name} (UUID: {d[3].uuid})",
    ], out


def test_opted_out_pod_sees_nothing(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, _ = node_with_plugin
    out = run_probe(box, pod_annotations={"mokka.io/inject": "false"})
    assert smi_lines(out) == []
    assert "exit 127" in sections(out)["smi"]  # no nvidia-smi at all
    assert not [n for n in device_nodes(sections(out)["dev"]) if n.startswith("nvidia")]


def test_other_rules(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess], layout: nodelayout.NodeLayout) -> None:
    """mokka.io/gpus picks GPUs (with their device nodes), an excluded namespace is left alone,
    an image's own LD_PRELOAD is kept, and a GPU the node lacks fails the container."""
    box, _ = node_with_plugin
    assert_sees_exactly(run_probe(box, pod_annotations={"mokka.io/gpus": "2"}), layout, 2)
    pod = box.run_pod(f"k{time.monotonic_ns() % 10**8}", namespace="kube-system")
    out = box.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE]).logs
    box.remove_pod(pod)
    assert smi_lines(out) == [] and "exit 127" in sections(out)["smi"], out
    out = run_probe(box, env={"LD_PRELOAD": "/lib/nothing-here.so"})
    assert f"LD_PRELOAD={SHIM_IN_CONTAINER}:/lib/nothing-here.so" in sections(out)["env"], out
    pod = box.run_pod(f"u{time.monotonic_ns() % 10**8}", annotations={"mokka.io/gpus": "12"})
    with pytest.raises(sandbox.SandboxError, match=re.escape("mokka.io/gpus names GPU '12', which this node does not")):
        box.create_container(pod, images.WORKLOAD_IMAGE, ["true"])
    box.remove_pod(pod)


def test_plugin_returns_after_containerd_restart(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, plugin = node_with_plugin
    box.restart()
    plugin.wait_registered(registrations=2)
    took = time.monotonic() - box.started_at
    assert took < 5
    assert len(smi_lines(run_probe(box))) == 8


def test_killed_or_stopped_plugin_is_replaced(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, plugin = node_with_plugin
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        before = time.monotonic()
        old = plugin.signal_plugin(sig)
        body = plugin.wait_ready_after(before)
        assert body["pid"] != old
        assert len(smi_lines(run_probe(box))) == 8  # the replacement injects


def test_stopped_plugin_does_not_block_containers(
    tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, workload_image: Path
) -> None:
    """Without its supervisor, a stopped plugin delays the next container by containerd's request
    timeout; the container starts (unchanged: NRI fails open)."""
    base = tmp_path_factory.mktemp("st")
    shutil.rmtree(base)
    with sandbox.Sandbox(base, "2.1", nri=True) as box:
        box.import_image(workload_image)
        plugin = PluginProcess(box.nri_socket, Path(layout.root), args=("--no-supervisor",))
        try:
            plugin.wait_registered()
            os.kill(plugin.proc.pid, signal.SIGSTOP)
            try:
                pod = box.run_pod("stopped-plugin")
                result = box.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", "echo started"])
                assert result.exit_code == 0 and "started" in result.logs
                box.remove_pod(pod)
            finally:
                os.kill(plugin.proc.pid, signal.SIGCONT)
        finally:
            plugin.stop()
    assert cleanup.leftovers(base) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_pre_launched_by_containerd(
    version: str, tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, workload_image: Path
) -> None:
    """containerd starts the plugin itself from its plugin directory (socket on fd 3), with the
    script `--print-prelaunch-script` writes, and configures it from its config file (allocator
    external); a crashed plugin process is replaced, dialling the socket, and serves the next
    container as configured."""
    base = tmp_path_factory.mktemp("pl")
    shutil.rmtree(base)
    with sandbox.Sandbox(base, version, nri=True) as box:
        box.import_image(workload_image)
        plugins = base / "nri" / "plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        log = base / "plugin.log"
        argv = ["--print-prelaunch-script", "--root", layout.root, "--socket", str(box.nri_socket)]
        script = subprocess.run(
            [sys.executable, "-m", "nri_mokka", *argv, "--log-file", str(log)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout
        (plugins / "10-mokka").write_text(script)
        (plugins / "10-mokka").chmod(0o755)
        (base / "nri" / "conf.d").mkdir(parents=True, exist_ok=True)
        (base / "nri" / "conf.d" / "10-mokka.conf").write_text("allocator: external\n")
        box.restart()  # containerd launches the plugins of its plugin directory at start

        def wait_log(text: str, count: int = 1) -> None:
            deadline = time.monotonic() + 15
            while not (log.exists() and log.read_text(errors="replace").count(text) >= count):
                assert time.monotonic() < deadline, f"no {text!r} in the plugin log:\n{log.read_text()[-3000:]}"
                time.sleep(0.05)

        wait_log("registered")

        def configured_by_containerd() -> None:  # allocator external, from the plugin's config file
            assert smi_lines(run_probe(box)) == [], log.read_text()[-3000:]
            assert len(smi_lines(run_probe(box, env={"NVIDIA_VISIBLE_DEVICES": "1,3"}))) == 2

        configured_by_containerd()
        assert "pre-connected socket fd 3" in log.read_text()
        serving = [int(ln.split()[2]) for ln in log.read_text().splitlines() if ": registered (pid" in ln][-1]
        os.kill(serving, signal.SIGKILL)
        wait_log("registered", 2)
        configured_by_containerd()  # the replacement keeps containerd's configuration
    assert cleanup.leftovers(base) == []


def test_cdi_device_references_on_containerd_2_1(
    tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, workload_image: Path
) -> None:
    """With --cdi-devices, containerd 2.1 resolves the plugin's CDI references against the
    spec `mokka cdi generate` wrote: the container sees exactly the GPUs asked for."""
    base = tmp_path_factory.mktemp("cr")
    shutil.rmtree(base)
    spec_dir = tmp_path_factory.mktemp("cdi")
    cdi.write(cdi.render(layout), spec_dir)
    logs = tmp_path_factory.mktemp("logs")
    with sandbox.Sandbox(base, "2.1", nri=True, cdi_dirs=[spec_dir]) as box:
        box.import_image(workload_image)
        plugin = PluginProcess(
            box.nri_socket, Path(layout.root), (logs / "plugin.log").open("ab"), args=("--cdi-devices",)
        )
        try:
            plugin.wait_registered()
            out = run_probe(box, pod_annotations={"mokka.io/gpus": "1,3"})
        finally:
            plugin.stop()
    d = profile.load(PROFILE).devices()
    assert smi_lines(out) == [
        f"GPU 0: {d[1].spec.name} (UUID: {d[1].uuid})",
        f"GPU 1: {d[3].spec.name} (UUID: {d[3].uuid})",
    ], out
    nodes = device_nodes(sections(out)["dev"])
    assert {"nvidia1", "nvidia3", "nvidiactl"} <= set(nodes) and "nvidia0" not in nodes
    assert "LD_PRELOAD=/usr/lib/mokka/libmokka-sysfs.so" in sections(out)["env"]  # from the spec's edits
    assert cleanup.leftovers(base) == []


# ---- allocator external: a device plugin or DRA driver allocates


@pytest.fixture(params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def external_node(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    layout: nodelayout.NodeLayout,
    workload_image: Path,
) -> Iterator[tuple[sandbox.Sandbox, PluginProcess]]:
    spec_dir = tmp_path_factory.mktemp("cdi")
    cdi.write(cdi.render(layout), spec_dir)
    yield from plugin_node(
        tmp_path_factory, request.param, layout, workload_image, cdi_dirs=[spec_dir], args=("--allocator", "external")
    )


def test_external_allocator(
    external_node: tuple[sandbox.Sandbox, PluginProcess], layout: nodelayout.NodeLayout
) -> None:
    box, plugin = external_node
    d = profile.load(PROFILE).devices()
    # No allocation: no GPU at all (the standalone default would show all eight).
    out = run_probe(box)
    assert smi_lines(out) == [] and "exit 127" in sections(out)["smi"], out
    assert not [n for n in device_nodes(sections(out)["dev"]) if n.startswith("nvidia")]
    # Envvar mode: exactly the allocated GPUs, with their device nodes, as the NVIDIA runtime gives.
    out = run_probe(box, env={"NVIDIA_VISIBLE_DEVICES": f"{d[1].uuid},{d[3].uuid}"})
    assert smi_lines(out) == [
        f"GPU 0: {d[1].spec.name} (UUID: {d[1].uuid})",
        f"GPU 1: {d[3].spec.name} (UUID: {d[3].uuid})",
    ], out
    nodes = device_nodes(sections(out)["dev"])
    assert sorted(n for n in nodes if n[6:].isdigit()) == ["nvidia1", "nvidia3"], out
    assert {"nvidiactl", "nvidia-uvm"} <= set(nodes)
    # CDI (annotation, CRI field): from the spec, with the plugin up and with no plugin at all.
    for running in (True, False):
        if not running:
            plugin.stop()
        assert_sees_exactly(run_probe(box, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}), layout, 1)
        assert_sees_exactly(run_probe(box, cdi_devices=["nvidia.com/gpu=2"]), layout, 2)


@pytest.fixture(scope="module")
def ib_image(tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout) -> Path:
    """Debian's ibstat, ibstatus, ibv_devinfo, perfquery and sminfo (rdma_image)."""
    tools = ("ibstat", "ibstatus", "perfquery", "sminfo", "ibv_devinfo")
    shim = [Path(layout.sysfs_shim)] if layout.sysfs_shim else []
    return rdma_image.build(tmp_path_factory.mktemp("ib"), "localhost/mokka/ib:1", tools, mounted=shim)


def test_a_gpu_container_reads_the_nodes_infiniband_adapters(
    node_with_plugin: tuple[sandbox.Sandbox, PluginProcess], ib_image: Path, layout: nodelayout.NodeLayout
) -> None:
    """Unmodified ibstat, ibstatus, ibv_devinfo, perfquery and sminfo in a container the plugin gave
    the GPUs: they read the node's adapters through the sysfs tree and shim it mounts, as nvidia-smi
    reads the GPUs' PCI sysfs, and the shim answers libibverbs' device verbs and the umad device."""
    box, _ = node_with_plugin
    box.import_image(ib_image)
    pod = box.run_pod(f"ib{time.monotonic_ns() % 10**8}")
    script = (
        "ibstat -l; echo ---; ibstat mlx5_4; echo ---; dash /usr/sbin/ibstatus mlx5_4; echo ---; "
        "ibv_devinfo -d mlx5_4; echo ---; perfquery -C mlx5_4; echo ---; sminfo -C mlx5_4"
    )
    # The adapters' device nodes, as an RDMA device plugin has kubelet pass them (the GPU plugin
    # does not): without them libibverbs lists no adapter and the umad device does not open.
    ib_nodes = [
        (f"/dev/infiniband/{name}", f"{layout.dev_root}/infiniband/{name}")
        for name, _, _ in infiniband.device_nodes(profile.load(PROFILE))
    ]
    bare = box.run_container(pod, "localhost/mokka/ib:1", ["sh", "-c", "ibv_devinfo; perfquery"])
    assert "No IB devices found" in bare.logs and "Failed to open" in bare.logs, bare.logs
    result = box.run_container(pod, "localhost/mokka/ib:1", ["sh", "-c", script], devices=ib_nodes)
    box.remove_pod(pod)
    listed, one, status, devinfo, counters, sm = result.logs.split("---\n")
    assert listed.split() == [f"mlx5_{i}" for i in range(8)], result.logs
    assert "CA type: MT4129" in one and "State: Active" in one and "Rate: 400" in one, result.logs
    assert "rate:\t\t 400 Gb/sec (4X NDR)" in status, result.logs
    # libibverbs (ibv_devinfo) and the MAD tools (libibumad, libibmad) see the same adapter and port.
    guid = re.search(r"Node GUID: 0x([0-9a-f]{16})", one)
    lid = re.search(r"Base lid: (\d+)", one)
    assert guid and lid, result.logs
    colons = ":".join(guid[1][i : i + 4] for i in range(0, 16, 4))
    assert "hca_id:\tmlx5_4" in devinfo and f"node_guid:\t\t\t{colons}" in devinfo, result.logs
    assert "PORT_ACTIVE (4)" in devinfo and f"port_lid:\t\t{lid[1]}" in devinfo, result.logs
    assert f"# Port counters: Lid {lid[1]} port 1" in counters and "SymbolErrorCounter:..............0" in counters
    assert "sm lid 1 " in sm and "SMINFO_MASTER" in sm, result.logs
