"""`mokka cluster up|down|status` and `mokka bench cluster`: a real Kubernetes with mock GPU nodes."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .bench import bench
from .root import GPUS_OPTION, fail, load_profile, main

DEFAULT_DIR = "/run/mokka-cluster"
DIR_OPTION = click.option(
    "--dir",
    "base",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Directory holding everything of the cluster (state, certificates, logs, the staged node).",
)


@main.group()
def cluster() -> None:
    """A real Kubernetes on this machine with mock GPU nodes, without Docker (root).

    One control plane (etcd, kube-apiserver, controller-manager, scheduler) and one or more real
    nodes (--node, repeatable), each complete and separate: its kubelet on a private containerd
    2.1 (NRI and CDI on) in a private mount namespace, its mock node staged, its NRI plugin,
    NVIDIA's device plugin and GPU Feature Discovery; loopback only. Binaries are built once
    from the Go module proxy into ~/.cache/mokka.
    """


def _progress(line: str) -> None:
    click.echo(line, err=True)


def _node_spec(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[Any, ...]:
    from localcluster.nodespec import NodeSpec

    try:
        return tuple(NodeSpec.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _virtual_spec(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[Any, ...]:
    from virtualfleet.pool import VirtualSpec

    try:
        specs = tuple(VirtualSpec.parse(v) for v in values)
        for spec in specs:
            load_profile(spec.profile, spec.gpus)  # a bad profile is refused before anything starts
        return specs
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def virtual_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--virtual PROFILE[:GPUS]=COUNT, repeatable: parsed into VirtualSpecs."""
    return click.option(
        "--virtual",
        "virtual",
        multiple=True,
        callback=_virtual_spec,
        metavar="PROFILE[:GPUS]=COUNT",
        help="COUNT virtual nodes of a profile (repeatable, e.g. --virtual h100=1000 --virtual t4:4=200): Node "
        "objects KWOK keeps Ready, no kubelet each, carrying GFD's labels of that profile and its GPUs "
        "(allocatable nvidia.com/gpu, or a ResourceSlice with --allocator dra); named virtual-POOL-i, labelled "
        "type=kwok and mokka.io/virtual=true. Pods bound to them go Running; `mokka fault ... --node NAME` "
        "makes their GPUs unhealthy.",
    )(fn)


