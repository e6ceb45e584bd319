"""`mokka cluster up|down|status` and `mokka bench cluster`: a real single-node Kubernetes with mock GPUs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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
    """A real single-node Kubernetes on this machine with mock GPUs, without Docker (root).

    etcd, kube-apiserver, controller-manager, scheduler and kubelet on a private containerd 2.1
    (NRI and CDI on), loopback only, inside a private mount namespace; the mock node staged,
    the NRI plugin, NVIDIA's device plugin and GPU Feature Discovery running. Binaries are
    built once from the Go module proxy into ~/.cache/mokka.
    """


def _progress(line: str) -> None:
    click.echo(line, err=True)


@cluster.command("up")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@GPUS_OPTION
@DIR_OPTION
@click.option(
    "--allocator",
    type=click.Choice(["device-plugin", "dra", "none"]),
    default="device-plugin",
    show_default=True,
    help="Who hands out the GPUs: NVIDIA's device plugin, a DRA driver, or nobody (the NRI plugin gives "
    "every container all GPUs). GFD labels the node either way.",
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
@click.option("--keep-on-failure", is_flag=True, help="Leave a cluster that failed to come up running, for its logs.")
def up_cmd(
    profile_name: str,
    gpus: int | None,
    base: Path,
    allocator: str,
    device_list_strategy: str,
    mig_strategy: str,
    keep_on_failure: bool,
) -> None:
    """Start the cluster; prints `export KUBECONFIG=...` on stdout, one progress line per step on stderr."""
    from testbed.kube import binaries
    from testbed.kube.cluster import Cluster, ClusterError, Options

    load_profile(profile_name, gpus)  # a bad profile is refused before anything starts
    options = Options(
        base=base.absolute(),
        profile=profile_name,
        gpus=gpus,
        allocator=allocator,
        device_list_strategy=device_list_strategy,
        mig_strategy=mig_strategy,
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
    click.echo(
        f"cluster up in {time.monotonic() - t0:.1f}s: node {c.node_name} Ready, "
        f"{c.allocatable_gpus()} nvidia.com/gpu allocatable; kubectl: {kubectl['kubectl'] if kubectl else '?'}",
        err=True,
    )
    click.echo(f"export KUBECONFIG={c.kubeconfig}")


@cluster.command("down")
@DIR_OPTION
def down_cmd(base: Path) -> None:
    """Stop the cluster under --dir and remove it: no process, mount, cgroup or file is left."""
    from testbed.kube.cluster import Cluster, ClusterError

    try:
        c = Cluster.load(base)
        problems = c.down(progress=_progress)
    except ClusterError as exc:
        fail(f"{exc}, {base}")
        return
    if problems:
        fail(f"clean-up incomplete: {'; '.join(problems)}, {base}")


@cluster.command("status")
@DIR_OPTION
def status_cmd(base: Path) -> None:
    """Processes, node readiness and allocatable GPUs; exit 1 unless everything runs."""
    from testbed.kube.cluster import Cluster, ClusterError

    try:
        status = Cluster.load(base).status()
    except ClusterError as exc:
        fail(f"{exc}, {base}")
        return
    click.echo(f"server      {status['server']}")
    click.echo(f"kubeconfig  {status['kubeconfig']}")
    click.echo(f"allocator   {status['allocator']}")
    click.echo(f"node        {'Ready' if status['node_ready'] else 'not ready'}")
    gpus, dra = status["allocatable_gpus"], status["dra_devices"]
    click.echo(f"gpus        {gpus} nvidia.com/gpu allocatable, {dra} in ResourceSlices")
    for name, state in status["processes"].items():
        click.echo(f"  {name:<26}{state}")
    healthy = status["node_ready"] and all(s == "running" for s in status["processes"].values())
    sys.exit(0 if healthy else 1)


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
    type=click.IntRange(1, 200),
    default=5,
    show_default=True,
    help="Pods per side (2 GPUs / none), interleaved.",
)
def bench_cluster(profile_name: str, ups: int, pods: int) -> None:
    """Warm `cluster up` → node Ready (target <= 30 s); pod with 2 GPUs vs none: create → Running (ratio <= 1.2)."""
    from testbed.kube import bench as cluster_bench
    from testbed.kube.cluster import ClusterError

    load_profile(profile_name, None)
    try:
        cluster_bench.run(profile_name, ups, pods)
    except ClusterError as exc:
        fail(f"{exc}, mokka bench cluster")
