"""Workloads as GPU processes: a container given GPUs shows in their running-process lists.

Unit level: ``gpumodel.processes`` against a private staged driver root, read back through the
real NVML binding (pynvml, in a subprocess against the staged library); the plugin's reading of
NRI's container events; the stub handing those events over after answering them; the plugin
listing a started container through its helper process and taking it off at stop. End to end:
a real containerd (1.7 and 2.1) with the plugin, a container asking for two GPUs with
``mokka.io/gpu-memory``: exactly those two list its host PID, and nothing after it is gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_fixtures import FaultNode
from test_e2e_nri import plugin_node
from test_nri_stub import FakeRuntime, running, wait_for

from containers import images, sandbox
from containers.plugin_process import PluginProcess
from gpumodel import nodelayout, processes, profile, state
from gpumodel.profile import MIB
from hostsetup import node
from nri_mokka import plugin, workloads
from nri_mokka.nri import wire
from nri_mokka.nri._pb.nri.pkg.api import v1alpha1 as api
from nri_mokka.nri.stub import EVENTS, Stub, event_mask

PROBE = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    procs = [[p.pid, p.usedGpuMemory // (1 << 20), pynvml.nvmlSystemGetProcessName(p.pid)]
             for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    out.append({"procs": procs, "used": pynvml.nvmlDeviceGetMemoryInfo(h).used // (1 << 20)})
print(json.dumps(out))
"""


def nvml_view(run: Callable[[str], str]) -> list[dict[str, Any]]:
    """Per GPU: its compute processes ([pid, MiB, name]) and memory used (MiB), as NVML says."""
    result: list[dict[str, Any]] = json.loads(run(PROBE))
    return result


def staged_view(n: FaultNode) -> list[dict[str, Any]]:
    return nvml_view(lambda code: n.python(code).stdout)


# ---- gpumodel.processes


def test_add_lists_the_pids_and_their_memory_and_remove_takes_them_back(fault_node: Callable[..., FaultNode]) -> None:
    n = fault_node("h100", 4)
    path = n.target.state
    before = staged_view(n)
    assert all(g["procs"] == [] for g in before)
    assert processes.add(path, [1, 3], [4242, 4243], "python3", 2048) == 4
    view = staged_view(n)
    for i in (1, 3):
        assert view[i]["procs"] == [[4242, 2048, "python3"], [4243, 2048, "python3"]]
        assert view[i]["used"] == before[i]["used"] + 2 * 2048
    for i in (0, 2):
        assert view[i] == before[i]
    # Listed again: replaced, not doubled; another workload beside it.
    assert processes.add(path, [3], [4243], "python3", 1024) == 1
    assert processes.add(path, [3], [77], "train", 512) == 1
    view = staged_view(n)
    assert view[3]["procs"] == [[4242, 2048, "python3"], [4243, 1024, "python3"], [77, 512, "train"]]
    assert view[3]["used"] == before[3]["used"] + 2048 + 1024 + 512
    assert processes.remove(path, [4242, 4243]) == 4
    view = staged_view(n)
    assert view[3]["procs"] == [[77, 512, "train"]] and view[3]["used"] == before[3]["used"] + 512
    assert view[1] == before[1]
    assert processes.remove(path, [77]) == 1
    assert processes.remove(path, [77]) == 0
    assert staged_view(n) == before


def test_a_gpu_lists_at_most_max_procs(
    fault_node: Callable[..., FaultNode], capsys: pytest.CaptureFixture[str]
) -> None:
    n = fault_node("h100", 2)
    limit = state.const("MOKKA_MAX_PROCS")
    pids = list(range(1000, 1000 + limit + 3))
    assert processes.add(n.target.state, [0], pids, "w", 10) == limit
    assert "at most 16 processes" in capsys.readouterr().err
    view = staged_view(n)
    assert [p[0] for p in view[0]["procs"]] == pids[:limit]
    assert processes.remove(n.target.state, pids) == limit
    assert staged_view(n)[0]["procs"] == []


def test_bad_requests_change_nothing(fault_node: Callable[..., FaultNode]) -> None:
    n = fault_node("h100", 2)
    before = n.state_bytes
    with pytest.raises(ValueError, match="no GPU 5"):
        processes.add(n.target.state, [0, 5], [1], "w", 10)
    with pytest.raises(ValueError, match="negative"):
        processes.add(n.target.state, [0], [1], "w", -1)
    assert n.state_bytes == before


