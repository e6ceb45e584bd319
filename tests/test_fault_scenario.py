"""Scenarios: validated like profiles, expanded deterministically from their seed, refused
whole when they do not fit the node, replayed faster with --speed; the shipped ones run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_fixtures import FaultNode

from gpumodel import faults, scenario


def run_cli(node: FaultNode, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mokka.cli", "fault", "run", *args, "--driver-root", str(node.root.root)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "text,problem",
    [
        ("steps: []", "x.yaml: steps: List should have at least 1 item after validation, not 0"),
        ("steps: [{at: soon, xid: 13}]", "x.yaml: steps.0.at: Value error, 'soon' is not a duration"),
        ("steps: [{at: 1s}]", "x.yaml: steps.0: 0 faults; a step names one fault of: xid, lost,"),
        ("steps: [{xid: 13, lost: true}]", "x.yaml: steps.0: 2 faults; a step names one fault of"),
        ("steps: [{xdi: 13}]", "x.yaml: steps.0: unknown key 'xdi'; a step names one fault of"),
        ("steps: [{xid: {code: 13, colour: red}}]", "x.yaml: steps.0.xid.colour: Extra inputs are not permitted"),
        ("steps: [{temperature: {to: 300}}]", "x.yaml: steps.0.temperature.celsius: Input should be less than"),
        ("steps: [{temperature: {to: 90, over: fast}}]", "x.yaml: steps.0.temperature: 'fast' is not a duration"),
        ("steps: [{times: 0, xid: 13}]", "x.yaml: steps.0.times: Input should be greater than or equal to 1"),
        ("steps: [{every: 0s, times: 2, xid: 13}]", "x.yaml: steps.0.every: Value error, must be above 0"),
        ("steps: [{lost: false}]", "x.yaml: steps.0.lost: give lost a mapping of its fields (or true)"),
        ("seed: -1\nsteps: [{xid: 13}]", "x.yaml: seed: Input should be greater than or equal to 0"),
        ("colour: red\nsteps: [{xid: 13}]", "x.yaml: colour: Extra inputs are not permitted"),
        ("steps: [{xid: 13}", "x.yaml: line 1, column 18: not valid YAML"),
        ("- just a list", "x.yaml: a scenario must be a YAML mapping, got list"),
    ],
)
def test_a_bad_scenario_names_file_path_and_problem(text: str, problem: str) -> None:
    with pytest.raises(scenario.ScenarioError) as exc:
        scenario.load_text(text, "x.yaml")
    assert str(exc.value).startswith(problem), str(exc.value)


@pytest.mark.parametrize("value,seconds", [(90, 90.0), ("1.5s", 1.5), ("500ms", 0.5), ("2m", 120.0),
                                           ("1h", 3600.0), ("2m30s", 150.0), ("1h1m1s", 3661.0)])  # fmt: skip
def test_durations(value: object, seconds: float) -> None:
    assert scenario.parse_duration(value) == seconds


def test_the_timeline_is_the_same_for_the_same_seed(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 8)
    s = scenario.load_text(
        "seed: 5\nsteps:\n  - {at: 1s, every: 2s, times: 20, jitter: 1s, gpu: random, xid: 13}\n", "x.yaml"
    )
    gpus = faults.gpus(node.target)
    first = [scenario.describe(e) for e in s.timeline(gpus)]
    assert first == [scenario.describe(e) for e in s.timeline(gpus)]
    assert first == [scenario.describe(e) for e in s.timeline(gpus, seed=5)]
    assert first != [scenario.describe(e) for e in s.timeline(gpus, seed=6)]
    assert len({e.split("GPU ")[1].split(":")[0] for e in first}) > 1, "random GPUs"
    out = run_cli(node, "--dry-run", str(write(node, s_text="seed: 5\nsteps:\n  - {at: 1s, every: 2s, times: 20, "
                                                "jitter: 1s, gpu: random, xid: 13}\n")))  # fmt: skip
    assert out.returncode == 0 and out.stdout.splitlines() == first
    assert run_cli(node, "--dry-run", "--seed", "6", str(write(node, s_text="seed: 5\nsteps:\n  - {at: 1s, every: "
                   "2s, times: 20, jitter: 1s, gpu: random, xid: 13}\n"))).stdout.splitlines() != first  # fmt: skip


def write(node: FaultNode, s_text: str) -> Path:
    path = node.root.root / "scenario.yaml"
    path.write_text(s_text)
    return path


def test_a_scenario_that_does_not_fit_the_node_changes_nothing(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("l40s", 2)  # no NVLink
    before = node.state_bytes
    res = run_cli(node, "flapping-nvlink", "--speed", "1000")
    assert res.returncode != 0
    assert res.stderr == (
        "mokka: error: built-in scenario flapping-nvlink: steps.0: GPU 0 has no NVLink: no link 3, nvlink-errors\n"
    )
    assert node.state_bytes == before and node.kernel_log == ""
    res = run_cli(node, str(write(node, "steps: [{gpu: 5, xid: 13}]")))
    assert res.stderr.startswith(
        f"mokka: error: no GPU '5' on this node (indices 0-1, or a GPU UUID), {node.root.root}"
    )
    res = run_cli(node, str(node.root.root / "missing.yaml"))
    assert res.stderr.startswith("mokka: error: ") and "no such scenario file" in res.stderr


def test_thermal_runaway_replays_faster(fault_node: Callable[..., FaultNode]) -> None:
    node = fault_node("h100", 2)
    res = run_cli(node, "thermal-runaway", "--speed", "500")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1].endswith("GPU 0: xid code=79")
    code = (
        "import pynvml as N; N.nvmlInit()\n"
        "try:\n    N.nvmlDeviceGetHandleByIndex(0)\nexcept N.NVMLError_GpuIsLost:\n    print('lost')\n"
        "h = N.nvmlDeviceGetHandleByIndex(1); print(N.nvmlDeviceGetTemperature(h, 0))"
    )
    lost, other = node.python(code).stdout.split()
    assert lost == "lost" and int(other) < 60, "GPU 1 kept its profile's temperature"
    assert "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in node.kernel_log


def test_a_ramp_ends_where_it_says(fault_node: Callable[..., FaultNode]) -> None:
    """The ramp runs in the library (no daemon): read until it has arrived, then it stays."""
    node = fault_node("h100", 1)
    s = write(node, "steps: [{temperature: {from: 40, to: 90, over: 2s}}]")
    assert run_cli(node, str(s), "--speed", "4").returncode == 0
    code = (
        "import pynvml as N, time; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0); seen = []\n"
        "while not seen or seen[-1] != 90:\n    seen.append(N.nvmlDeviceGetTemperature(h, 0)); time.sleep(0.01)\n"
        "print(seen == sorted(seen), min(seen) >= 40, N.nvmlDeviceGetTemperature(h, 0))"
    )
    assert node.python(code).stdout.split() == ["True", "True", "90"]


@pytest.mark.parametrize("name", scenario.builtin_names())
def test_the_shipped_scenarios_fit_an_h100_node(fault_node: Callable[..., FaultNode], name: str) -> None:
    node = fault_node("h100", 4)
    res = run_cli(node, name, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("\n") == len(scenario.load(name).timeline(faults.gpus(node.target)))
    assert node.fault("list").stdout == "no faults in effect\n", "a dry run changes nothing"
