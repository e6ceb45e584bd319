"""`mokka bench ...`: figures side by side with their targets."""

from __future__ import annotations

import time
from pathlib import Path

import click

from .root import GPUS_OPTION, KUBECONFIG_OPTION, fail, load_profile, main


@main.group()
def bench() -> None:
    """Benchmarks: print figures side by side with their targets (tests never time anything)."""


@bench.command("nvml")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@GPUS_OPTION
@click.option(
    "--nvidia-smi",
    "smi",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="nvidia-smi binary to time (default: search the cache and PATH).",
)
@click.option("--calls", type=click.IntRange(min=1), default=1_000_000, show_default=True, help="Calls per getter.")
@click.option(
    "--svg",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also draw the call costs, the start-up and nvidia-smi's wall time as SVG plots into this directory.",
)
def bench_nvml(profile_name: str, gpus: int | None, smi: str | None, calls: int, svg: Path | None) -> None:
    """The mock library: ns per call, nvmlInit time, nvidia-smi wall time and RSS, size."""
    from bench import nvml as benchmarks

    p = load_profile(profile_name, gpus if gpus is not None else 8)
    benchmarks.run(p, smi, calls, svg=svg)


@bench.command("dcgm")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@click.option("--rounds", type=click.IntRange(min=1), default=15, show_default=True, help="Scrapes and queries.")
@click.option(
    "--svg",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also draw the scrape beside nvidia-smi's query as an SVG plot into this directory.",
)
def bench_dcgm(profile_name: str, rounds: int, svg: Path | None) -> None:
    """NVIDIA's dcgm-exporter on the mock libdcgm: start time and /metrics scrape latency for 8 and 64
    GPUs, against nvidia-smi --query-gpu over the same fields (target: 8 GPUs no slower). The
    exporter's binary comes from $MOKKA_DCGM_DIR."""
    from bench import dcgm as bench_dcgm

    bench_dcgm.run(load_profile(profile_name, None), rounds, svg)


@bench.command("nri")
@click.option(
    "--containerd",
    "versions",
    type=click.Choice(["1.7", "2.1"]),
    multiple=True,
    default=["1.7", "2.1"],
    show_default=True,
    help="containerd version(s), each in its own private sandbox.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Interleaved rounds (no plugin / CDI edits / plugin).",
)
@click.option(
    "--creates",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="CreateContainer calls per round and side.",
)
@click.option(
    "--restarts",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="containerd restarts to time re-registration.",
)
@click.option(
    "--kills",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="SIGKILLs and SIGSTOPs of the plugin to time its return.",
)
@click.option(
    "--sync-containers",
    type=click.IntRange(min=0),
    default=500,
    show_default=True,
    help="Containers on the node for Synchronize (0: skip).",
)
@click.option(
    "--background-pods",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Pods (with a container each) on the node throughout, as on a node running workloads: containerd "
    "2.1's create slows with them (4.1 ms on an empty node, 7.7 ms beside 100 pods, measured here), what a "
    "plugin adds does not.",
)
@click.option(
    "--pod-containers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Containers each side's pod holds throughout, made through that side (a busy GPU pod): containerd "
    "2.1 decodes the spec of every container in the pod at each create, so the size of the edits counts there.",
)
@click.option(
    "--chaos", is_flag=True, help="Also: random SIGKILL/SIGSTOP of the plugin during --chaos-creates creates."
)
@click.option(
    "--chaos-creates", type=click.IntRange(min=1), default=200, show_default=True, help="Creates during --chaos."
)
@click.option("--seed", type=int, default=None, help="Seed of the chaos (default: random).")
@click.option(
    "--previous",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Also time an earlier implementation: `mokka nri-plugin` of this checkout (with its .venv, else this one's).",
)
@click.option(
    "--peer",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Also time upstream Mokka's Go NRI plugin: a directory holding NVIDIA's nvml-mock-nri, plain or .xz "
    "(e.g. ../shared/thirdparty/nvml-mock-nri), plainly and with its device opt-in annotation (the node's "
    "/dev/nvidia* nodes, as this plugin injects them).",
)
@click.option(
    "--py-spy",
    "py_spy",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Profile the plugin with py-spy during 300 more creates; raw stacks into this directory.",
)
@click.option(
    "--svg",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also draw the figures beside their peers' as SVG plots into this directory.",
)
def bench_nri(
    versions: tuple[str, ...],
    rounds: int,
    creates: int,
    restarts: int,
    kills: int,
    sync_containers: int,
    background_pods: int,
    pod_containers: int,
    chaos: bool,
    chaos_creates: int,
    seed: int | None,
    previous: str | None,
    peer: Path | None,
    py_spy: Path | None,
    svg: Path | None,
) -> None:
    """The NRI plugin on private containerds (root): CreateContainer cost, CPU (the plugin's and
    containerd's), RSS, start, restarts, chaos; beside upstream's Go plugin with --peer."""
    from bench import nri as bench_nri
    from bench import nri_peer

    try:
        settings = bench_nri.Settings(
            rounds=rounds, per_round=creates, restarts=restarts, kills=kills, sync_containers=sync_containers,
            background_pods=background_pods, pod_containers=pod_containers, chaos=chaos, chaos_creates=chaos_creates,
            seed=seed, previous=previous, peer=peer, py_spy=py_spy, svg=svg,
        )  # fmt: skip
        bench_nri.run(list(dict.fromkeys(versions)), settings)
    except nri_peer.PeerError as exc:
        fail(str(exc))


@bench.command("host-setup")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Setups per GPU count (the median is shown).",
)
def bench_host_setup(profile_name: str, rounds: int) -> None:
    """`mokka host setup` wall time for 8 and 64 GPUs (fresh root each round, then cleanup)."""
    from bench import nvml as benchmarks

    benchmarks.host_setup(profile_name, rounds)