def test_memory_never_goes_below_zero(fault_node: Callable[..., FaultNode]) -> None:
    n = fault_node("h100", 1)
    path = n.target.state
    processes.add(path, [0], [9], "w", 100)

    def drop_used(_node: Any, gpus: Any) -> None:  # something else lowered the memory meanwhile
        gpus[0].mem_used = 10 * MIB

    state.update(path, drop_used)
    processes.remove(path, [9])
    f = state.ffi()
    with state.locked(path) as mm:  # both copies carry the result of the last publish
        h = f.cast("mokka_header_t *", f.from_buffer(mm))
        size = f.sizeof("mokka_node_t") + h.gpu_count * f.sizeof("mokka_gpu_t")
        start = f.sizeof("mokka_header_t") + (h.seq & 1) * size
        del h
        live = bytearray(mm[start : start + size])
    g = f.cast("mokka_gpu_t *", f.from_buffer(live) + f.sizeof("mokka_node_t"))
    assert (g[0].mem_used, g[0].n_procs) == (0, 0)


# ---- reading NRI's container events


def test_field_numbers_are_the_protos() -> None:
    """The numbers workloads.py reads by, against Mokka's proto (checked against NRI's own by
    test_nri_wire.py)."""
    assert bytes(api.Container(pid=7)) == wire.encode_varint_field(workloads.CONTAINER_PID, 7)
    assert bytes(api.Container(args=["x"])) == wire.encode_bytes(workloads.CONTAINER_ARGS, b"x")
    assert bytes(api.Container(id="x")) == wire.encode_bytes(workloads.CONTAINER_ID, b"x")
    change = api.StateChangeEvent(
        event=api.Event.REMOVE_CONTAINER, pod=api.PodSandbox(id="p"), container=api.Container(id="c")
    )
    assert [n for n, *_ in wire.fields(bytes(change))] == [1, workloads.EVENT_POD, workloads.EVENT_CONTAINER]
    assert workloads.DEFAULT_MEMORY_MIB == processes.DEFAULT_MEMORY_MIB
    from gpumodel.mig_devices import FABRIC_IMEX_MINOR

    assert f"/dev/nvidia-caps/nvidia-cap{FABRIC_IMEX_MINOR}" == workloads.IMEX_MGMT_NODE
    assert workloads.ANNOTATION_MEMORY.startswith("mokka.io/")


LAYOUT = nodelayout.NodeLayout(
    root="/r",
    profile="h100",
    driver_version="550.54.15",
    libdir="/r/lib",
    state="/r/lib/libnvidia-ml.so.550.54.15",
    dev_root="/r/dev",
    gpu_major=195,
    uvm_major=510,
    gpus=tuple(nodelayout.GpuNode(i, f"GPU-{i}", f"0000:{i:02x}:00.0", 10 + i) for i in range(4)),
)


def event(**container: Any) -> workloads.Event:
    pod = api.PodSandbox(id="p", name="trainer", annotations=container.pop("pod_annotations", {}))
    c = api.Container(id="c1", name="main", **container)
    return workloads.Event(bytes(api.StateChangeEvent(event=7, pod=pod, container=c)))


def test_event_reading() -> None:
    devices = api.LinuxContainer(
        devices=[api.LinuxDevice(path=p) for p in ("/dev/nvidiactl", "/dev/nvidia13", "/dev/nvidia11")]
    )
    e = event(
        pid=4321,
        args=["python3", "train.py"],
        env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1,3"],
        linux=devices,
        annotations={"mokka.io/gpu-memory": "2Gi"},
        pod_annotations={"mokka.io/gpu-memory": "100"},
    )
    assert (e.container_id, e.name, e.pid, e.args0, e.visible) == ("c1", "main", 4321, "python3", "1,3")
    assert e.devices == [13, 11] and e.memory == "2Gi" and e.process_name() == "python3"
    assert workloads.gpus_of(e, LAYOUT) == [1, 3]  # the device nodes are the allocation
    assert event(pod_annotations={"mokka.io/gpu-memory": "100"}).memory == "100"


