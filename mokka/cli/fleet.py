"""`mokka fleet-controller`: the controller of the VirtualGPUPool API (virtual GPU nodes); `mokka
karpenter-config`: Karpenter's KWOK provider configured to autoscale its pools."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import click

from .root import KUBECONFIG_OPTION, fail, main

GFD_ENV = "MOKKA_GFD"


@main.command("fleet-controller")
@click.option(
    "--gfd",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"NVIDIA's gpu-feature-discovery binary, run once per pool template (default: ${GFD_ENV}, else "
    "gpu-feature-discovery on PATH).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/mokka-fleet"),
    show_default=True,
    help="Where a pool's profile is staged while its template is computed (emptied after).",
)
@KUBECONFIG_OPTION
@click.option(
    "--nfd-labels/--no-nfd-labels",
    default=True,
    show_default=True,
    help="Virtual nodes also carry the PCI labels NFD gives a real node of the profile (from Mokka's feature file).",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Reconcile only while holding the Lease --lease-namespace/--lease-name (several replicas, one at work).",
)
@click.option(
    "--lease-namespace",
    default=None,
    help="Namespace of the Lease (default: $POD_NAMESPACE, else mokka-system).",
)
@click.option("--lease-name", default="mokka-fleet-controller", show_default=True, help="Name of the Lease.")
@click.option(
    "--faults-configmap",
    default=None,
    metavar="NAMESPACE/NAME",
    help="The chart's fault ConfigMap (one key per node name, its value a scenario): a virtual node's entry "
    "makes its GPUs unhealthy as the device plugin or the DRA driver would show it.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Serve the controller's metrics (Prometheus' text format) on this port at /metrics; 0: none.",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (HTTP and the election).")
def fleet_controller(
    gfd: Path | None,
    workdir: Path,
    kubeconfig: Path | None,
    nfd_labels: bool,
    leader_elect: bool,
    lease_namespace: str | None,
    lease_name: str,
    faults_configmap: str | None,
    metrics_port: int,
    verbose: bool,
) -> None:
    """Make every VirtualGPUPool (mokka.io/v1alpha1) into virtual GPU nodes, and keep them so.

    A pool's nodes virtual-<pool>-<i> carry what a real node of its profile carries: the labels
    NVIDIA's GFD computes on the profile staged as a mock node (and NFD's PCI labels), the GPUs as
    nvidia.com/gpu capacity and allocatable or as a ResourceSlice (allocator dra), the NVLink
    clique of their rack, the pool's own labels and taints. Missing nodes are made (also one
    deleted by hand), changed ones brought in step, surplus ones deleted (`kubectl scale
    vgp/<pool> --replicas=N`); the pool's status counts nodes, Ready nodes, allocatable GPUs and
    racks. KWOK keeps the nodes Ready. Needs root (a pool's template stages a mock node and runs
    GFD in a mount namespace of its own) and the chart's RBAC. Logs one line per change; stops on
    SIGTERM.
    """
    import logging
    import signal
    import threading

    from k8snode.dra import cluster
    from virtualfleet import controller

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        for noisy in ("kubernetes", "urllib3", "leaderelection"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    binary = gfd or (Path(os.environ[GFD_ENV]) if os.environ.get(GFD_ENV) else None)
    if binary is None:
        found = shutil.which("gpu-feature-discovery")
        if found is None:
            fail(f"no gpu-feature-discovery: give --gfd or ${GFD_ENV}, or put it on PATH")
        binary = Path(found)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        fail(f"--gfd {binary}: not an executable file")
    if os.geteuid() != 0:
        fail("the fleet controller needs root: a pool's template stages a mock node in a mount namespace")
    try:
        api = cluster.load_client(str(kubeconfig) if kubeconfig else None)
    except cluster.ClusterError as exc:
        fail(str(exc))
    faults = None
    if faults_configmap is not None:
        namespace, slash, name = faults_configmap.partition("/")
        if not (slash and namespace and name) or "/" in name:
            fail(f"--faults-configmap {faults_configmap}: expected NAMESPACE/NAME")
        faults = (namespace, name)
    settings = controller.Settings(gfd=binary, workdir=workdir, nfd_labels=nfd_labels, faults=faults)
    ctl = controller.Controller(api, settings)
    if metrics_port:
        try:
            ctl.metrics.serve(metrics_port)
        except OSError as exc:
            fail(f"--metrics-port {metrics_port}: {exc.strerror}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log = logging.getLogger("mokka.fleet")
    if not leader_elect:
        log.info("reconciling every VirtualGPUPool (no leader election)")
        ctl.metrics.leader.set(1)
        ctl.run(stop)
        return
    from kubernetes.leaderelection import electionconfig, leaderelection  # type: ignore[import-untyped, unused-ignore]

    from virtualfleet.lease import LeaseLock

    namespace = lease_namespace or os.environ.get("POD_NAMESPACE") or "mokka-system"
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"
    lock = LeaseLock(api, lease_name, namespace, identity)

    def lead() -> None:
        log.info("%s leads (Lease %s/%s): reconciling every VirtualGPUPool", identity, namespace, lease_name)
        ctl.metrics.leader.set(1)
        ctl.run(stop)
        os._exit(0)

    def lost() -> None:  # another replica may lead now: stop at once, the Deployment restarts this one
        log.error("%s lost the Lease %s/%s: exiting", identity, namespace, lease_name)
        os._exit(1)

    log.info("%s waiting for the Lease %s/%s", identity, namespace, lease_name)
    election = leaderelection.LeaderElection(
        electionconfig.Config(
            lock, lease_duration=15, renew_deadline=10, retry_period=2, onstarted_leading=lead, onstopped_leading=lost
        )
    )
    runner = threading.Thread(target=election.run, daemon=True, name="election")
    runner.start()
    while not stop.wait(1.0):
        if not runner.is_alive():
            break
    log.info("stopping")


@main.command("karpenter-config")
@click.option(
    "--pool",
    "pools",
    multiple=True,
    required=True,
    metavar="NAME=PROFILE[:GPUS]",
    help="A VirtualGPUPool (its name, profile and gpusPerNode) Karpenter should make nodes for (repeatable).",
)
@click.option(
    "--types-out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    required=True,
    help="Where to write the instance-types file (the provider's INSTANCE_TYPES_FILE_PATH, e.g. from a ConfigMap).",
)
def karpenter_config(pools: tuple[str, ...], types_out: Path) -> None:
    """Configure Karpenter's KWOK provider (sigs.k8s.io/karpenter, kwok/) to autoscale virtual pools on
    any cluster: writes its instance-types file (one GPU instance type per pool) and prints the
    KWOKNodeClass and one NodePool per pool (YAML, for `kubectl apply -f -`). A pending pod that
    selects a pool (nodeSelector mokka.io/virtual-pool: NAME, or its nvidia.com/gpu.product) gets a
    node of it; the chart's fleet controller decorates the node as the pool's.

    \b
      mokka karpenter-config --pool h100=h100 --pool small=t4:1 --types-out types.json | kubectl apply -f -
    """
    import json
    import re

    import yaml

    from gpumodel import profile as profiles
    from virtualfleet import karpenter

    chosen = []
    for text in pools:
        name, sep, spec = text.partition("=")
        prof_name, colon, gpus = spec.partition(":")
        if (
            not sep
            or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
            or not prof_name
            or (colon and not gpus.isdigit())
        ):
            fail(f"{text!r}: expected NAME=PROFILE[:GPUS] (a VirtualGPUPool's name), e.g. small=t4:1, --pool")
        try:
            prof = profiles.load(prof_name).with_count(int(gpus) if colon else None)
        except profiles.ProfileError as exc:
            fail(f"{str(exc).splitlines()[0]}, --pool {text}")
            return
        chosen.append((name, prof.gpu.name, prof.gpu_count))
    types_out.write_text(json.dumps(karpenter.instance_types(chosen), indent=1) + "\n")
    objects = [karpenter.NODE_CLASS, *(karpenter.node_pool(name) for name, _, _ in chosen)]
    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)
