"""`mokka bench fleet`'s parts that need no cluster: for --hold, the process figures read from a
``/metrics`` text, the least-squares fit, the rows (slopes per 1000 nodes, the projection to
100,000); for --pods and --fgo, the rows beside fake-gpu-operator's with their ratios, the plot's
figures and what counts as a node FGO has served; the options' checks."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bench import fleet, fleet_fgo, fleet_hold
from bench.fleet_nodes import Side
from mokka.cli import main

METRICS = """\
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1234.5
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 5.24288e+08
process_resident_memory_bytes_max 1
apiserver_request_total{code="200",verb="GET"} 7
"""


def test_process_figures_are_read_from_a_metrics_text() -> None:
    assert fleet_hold.process_figures(METRICS) == (1234.5, 524288000.0)
    labelled = 'process_cpu_seconds_total{pod="x"} 2\nprocess_resident_memory_bytes{pod="x"} 3e3\n'
    assert fleet_hold.process_figures(labelled) == (2.0, 3000.0)


def test_metrics_without_process_figures_give_none() -> None:
    assert fleet_hold.process_figures("process_cpu_seconds_total 1\n") is None
    assert fleet_hold.process_figures("# nothing\nprocess_cpu_seconds_totalx 1\n") is None


def test_fit_is_least_squares() -> None:
    assert fleet_hold.fit([0, 1, 2], [1, 3, 5]) == pytest.approx((2.0, 1.0))
    slope, intercept = fleet_hold.fit([0, 10, 20], [100, 120, 130])  # not on a line
    assert slope == pytest.approx(1.5) and intercept == pytest.approx(101.6666667)
    assert fleet_hold.fit([5], [7]) == (0.0, 7.0)
    with pytest.raises(ValueError):
        fleet_hold.fit([], [])


def held(cores: float, mib: float) -> dict[str, fleet_hold.Sample]:
    """The API server's figures, and a tenth of them for the controller (KWOK not sampled)."""
    return {
        "API server": fleet_hold.Sample(cores, mib * 2**20),
        "fleet controller": fleet_hold.Sample(cores / 10, mib / 10 * 2**20),
    }


def test_rows_give_every_step_the_slopes_and_the_projection() -> None:
    steps = [
        fleet_hold.Step(0, samples=held(0.10, 400)),
        fleet_hold.Step(10_000, made_s=50.0, ready_s=80.0, samples=held(0.30, 900)),
        fleet_hold.Step(20_000, made_s=25.0, ready_s=40.0, samples=held(0.50, 1400)),
    ]
    rows = {figure: (value, target) for figure, value, target in fleet_hold.Hold(steps).rows()}
    assert rows["10000 nodes: 10000 made"] == ("50.0 s", "")
    assert rows["10000 nodes: node creation"] == ("200 nodes/s", ">= 500 nodes/s MISSED")
    assert rows["10000 nodes: 10000 Ready"] == ("80.0 s", "<= 120 s")  # from the pool's creation
    assert rows["20000 nodes: node creation"] == ("400 nodes/s", ">= 500 nodes/s MISSED")
    assert rows["20000 nodes: 10000 Ready"] == ("40.0 s", "")  # a scale: no target
    assert rows["0 nodes held: API server"] == ("0.100 cores 400 MiB", "")
    assert rows["20000 nodes held: fleet controller"] == ("0.050 cores 140 MiB", "")
    assert "0 nodes held: KWOK" not in rows  # not sampled: left out
    assert rows["per 1000 nodes: API server"] == ("+0.0200 cores +50.0 MiB", "")
    assert rows["projected at 100000 nodes: API server"] == ("2.10 cores 5.3 GiB", "")  # 400 + 100 * 50 MiB
    assert rows["per 1000 nodes: fleet controller"] == ("+0.0020 cores +5.0 MiB", "")
    assert "per 1000 nodes: KWOK" not in rows


