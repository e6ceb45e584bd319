"""End to end: the NRI plugin on a real containerd (1.7 and 2.1), driven through CRI.

Host setup stages the h100 profile with Debian's nvidia-smi; a private containerd with NRI on
runs ``mokka nri-plugin`` as kubelet's node would. A container from a local image with nothing
NVIDIA inside runs ``nvidia-smi -L`` and sees the profile's GPUs; ``NVIDIA_VISIBLE_DEVICES=1,3``
narrows that to two, renumbered; an opted-out pod sees none; after containerd restarts the
plugin registers again and the next container is injected; a stopped (SIGSTOP) plugin does not
keep containers from starting.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_e2e_cdi import PROBE, PROFILE, device_nodes, sections

from gpumodel import nodelayout, profile
from testbed import cleanup, images, sandbox
from testbed.plugin_process import PluginProcess

pytestmark = [pytest.mark.consumers, pytest.mark.slow, pytest.mark.root]

VERSIONS = ["1.7", "2.1"]


@pytest.fixture(params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def node_with_plugin(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    layout: nodelayout.NodeLayout,
    workload_image: Path,
) -> Iterator[tuple[sandbox.Sandbox, PluginProcess]]:
    base = tmp_path_factory.mktemp("nb")
    shutil.rmtree(base)
    logs = tmp_path_factory.mktemp("logs")
    box = sandbox.Sandbox(base, request.param, nri=True, log_file=logs / "containerd.log")
    with box:
        box.import_image(workload_image)
        plugin = PluginProcess(box.nri_socket, Path(layout.root), (logs / "plugin.log").open("ab"))
        try:
            plugin.wait_registered()
            yield box, plugin
        finally:
            plugin.stop()
    assert cleanup.leftovers(base) == []


def run_probe(
    box: sandbox.Sandbox, pod_annotations: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> str:
    pod = box.run_pod(f"p{time.monotonic_ns() % 10**8}", annotations=pod_annotations or {})
    result = box.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], env=env or {})
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


def test_plugin_returns_after_containerd_restart(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, plugin = node_with_plugin
    box.restart()
    plugin.wait_registered(registrations=2)  # how fast: `mokka bench nri` (tests never time anything)
    assert len(smi_lines(run_probe(box))) == 8


def test_stopped_plugin_does_not_block_containers(node_with_plugin: tuple[sandbox.Sandbox, PluginProcess]) -> None:
    box, plugin = node_with_plugin
    os.kill(plugin.proc.pid, signal.SIGSTOP)
    try:
        pod = box.run_pod("stopped-plugin")
        result = box.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", "echo started"])
        assert result.exit_code == 0 and "started" in result.logs
        box.remove_pod(pod)
    finally:
        os.kill(plugin.proc.pid, signal.SIGCONT)


@pytest.mark.parametrize("version", VERSIONS)
def test_pre_launched_by_containerd(
    version: str, tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, workload_image: Path
) -> None:
    """containerd starts the plugin itself from its plugin directory (socket on fd 3)."""
    base = tmp_path_factory.mktemp("pl")
    shutil.rmtree(base)
    with sandbox.Sandbox(base, version, nri=True) as box:
        box.import_image(workload_image)
        plugins = base / "nri" / "plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        script = plugins / "10-mokka"
        repo = Path(__file__).resolve().parent.parent
        script.write_text(
            f"#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} -m mokka.cli nri-plugin --root {layout.root} "
            f">>{base}/plugin.log 2>&1\n"
        )
        script.chmod(0o755)
        box.restart()  # containerd launches the plugins of its plugin directory at start
        log = base / "plugin.log"
        deadline = time.monotonic() + 15
        while not (log.exists() and "registered" in log.read_text(errors="replace")):
            assert time.monotonic() < deadline, "pre-launched plugin did not register"
            time.sleep(0.05)
        assert len(smi_lines(run_probe(box))) == 8
        assert "pre-connected socket fd 3" in (base / "plugin.log").read_text()
    assert cleanup.leftovers(base) == []


def test_cdi_device_references_on_containerd_2_1(
    tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, workload_image: Path
) -> None:
    """With --cdi-devices, containerd 2.1 resolves the plugin's CDI references against the
    spec `mokka cdi generate` wrote: the container sees exactly the GPUs asked for."""
    import cdi

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