def _fgo_spec(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[Any, ...]:
    from localcluster.addons.fgo import FgoSpec

    try:
        return tuple(FgoSpec.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def fgo_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--fgo POOL=PROFILE:COUNT, repeatable."""
    return click.option(
        "--fgo",
        "fgo_pools",
        multiple=True,
        callback=_fgo_spec,
        metavar="POOL=PROFILE:COUNT",
        help="COUNT KWOK nodes of pool POOL served by run:ai's fake-gpu-operator from the built-in PROFILE "
        "(repeatable): the chart's profile ConfigMaps and FGO's topology are installed in namespace gpu-operator "
        "and FGO's status-updater, kwok-gpu-device-plugin and status-exporter-kwok run against the cluster. "
        "FGO's binaries come from the directory MOKKA_FGO_DIR names.",
    )(fn)


def node_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--node PROFILE[:GPUS][@RACK], repeatable: parsed into NodeSpecs (a bad one is a usage error)."""
    return click.option(
        "--node", "nodes", multiple=True, callback=_node_spec, metavar="PROFILE[:GPUS][@RACK]", help=help_text
    )


@cluster.command("up")
@click.option(
    "--profile",
    "profile_name",
    default="h100",
    show_default=True,
    help="The one node's profile (built-in name or a profile YAML file) when no --node is given.",
)
@GPUS_OPTION
@node_option(
    "A real node (repeatable, in order; node i is named PROFILE-i): e.g. --node h100 --node t4:2 "
    "--node gb200@rack-a. Nodes of one RACK share an NVLink domain (one nvidia.com/gpu.clique); GB200 "
    "and GB300 nodes default to NVL72 racks. Without --node: one node, localhost, of --profile/--gpus."
)
@DIR_OPTION
@click.option(
    "--allocator",
    type=click.Choice(["device-plugin", "dra", "nvidia-dra", "none"]),
    default="device-plugin",
    show_default=True,
    help="Who hands out the GPUs: NVIDIA's device plugin, Mokka's DRA driver (dra), NVIDIA's DRA driver "
    "(nvidia-dra: NVIDIA's Helm chart, GPU claims and ComputeDomains, its image built from the binaries and chart "
    "in $MOKKA_NVIDIA_DRA_DIR), or nobody (the NRI plugin gives every container all GPUs). GFD labels the node "
    "either way.",
)
@click.option(
    "--device-list-strategy",
    type=click.Choice(["envvar", "cdi-cri", "cdi-annotations"]),
    default="envvar",
    show_default=True,
    help="The device plugin's --device-list-strategy.",
)
@click.option(
    "--mig-strategy",
    type=click.Choice(["none", "single", "mixed"]),
    default="none",
    show_default=True,
    help="The device plugin's and GFD's --mig-strategy (a profile declares the MIG layout).",
)
@click.option(
    "--fabric-delay",
    type=click.FloatRange(min=0),
    default=0,
    metavar="SECONDS",
    help="The racks' fabric manager is ready SECONDS after up: until then their GPUs' fabric probe reads In "
    "Progress (GFD's labels at up then carry no clique: `mokka cluster relabel` runs GFD again).",
)
@click.option(
    "--dcgm-exporter",
    "dcgm_exporter",
    is_flag=True,
    help="Run NVIDIA's dcgm-exporter as a DaemonSet (namespace gpu-monitoring) on the mock libdcgm, with "
    "--kubernetes: a pod's GPUs carry its pod/namespace labels. The binary comes from $MOKKA_DCGM_DIR "
    "(dcgm-exporter or dcgm-exporter.xz, and default-counters.csv).",
)
@click.option(
    "--nfd",
    is_flag=True,
    help="Run Node Feature Discovery (its nfd-master, an nfd-worker per node): NFD labels each node, its GPUs' "
    "feature.node.kubernetes.io/pci-10de.present from the feature file Mokka writes. Always on with "
    "--allocator nvidia-dra (its chart places its plugins by those labels).",
)
@click.option(
    "--gpu-operator",
    "gpu_operator",
    is_flag=True,
    help="Install NVIDIA's GPU Operator with its own Helm chart and Mokka's values (helm install, namespace "
    "gpu-operator): NFD, the validator, NVIDIA's device plugin and GFD, dcgm-exporter and the MIG manager run as "
    "the operator deploys them; up returns when the ClusterPolicy is ready (Reconciled) and every node's GPUs are "
    "allocatable. Takes --mig-strategy; the MIG manager comes from $MOKKA_MIG_PARTED_DIR, dcgm-exporter from "
    "$MOKKA_DCGM_DIR.",
)
@click.option(
    "--container-toolkit",
    "container_toolkit",
    is_flag=True,
    help="With --gpu-operator: run the operator's container toolkit operand (NVIDIA's nvidia-ctk installer, CDI "
    "mode): it installs NVIDIA's runtime as each node's nvidia (and default) handler, restarts the node's "
    "containerd, and writes a CDI spec of the mock GPUs with nvidia-ctk. Without it Mokka's runtime handler "
    "serves the operator's runtimeClassName nvidia pods.",
)
@virtual_option
@click.option(
    "--karpenter",
    is_flag=True,
    help="Autoscale the --virtual pools with Karpenter's KWOK provider: a NodePool and a GPU instance type for "
    "each pool (`--virtual h100=0` starts one empty). A pending pod that selects a pool "
    "(nodeSelector mokka.io/virtual-pool: POOL, or its nvidia.com/gpu.product) gets a node of it, which the fleet "
    "controller decorates as the pool's; consolidation removes the node once its pods are gone. Log: "
    "logs/karpenter.log.",
)
@fgo_option
@click.option("--keep-on-failure", is_flag=True, help="Leave a cluster that failed to come up running, for its logs.")
def up_cmd(
    profile_name: str,
    gpus: int | None,
    nodes: tuple[Any, ...],
    virtual: tuple[Any, ...],
    karpenter: bool,
    fgo_pools: tuple[Any, ...],
    base: Path,
    allocator: str,
    device_list_strategy: str,
    mig_strategy: str,
    fabric_delay: float,
    dcgm_exporter: bool,
    nfd: bool,
    gpu_operator: bool,
    container_toolkit: bool,
    keep_on_failure: bool,
) -> None:
    """Start the cluster; prints `export KUBECONFIG=...` on stdout, one progress line per step on stderr."""
    from fetch.kube import binaries
    from localcluster.cluster import Cluster, ClusterError, Options

    if karpenter and not virtual:
        fail("--karpenter: no --virtual pool to provision nodes for (e.g. --virtual h100=0 --karpenter)")
    if karpenter and allocator == "dra":
        fail("--karpenter: Karpenter provisions for nvidia.com/gpu requests; --allocator dra pools have none")
    if nodes and (gpus is not None or profile_name != "h100"):
        fail("--profile and --gpus are for the one node of a cluster without --node: give each --node its own")
    if not nodes:
        load_profile(profile_name, gpus)  # a bad profile is refused before anything starts
    options = Options(
        base=base.absolute(),
        profile=profile_name,
        gpus=gpus,
        nodes=nodes,
        allocator=allocator,
        device_list_strategy=device_list_strategy,
        mig_strategy=mig_strategy,
        fabric_delay=fabric_delay,
        virtual=virtual,
        karpenter=karpenter,
        fgo=fgo_pools,
        dcgm_exporter=dcgm_exporter,
        nfd=nfd,
        gpu_operator=gpu_operator,
        container_toolkit=container_toolkit,
        keep_on_failure=keep_on_failure,
    )
    t0 = time.monotonic()
    try:
        c = Cluster.up(options, progress=_progress)
    except ClusterError as exc:
        fail(f"{exc}, {base}")
        return
    except KeyboardInterrupt:
        fail(f"interrupted; torn down, {base}", 130)
        return
    kubectl = binaries.cached()
    names = ", ".join(n.name for n in c.nodes)
    extra = sum(p.count for p in c.pools)
    click.echo(
        f"cluster up in {time.monotonic() - t0:.1f}s: {'node' if len(c.nodes) == 1 else 'nodes'} {names} Ready, "
        f"{c.allocatable_gpus()} nvidia.com/gpu allocatable"
        + (f"; {extra} virtual node(s) Ready" if extra else "")
        + f"; kubectl: {kubectl['kubectl'] if kubectl else '?'}",
        err=True,
    )
    click.echo(f"export KUBECONFIG={c.kubeconfig}")


@cluster.command("down")
@DIR_OPTION
def down_cmd(base: Path) -> None:
    """Stop the cluster under --dir and remove it: no process, mount, cgroup or file is left."""
    from localcluster.cluster import Cluster, ClusterError

    try:
        c = Cluster.load(base)
        problems = c.down(progress=_progress)
    except ClusterError as exc:
        fail(f"{exc}, {base}")
        return
    if problems:
        fail(f"clean-up incomplete: {'; '.join(problems)}, {base}")


@cluster.command("relabel")
@DIR_OPTION
def relabel_cmd(base: Path) -> None:
    """Run GPU Feature Discovery again on every node and apply its labels (GFD's daemon does it every minute)."""
    from localcluster.addons import gfd
    from localcluster.cluster import Cluster, ClusterError

    try:
        for node, labels in gfd.relabel(Cluster.load(base)).items():
            click.echo(f"{node}: {len(labels)} labels")
    except ClusterError as exc:
        fail(f"{exc}, {base}")


@cluster.command("status")
@DIR_OPTION
def status_cmd(base: Path) -> None:
    """Processes, node readiness and allocatable GPUs; exit 1 unless everything runs."""
    from localcluster.cluster import Cluster, ClusterError

    try:
        status = Cluster.load(base).status()
    except ClusterError as exc:
        fail(f"{exc}, {base}")
        return
    click.echo(f"server      {status['server']}")
    click.echo(f"kubeconfig  {status['kubeconfig']}")
    click.echo(f"allocator   {status['allocator']}")
    ready = sum(1 for n in status["nodes"] if n["ready"])
    click.echo(f"nodes       {ready} of {len(status['nodes'])} Ready")
    gpus, dra = status["allocatable_gpus"], status["dra_devices"]
    click.echo(f"gpus        {gpus} nvidia.com/gpu allocatable, {dra} in ResourceSlices")
    for name, state in status["processes"].items():
        click.echo(f"  {name:<30}{state}")
    click.echo(f"{'node':<20}{'profile':<18}{'rack':<16}{'gpus':>5}{'allocatable':>13}{'slices':>8}  ready")
    for n in status["nodes"]:
        click.echo(
            f"{n['name']:<20}{n['profile']:<18}{n['rack'] or '-':<16}{n['gpus']:>5}{n['allocatable_gpus']:>13}"
            f"{n['dra_devices']:>8}  {'Ready' if n['ready'] else 'not ready'}"
        )
        for name, state in n["processes"].items():
            click.echo(f"  {name:<30}{state}")
    if status["virtual"]:
        click.echo(
            f"{'virtual pool':<20}{'profile':<18}{'nodes':>7}{'ready':>7}{'gpus':>8}{'allocatable':>13}{'adopted':>9}"
        )
        for p in status["virtual"]:
            click.echo(
                f"{p['pool']:<20}{p['spec'].rpartition('=')[0]:<18}{p['nodes']:>7}{p['ready']:>7}{p['gpus']:>8}"
                f"{p['allocatable_gpus']:>13}{p['adopted']:>9}"
            )
    if status["fgo"]:
        click.echo(f"{'FGO pool':<20}{'profile':<18}{'nodes':>7}{'ready':>7}{'allocatable':>13}  product")
        for p in status["fgo"]:
            click.echo(
                f"{p['pool']:<20}{p['spec'].partition('=')[2].rpartition(':')[0]:<18}{p['nodes']:>7}{p['ready']:>7}"
                f"{p['allocatable_gpus']:>13}  {', '.join(p['products']) or '-'}"
            )
    healthy = status["node_ready"] and all(s == "running" for s in status["processes"].values())
    healthy = healthy and all(p["ready"] == p["wanted"] for p in status["virtual"] + status["fgo"])
    healthy = healthy and all(s == "running" for n in status["nodes"] for s in n["processes"].values())
    sys.exit(0 if healthy else 1)


@bench.command("dra")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True, help="Claims (and domains) timed.")
@click.option(
    "--svg",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also draw the figures side by side as an SVG plot into this directory.",
)
def bench_dra(rounds: int, svg: Path | None) -> None:
    """Claim created → pod Running: 1 GPU with Mokka's DRA plugin and with NVIDIA's DRA driver, and a
    2-node ComputeDomain (NVIDIA's), on two nodes of one rack; side by side, in one run.

    NVIDIA's binaries and chart come from $MOKKA_NVIDIA_DRA_DIR (see `mokka cluster up --allocator nvidia-dra`).
    """
    from bench import dra as bench_dra
    from localcluster.addons import nvidia_dra
    from localcluster.cluster import ClusterError

    try:
        from fetch import debcache

        nvidia_dra.find(debcache.default_cache())
        bench_dra.run(rounds, svg)
    except (ClusterError, nvidia_dra.NvidiaDraUnavailable) as exc:
        fail(f"{exc}, mokka bench dra")


@bench.command("gpu-operator")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@click.option(
    "--virtual",
    "counts",
    type=click.IntRange(0, 10000),
    multiple=True,
    metavar="N",
    help="Virtual nodes of --profile beside the real one, a cluster per N (repeat it; default 0, 100 and 1000).",
)
def bench_gpu_operator(profile_name: str, counts: tuple[int, ...]) -> None:
    """NVIDIA's GPU Operator on one real node and N virtual ones: helm install → every operand Ready and the
    ClusterPolicy Reconciled; the operator's CPU and RSS until then and over a quiet minute after."""
    from bench import gpu_operator as bench_gpu_operator
    from localcluster.cluster import ClusterError

    load_profile(profile_name, None)
    try:
        bench_gpu_operator.run(profile_name, counts or bench_gpu_operator.COUNTS)
    except ClusterError as exc:
        fail(f"{exc}, mokka bench gpu-operator")


@bench.command("cluster")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@click.option(
    "--ups",
    type=click.IntRange(1, 50),
    default=3,
    show_default=True,
    help="Warm `cluster up` runs timed (each torn down).",
)
@click.option(
    "--pods",
    type=click.IntRange(1, 10000),
    default=None,
    help="Pods per side (2 GPUs / none), interleaved (default 5); with --virtual: one-GPU pods scheduled "
    "(default 1000).",
)
@node_option("Bench fleets of these nodes instead (cycled to 1, 2, 3 and 4 nodes; --ups runs each).")
@click.option(
    "--virtual",
    "virtual_count",
    type=click.IntRange(1, 10000),
    default=None,
    metavar="N",
    help="Bench N virtual nodes of --profile instead (and FGO serving N, where MOKKA_FGO_DIR has its binaries): "
    "up -> N Ready (target: 1000 <= 60 s), RSS, and --pods one-GPU pods scheduled (default 1000).",
)
@click.option(
    "--settle",
    type=click.FloatRange(0, 3600),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="With --virtual: how long each side's cluster is left after its nodes are Ready before its pods are "
    "scheduled (both sides schedule on a machine done with making and readying the nodes).",
)
@click.option(
    "--svg",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="With --virtual: also draw Mokka's and FGO's figures side by side as an SVG plot into this directory.",
)
def bench_cluster(
    profile_name: str,
    ups: int,
    pods: int | None,
    nodes: tuple[Any, ...],
    virtual_count: int | None,
    settle: float,
    svg: Path | None,
) -> None:
    """Warm `cluster up` → node Ready (target <= 30 s); pod with 2 GPUs vs none: create → Running (ratio <= 1.2).

    With --node: fleets of 1, 2, 3 and 4 nodes (the given nodes, cycled) → all Ready (target: 3 nodes
    <= 45 s), and the memory each node's processes take (target <= 400 MiB).

    With --virtual N: N virtual nodes (and fake-gpu-operator serving N, side by side) → Ready (target:
    1000 <= 60 s), the API server's and kwok's RSS, and the scheduling of --pods one-GPU pods.
    """
    from bench import cluster as cluster_bench
    from bench.gpu_pods import SchedulingError
    from localcluster.cluster import ClusterError

    load_profile(profile_name, None)
    try:
        if virtual_count:
            from bench import virtual as bench_virtual

            bench_virtual.run(profile_name, virtual_count, pods or 1000, svg, settle)
            return
        pods = pods or 5
        if nodes:
            cluster_bench.run_fleet(nodes, ups)
            return
        cluster_bench.run(profile_name, ups, pods)
    except (ClusterError, SchedulingError) as exc:
        fail(f"{exc}, mokka bench cluster")