@bench.command("fault")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@GPUS_OPTION
@click.option("--cli-rounds", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="`mokka fault` invocations timed (a process each).")  # fmt: skip
@click.option("--rounds", type=click.IntRange(1, 1_000_000), default=200, show_default=True,
              help="API calls timed, for the read latency and the event wake-up.")  # fmt: skip
@click.option("--calls", type=click.IntRange(1), default=1_000_000, show_default=True, help="Calls per getter.")
def bench_fault(profile_name: str, gpus: int | None, cli_rounds: int, rounds: int, calls: int) -> None:
    """Fault to first NVML read (CLI and API), getter cost with patterns active, event wake-up."""
    from bench import faults as fault_bench

    fault_bench.run(load_profile(profile_name, gpus if gpus is not None else 8), cli_rounds, rounds, calls)


@bench.command("fleet")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=1000, show_default=True, help="Nodes in the pool.")
@click.option("--profile", "profile_name", default="h100", show_default=True, help="A built-in profile.")
@click.option("--pool", default="bench-fleet", show_default=True, help="The VirtualGPUPool's name (must not exist).")
@click.option(
    "--namespace",
    default="mokka-system",
    show_default=True,
    help="The chart's release namespace (the controller's Lease and pod, for its metrics).",
)
@KUBECONFIG_OPTION
@click.option("--keep", is_flag=True, help="Leave the pool and its nodes (not deleted or timed).")
@click.option("--timeout", type=click.IntRange(1), default=900, show_default=True, help="Seconds for each phase.")
@click.option(
    "--prometheus",
    default=None,
    metavar="SERVICE[:PORT]",
    help="A Prometheus Service in --namespace scraping the controller (the chart's integrations.prometheus: "
    "<release>-mokka-prometheus): the run's figures are read back from it too.",
)
@click.option(
    "--hold",
    "hold_steps",
    default=None,
    metavar="N,N,...",
    help="Grow the pool through these node counts instead of --nodes (e.g. 10000,15000,20000): at each, once "
    "Ready and --settle seconds later, the CPU and RSS of the API server, the controller and KWOK over --window "
    "seconds (and once at 0 nodes); their slopes per 1000 nodes and the projection to 100,000.",
)
@click.option(
    "--settle",
    type=click.FloatRange(0),
    default=30,
    show_default=True,
    help="Seconds after the nodes are Ready before --hold samples or --pods are scheduled (the cluster "
    "works off the burst of nodes first).",
)
@click.option(
    "--window",
    type=click.FloatRange(1),
    default=60,
    show_default=True,
    help="--hold: seconds sampled (the controller resyncs every 60).",
)
@click.option(
    "--pods",
    type=click.IntRange(0, 100_000),
    default=0,
    show_default=True,
    help="One-GPU pods scheduled on the pool once its nodes are Ready (and on FGO's with --fgo): seconds "
    "until every pod is bound and Running.",
)
@click.option(
    "--fgo",
    "fgo_pool",
    default=None,
    metavar="POOL",
    help="Then the same on as many KWOK nodes of run:ai fake-gpu-operator's node pool POOL (its chart "
    "installed, POOL with backend fake in its topology; the chart's KWOK keeps the nodes Ready), and "
    "the ratios Mokka / FGO.",
)
@click.option(
    "--fgo-namespace",
    default="gpu-operator",
    show_default=True,
    help="--fgo: fake-gpu-operator's release namespace (its topology ConfigMap).",
)
@click.option(
    "--svg",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="--fgo: plot the times beside FGO's as DIR/fleet.svg.",
)
@click.pass_context
def bench_fleet(
    ctx: click.Context,
    nodes: int,
    profile_name: str,
    pool: str,
    namespace: str,
    kubeconfig: Path | None,
    keep: bool,
    timeout: int,
    prometheus: str | None,
    hold_steps: str | None,
    settle: float,
    window: float,
    pods: int,
    fgo_pool: str | None,
    fgo_namespace: str,
    svg: Path | None,
) -> None:
    """The chart's fleet on the cluster it runs on (helm install ... --set fleet.enabled=true): a pool
    of NODES virtual nodes applied, followed through one watch until every node exists (the creation
    rate) and is Ready, then deleted until every node is gone; the controller's reconcile and
    template figures from its /metrics. Targets: >= 500 nodes/s; 10,000 nodes Ready <= 120 s.
    With --pods, GPU pods scheduled on the pool; with --fgo, fake-gpu-operator on as many nodes in
    the same run, Mokka no slower (ratios <= 1). With --hold, the pool grown in steps and the
    components' CPU and RSS held at each."""
    from bench import fleet as fleet_bench
    from bench import fleet_hold
    from bench.fleet_nodes import BenchError
    from bench.gpu_pods import SchedulingError
    from gpumodel import profile
    from k8snode.dra import cluster

    if profile_name not in profile.builtin_names():
        fail(f"--profile {profile_name}: not a built-in profile ({', '.join(profile.builtin_names())})")
    if svg is not None and not fgo_pool:
        fail("--svg plots Mokka beside fake-gpu-operator: give --fgo POOL too")
    steps: list[int] = []
    if hold_steps is not None:
        if ctx.get_parameter_source("nodes") != click.core.ParameterSource.DEFAULT:
            fail("--hold sets the pool's sizes: leave out --nodes")
        if prometheus:
            fail("--hold reads the components' own metrics: leave out --prometheus")
        if pods or fgo_pool:
            fail("--hold holds the pool alone: leave out --pods and --fgo")
        try:
            steps = [int(n) for n in hold_steps.split(",")]
        except ValueError:
            fail(f"--hold {hold_steps}: give node counts separated by commas, e.g. 10000,15000,20000")
        if not steps or steps != sorted(set(steps)) or not 1 <= steps[0] <= steps[-1] <= 100_000:
            fail(f"--hold {hold_steps}: give ascending node counts from 1 to 100000")
    result: fleet_bench.Result | fleet_hold.Hold

    def progress(message: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {message}", err=True)

    try:
        api = cluster.load_client(str(kubeconfig) if kubeconfig else None)
        if steps:
            result = fleet_hold.hold(api, steps, profile_name, pool, namespace, keep, timeout, settle, window, progress)
        else:
            result = fleet_bench.run(
                api, nodes, profile_name, pool, namespace, keep, timeout, prometheus,
                pods, settle, fgo_pool, fgo_namespace, progress,
            )  # fmt: skip
    except (cluster.ClusterError, BenchError, SchedulingError) as exc:
        fail(str(exc))
    width = max(len(r[0]) for r in result.rows())
    for figure, value, target in result.rows():
        click.echo(f"{figure:<{width}}  {value:>14}  {target}".rstrip())
    if svg is not None and isinstance(result, fleet_bench.Result):
        from bench import plot

        title = f"{nodes} virtual nodes of {profile_name}: Mokka's fleet beside fake-gpu-operator"
        click.echo(f"plot: {plot.bars(svg / 'fleet.svg', title, 's', result.times())}")