def test_an_imex_daemon_is_no_gpu_workload() -> None:
    """A ComputeDomain's IMEX daemon gets every /dev/nvidiaN (NVIDIA's management device) and the
    fabric-imex-mgmt capability: it manages the fabric and is listed on no GPU."""
    paths = ("/dev/nvidiactl", "/dev/nvidia10", "/dev/nvidia11", workloads.IMEX_MGMT_NODE)
    devices = api.LinuxContainer(devices=[api.LinuxDevice(path=p) for p in paths])
    e = event(linux=devices, env=["NVIDIA_VISIBLE_DEVICES=void"])
    assert e.imex_daemon and e.devices == [10, 11] and workloads.gpus_of(e, LAYOUT) == []


@pytest.mark.parametrize(
    ("visible", "gpus"),
    [("all", [0, 1, 2, 3]), ("2,GPU-0", [0, 2]), ("none", []), ("void", []), ("", []), ("1:0,9", [1])],
)
def test_gpus_from_the_environment(visible: str, gpus: list[int]) -> None:
    assert workloads.gpus_of(event(env=[f"NVIDIA_VISIBLE_DEVICES={visible}"]), LAYOUT) == gpus
    assert workloads.gpus_of(event(), LAYOUT) == []


def test_memory_annotation() -> None:
    assert workloads.memory_mib(None) == 1024
    assert [workloads.memory_mib(v) for v in ("2048", " 512Mi", "3GiB", "1 Gi", "0")] == [2048, 512, 3072, 1024, 0]
    for bad in ("", "-1", "1.5Gi", "lots"):
        with pytest.raises(ValueError, match=r"mokka\.io/gpu-memory"):
            workloads.memory_mib(bad)


# ---- the stub and the plugin


class EventRecorder:
    events = event_mask([EVENTS[e] for e in ("CREATE_CONTAINER", "POST_START_CONTAINER", "STOP_CONTAINER")])

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes]] = []

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
        pass

    def create_container(self, payload: bytes) -> bytes:
        return b""

    def warm_up(self) -> None:
        pass

    def container_event(self, event: int, payload: bytes) -> None:
        self.seen.append((event, payload))
        raise RuntimeError("recording failed")  # never reaches the runtime


def test_the_stub_hands_container_events_over_after_answering(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    p = EventRecorder()
    stub = Stub(p, name="mokka", idx="10", socket_path=tmp_path / "nri.sock", env={})
    with running(stub):
        session = runtime.next_session()
        assert session.configure().events == p.events
        pod, c = api.PodSandbox(id="p"), api.Container(id="c", pid=12)
        started = bytes(api.StateChangeEvent(event=api.Event.POST_START_CONTAINER, pod=pod, container=c))
        assert session.raw_call("StateChange", started) == b""
        stop = bytes(api.StopContainerRequest(pod=pod, container=c))
        assert api.StopContainerResponse().parse(session.raw_call("StopContainer", stop)).update == []
        wait_for(lambda: len(p.seen) == 2)
        assert p.seen == [(7, started), (10, stop)]
        assert session.raw_call("StateChange", b"\xff\xff") == b""  # not a message: one log line
        assert session.raw_call("StateChange", started) == b""  # and the connection serves on
        wait_for(lambda: len(p.seen) == 3)
        session.close()
    runtime.stop()


@pytest.fixture
def staged_root(tmp_path: Path) -> Iterator[Path]:
    r = tmp_path / "root"
    node.apply(node.plan(profile.load("h100").with_count(4), node.Options(root=r, majors="real")))
    yield r
    node.cleanup(r)


def layout_view(layout: nodelayout.NodeLayout) -> list[dict[str, Any]]:
    import subprocess

    env = {"LD_LIBRARY_PATH": layout.libdir, "PATH": "/usr/bin:/bin"}
    return nvml_view(
        lambda code: (
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
            ).stdout
        )
    )


def wait_view(
    layout: nodelayout.NodeLayout, want: Callable[[list[dict[str, Any]]], bool], timeout: float = 20
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        view = layout_view(layout)
        if want(view):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.1)


