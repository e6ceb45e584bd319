"""``python -m kind.bench [--nodes N] [--rounds R] [--profile P] [--svg DIR]``: ``mokka cluster up``
beside its peer, ``kind create cluster``, in the same run, rounds interleaved.

Each round brings up Mokka's local cluster of N mock GPU nodes of the profile and times it until
every node is Ready (and until the GPUs are allocatable and GFD has labelled them: kind has no
GPUs, so that figure has no peer), then a kind cluster of N nodes (a control plane and N-1
workers, kind's node image built here, podman in private namespaces: :mod:`kind.provider`) until
every node is Ready; each is deleted after, timed too. Both start warm: every binary and image is
built or cached beforehand (a kind user has pulled its node image; ``kind create`` is timed
without the private podman's start and the image load). Medians are printed beside each other,
with their ratio; ``--svg DIR`` draws ``cluster-up.svg``.

Developer tooling (kind's provider is not in the wheel), so it lives here rather than under
``mokka bench``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kind import provider

__all__ = ["main"]

NAME = "bench"


def _mokka(base: Path, profile: str, nodes: int) -> dict[str, float]:
    from localcluster.cluster import Cluster, ClusterError, Options
    from localcluster.nodespec import NodeSpec

    specs = tuple(NodeSpec(profile) for _ in range(nodes)) if nodes > 1 else ()
    c = Cluster.up(Options(base=base, profile=profile, nodes=specs), progress=lambda s: None)
    timings = dict(c.state.timings)
    t0 = time.monotonic()
    if problems := c.down():
        raise ClusterError("; ".join(problems))
    return {"ready": timings["node Ready"], "up": timings["up"], "down": time.monotonic() - t0}


def _kind(base: Path, nodes: int) -> dict[str, float]:
    roles = [{"role": "control-plane"}, *({"role": "worker"} for _ in range(nodes - 1))]
    source = base.with_name(base.name + ".yaml")
    source.write_text(yaml.safe_dump({"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "nodes": roles}))
    env, ready = provider.create(base, NAME, source)
    try:
        t0 = time.monotonic()
        env.kind("delete", "cluster", "--name", NAME, timeout=300)
        down = time.monotonic() - t0
    finally:
        problems = env.close() + env.leftovers()
    if problems:
        raise provider.ProviderError("; ".join(problems))
    return {"ready": ready, "down": down}


def run(nodes: int, rounds: int, profile: str, svg: Path | None) -> None:
    mokka: list[dict[str, float]] = []
    kind: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="mokka-bench-kind-") as tmp:
        _mokka(Path(tmp) / "warm", profile, nodes)  # the first `up` of a machine is not timed
        for i in range(rounds):
            order = [("mokka", i), ("kind", i)] if i % 2 == 0 else [("kind", i), ("mokka", i)]
            for side, r in order:
                if side == "mokka":
                    mokka.append(_mokka(Path(tmp) / f"mokka{r}", profile, nodes))
                else:
                    kind.append(_kind(Path(tmp) / f"kind{r}", nodes))
                print(f"round {r + 1}/{rounds}, {side}: {(mokka if side == 'mokka' else kind)[-1]}", flush=True)

    def med(side: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in side)

    print(f"\n{nodes} node(s), {rounds} rounds, medians (s):")
    print(f"{'figure':<44}{'mokka up':>10}{'kind create':>13}{'ratio':>8}")
    ready_m, ready_k = med(mokka, "ready"), med(kind, "ready")
    print(f"{'up -> every node Ready':<44}{ready_m:>10.2f}{ready_k:>13.2f}{ready_m / ready_k:>8.2f}")
    print(f"{'up -> GPUs allocatable, GFD labels (no peer)':<44}{med(mokka, 'up'):>10.2f}{'-':>13}")
    down_m, down_k = med(mokka, "down"), med(kind, "down")
    print(f"{'down (cluster deleted)':<44}{down_m:>10.2f}{down_k:>13.2f}{down_m / down_k:>8.2f}")
    if svg is not None:
        from bench import plot

        groups = {
            f"{nodes} node(s) Ready": {"mokka cluster up": ready_m, "kind create cluster": ready_k},
            "GPUs allocatable": {"mokka cluster up": med(mokka, "up")},
            "deleted": {"mokka cluster up": down_m, "kind create cluster": down_k},
        }
        print(f"plot: {plot.bars(svg / 'cluster-up.svg', f'A local cluster up, {rounds} rounds, median', 's', groups)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kind.bench",
        description="Time `mokka cluster up` beside `kind create cluster` (N nodes each, rounds interleaved): "
        "until every node is Ready, and until each cluster is deleted. Warm: run `.ci/setup --tests` first.",
    )
    ap.add_argument("--nodes", type=int, default=1, help="nodes in each cluster (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each side once a round (default 3)")
    ap.add_argument("--profile", default="h100", help="Mokka's nodes' profile (default h100)")
    ap.add_argument("--svg", type=Path, default=None, help="draw cluster-up.svg in this directory")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.rounds < 1:
        print("kind.bench: error: --nodes and --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        run(args.nodes, args.rounds, args.profile, args.svg)
    except Exception as exc:  # one line, never a traceback
        print(f"kind.bench: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