def test_a_component_sampled_once_gets_no_slope() -> None:
    steps = [fleet_hold.Step(0), fleet_hold.Step(500, made_s=1.0, ready_s=2.0, samples=held(0.2, 300))]
    rows = {figure for figure, _, _ in fleet_hold.Hold(steps).rows()}
    assert "500 nodes: node creation" in rows
    assert not [r for r in rows if r.startswith(("per 1000", "projected"))]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hold", "10,x"], "--hold 10,x: give node counts separated by commas"),
        (["--hold", "20,10"], "--hold 20,10: give ascending node counts from 1 to 100000"),
        (["--hold", "0,10"], "--hold 0,10: give ascending node counts from 1 to 100000"),
        (["--hold", "10,10"], "--hold 10,10: give ascending node counts from 1 to 100000"),
        (["--hold", "10", "--nodes", "5"], "--hold sets the pool's sizes: leave out --nodes"),
        (["--hold", "10", "--prometheus", "p"], "--hold reads the components' own metrics: leave out --prometheus"),
        (["--hold", "10", "--pods", "5"], "--hold holds the pool alone: leave out --pods and --fgo"),
        (["--hold", "10", "--fgo", "scale"], "--hold holds the pool alone: leave out --pods and --fgo"),
        (["--svg", "out"], "--svg plots Mokka beside fake-gpu-operator: give --fgo POOL too"),
    ],
)
def test_hold_refuses_what_it_cannot_do(args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["bench", "fleet", *args])
    assert res.exit_code == 1
    assert message in res.output


def test_rows_set_every_figure_beside_fake_gpu_operators() -> None:
    mokka = Side(1000, made_s=20.0, ready_s=30.0, bound_s=8.0, running_s=12.0, deleted_s=9.0)
    fgo = Side(1000, made_s=25.0, ready_s=60.0, bound_s=10.0, running_s=10.0, deleted_s=11.0)
    result = fleet.Result(mokka, pods=200, peer=fgo, peer_pool="scale")
    rows = {figure: (value, target) for figure, value, target in result.rows()}
    assert rows["1000 nodes Ready"] == ("30.0 s", "")
    assert rows["200 one-GPU pods bound"] == ("8.0 s", "")
    assert rows["200 one-GPU pods Running"] == ("12.0 s", "")
    assert rows["fake-gpu-operator: 1000 nodes made (pool scale)"] == ("25.0 s", "")
    assert rows["fake-gpu-operator: 1000 nodes Ready with GPUs"] == ("60.0 s", "")
    assert rows["fake-gpu-operator: 200 one-GPU pods Running"] == ("10.0 s", "")
    assert rows["fake-gpu-operator: nodes deleted -> every node gone"] == ("11.0 s", "")
    assert rows["ratio 1000 nodes Ready (Mokka / FGO)"] == ("0.50", "<= 1")
    assert rows["ratio 200 pods bound (Mokka / FGO)"] == ("0.80", "<= 1")
    assert rows["ratio 200 pods Running (Mokka / FGO)"] == ("1.20", "<= 1 MISSED")
    assert result.times() == {
        "1000 nodes Ready": {"Mokka": 30.0, "fake-gpu-operator": 60.0},
        "200 pods bound": {"Mokka": 8.0, "fake-gpu-operator": 10.0},
        "200 pods Running": {"Mokka": 12.0, "fake-gpu-operator": 10.0},
    }


def test_without_pods_or_a_peer_no_pod_rows_and_no_ratios() -> None:
    result = fleet.Result(Side(10, made_s=1.0, ready_s=2.0))
    figures = [figure for figure, _, _ in result.rows()]
    assert figures == ["10 nodes made", "node creation", "10 nodes Ready"]
    assert result.times() == {}
    result = fleet.Result(Side(10, made_s=1.0, ready_s=2.0), peer=Side(10, made_s=1.0, ready_s=4.0), peer_pool="p")
    assert [f for f, _, _ in result.rows() if f.startswith("ratio")] == ["ratio 10 nodes Ready (Mokka / FGO)"]
    assert result.times() == {"10 nodes Ready": {"Mokka": 2.0, "fake-gpu-operator": 4.0}}


def fgo_node(ready: bool = True, gpus: str | None = "8", product: bool = True) -> dict[str, object]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"} if product else {}
    status: dict[str, object] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if gpus is not None:
        status["allocatable"] = {"cpu": "1k", "nvidia.com/gpu": gpus}
    return {"metadata": {"name": "bench-fgo-0", "labels": labels}, "status": status}


def test_a_node_fgo_has_served_is_ready_with_gpus_and_its_product_label() -> None:
    assert fleet_fgo.gpus_served(fgo_node())
    assert not fleet_fgo.gpus_served(fgo_node(ready=False))
    assert not fleet_fgo.gpus_served(fgo_node(gpus=None))  # KWOK made it Ready before FGO's device plugin
    assert not fleet_fgo.gpus_served(fgo_node(gpus="0"))
    assert not fleet_fgo.gpus_served(fgo_node(product=False))  # before status-exporter-kwok labelled it