def test_the_plugin_lists_a_started_container_until_it_exits(staged_root: Path) -> None:
    """Its start lists it (real processes stand in for containers' init processes); its exit,
    seen by the helper's pidfd, takes it off: no stop event is subscribed to. The helper outlives
    the plugin process that started it until the last process it listed has exited."""
    layout = nodelayout.NodeLayout.load(staged_root)
    p = plugin.MokkaPlugin(staged_root)
    assert p.events & event_mask([EVENTS["POST_START_CONTAINER"]])
    assert not p.events & event_mask([EVENTS["STOP_CONTAINER"], EVENTS["REMOVE_CONTAINER"]])
    pod = api.PodSandbox(id="p", name="trainer", annotations={"mokka.io/gpu-memory": "3072"})
    first, second = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    c = api.Container(
        id="c1", name="main", pid=first.pid, args=["/usr/bin/python3"], env=["NVIDIA_VISIBLE_DEVICES=0,2"]
    )
    untouched = api.Container(id="c2", name="side", pid=second.pid, env=["NVIDIA_VISIBLE_DEVICES=void"])
    other = api.Container(id="c3", name="other", pid=second.pid, args=["sleep"], env=["NVIDIA_VISIBLE_DEVICES=1"])
    try:
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=pod, container=untouched)))
        assert p._recorder is None  # no GPUs, nothing to write: no helper either
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=pod, container=c)))
        view = wait_view(layout, lambda v: bool(v[0]["procs"]))
        assert [g["procs"] for g in view] == [
            [[first.pid, 3072, "/usr/bin/python3"]],
            [],
            [[first.pid, 3072, "/usr/bin/python3"]],
            [],
        ]
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=pod, container=other)))
        wait_view(layout, lambda v: bool(v[1]["procs"]))
        first.kill()
        first.wait()
        view = wait_view(layout, lambda v: not v[0]["procs"])
        assert [g["procs"] for g in view] == [[], [[second.pid, 3072, "sleep"]], [], []]
        assert p._recorder is not None and p._recorder.proc is not None
        p._recorder.close()  # the plugin process goes: its helper stays while c3 runs
        time.sleep(0.3)
        assert p._recorder.proc.poll() is None
        second.kill()
        second.wait()
        wait_view(layout, lambda v: all(g["procs"] == [] for g in v))
        p._recorder.proc.wait(10)  # and then exits
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
        if p._recorder is not None and p._recorder.proc is not None:
            p._recorder.close()
            p._recorder.proc.wait(10)


def test_a_container_gone_before_its_start_event_is_not_listed(staged_root: Path) -> None:
    """A short-lived container can exit before its start reaches the plugin (containerd sends the
    exit from its exit monitor, PostStartContainer from StartContainer, concurrently): the
    helper finds its process gone and does not list it."""
    layout = nodelayout.NodeLayout.load(staged_root)
    p = plugin.MokkaPlugin(staged_root)
    pod = api.PodSandbox(id="p", name="quick")
    gone = subprocess.Popen(["true"])
    gone.wait()
    running_one = subprocess.Popen(["sleep", "60"])
    c = api.Container(id="c1", name="main", pid=gone.pid, args=["nvidia-smi"], env=["NVIDIA_VISIBLE_DEVICES=1"])
    later = api.Container(id="c2", name="main", pid=running_one.pid, args=["sleep"], env=["NVIDIA_VISIBLE_DEVICES=1"])
    try:
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=pod, container=c)))
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=pod, container=later)))
        view = wait_view(layout, lambda v: bool(v[1]["procs"]))
        assert [g["procs"] for g in view] == [[], [[running_one.pid, 1024, "sleep"]], [], []]  # c2 alone
    finally:
        running_one.kill()
        running_one.wait()
        if p._recorder is not None and p._recorder.proc is not None:
            p._recorder.close()
            p._recorder.proc.wait(10)


def test_without_pidfds_the_helper_checks_proc(staged_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without pidfd_open (before 5.3): a listed process is checked in /proc instead, and
    taken off once it is gone."""
    import errno

    layout = nodelayout.NodeLayout.load(staged_root)

    def no_pidfds(pid: int) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(workloads.os, "pidfd_open", no_pidfds)
    helper = workloads.Helper()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        order = {"op": "add", "state": layout.state, "what": "x", "pids": [sleeper.pid], "gpus": [2], "name": "s",
                 "mib": 5}  # fmt: skip
        helper.handle(json.dumps(order).encode())
        assert helper.busy and not helper.watched
        assert [g["procs"] for g in layout_view(layout)][2] == [[sleeper.pid, 5, "s"]]
        helper.check_unwatchable()
        assert helper.busy  # still running
    finally:
        sleeper.kill()
        sleeper.wait()
    helper.check_unwatchable()
    assert not helper.busy and all(g["procs"] == [] for g in layout_view(layout))


def test_a_broken_state_is_one_log_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The helper logs what it cannot do and carries on; the plugin never raises."""
    r = tmp_path / "root"
    node.apply(node.plan(profile.load("h100").with_count(2), node.Options(root=r, majors="real")))
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        layout = nodelayout.NodeLayout.load(r)
        p = plugin.MokkaPlugin(r)
        c = api.Container(
            id="c1",
            name="main",
            pid=sleeper.pid,
            env=["NVIDIA_VISIBLE_DEVICES=0,1"],
            annotations={"mokka.io/gpu-memory": "lots"},
        )
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=api.PodSandbox(id="p"), container=c)))
        view = wait_view(layout, lambda v: bool(v[1]["procs"]))
        assert view[1]["procs"][0][:2] == [sleeper.pid, 1024]  # a bad size: the default, and a log line
        p.container_event(7, b"\xff\xff")  # not a message at all
        assert p._recorder is not None and p._recorder.proc is not None
        p._recorder.send({"op": "remove", "state": str(tmp_path / "missing"), "pids": [1]})
        p._recorder.send({"op": "remove", "state": layout.state, "pids": [sleeper.pid]})
        wait_view(layout, lambda v: all(g["procs"] == [] for g in v))
        sleeper.kill()  # its exit: taken off again, which changes nothing
        p._recorder.close()
        p._recorder.proc.wait(10)
    finally:
        sleeper.kill()
        sleeper.wait()
        node.cleanup(r)
    err = capfd.readouterr().err
    assert "'lots' is not a size in MiB" in err
    assert "GPU processes: event 7:" in err
    assert "GPU processes: FileNotFoundError" in err or "GPU processes: StateError" in err, err


# ---- end to end: containerd, CRI, the plugin, NVML on the host

VERSIONS = ["1.7", "2.1"]


@pytest.fixture(params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def gpu_node(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    layout: nodelayout.NodeLayout,
    workload_image: Path,
) -> Iterator[tuple[sandbox.Sandbox, PluginProcess]]:
    yield from plugin_node(tmp_path_factory, request.param, layout, workload_image)


@pytest.mark.consumers
@pytest.mark.slow
@pytest.mark.root
def test_a_container_is_a_process_on_its_gpus(
    gpu_node: tuple[sandbox.Sandbox, PluginProcess], layout: nodelayout.NodeLayout
) -> None:
    box, _ = gpu_node
    before = layout_view(layout)
    assert all(g["procs"] == [] for g in before)
    annotations = {"mokka.io/gpus": "1,3", "mokka.io/gpu-memory": "3072"}
    pod = box.run_pod(f"w{time.monotonic_ns() % 10**8}", annotations=annotations)
    cid = box.create_container(pod, images.WORKLOAD_IMAGE, ["sleep", "600"])
    box.start_container(cid)
    pid = int(box.container_info(cid)["pid"])
    assert pid > 0
    view = wait_view(layout, lambda v: bool(v[1]["procs"] and v[3]["procs"]))
    assert [g["procs"] for g in view] == [[[pid, 3072, "sleep"]] if i in (1, 3) else [] for i in range(8)], view
    assert [g["used"] - b["used"] for g, b in zip(view, before, strict=True)] == [0, 3072, 0, 3072, 0, 0, 0, 0]
    box.remove_container(cid)  # StopContainer, then RemoveContainer
    assert wait_view(layout, lambda v: all(g["procs"] == [] for g in v)) == before
    box.remove_pod(pod)


@pytest.mark.parametrize(
    ("env", "annotations"),
    [(["NVIDIA_VISIBLE_DEVICES=all"], {}), (["NVIDIA_VISIBLE_DEVICES=0"], {"mokka.io/gpu-memory": "0"})],
)
def test_monitoring_agents_are_not_processes(tmp_path: Path, env: list[str], annotations: dict[str, str]) -> None:
    """A container asking for every GPU (dcgm-exporter, GPU Operator's operands) or for no GPU
    memory holds no CUDA context: it is listed nowhere."""
    r = tmp_path / "root"
    node.apply(node.plan(profile.load("h100").with_count(2), node.Options(root=r, majors="real")))
    try:
        p = plugin.MokkaPlugin(r)
        c = api.Container(id="c1", name="exporter", pid=99, env=env, annotations=annotations)
        p.container_event(7, bytes(api.StateChangeEvent(event=7, pod=api.PodSandbox(id="p"), container=c)))
        assert p._recorder is None  # nothing was sent to be written
    finally:
        node.cleanup(r)
