"""Fetch and build, once, everything the demo and the tests use: ``python -m fetch.prepare [--tests]``.

One progress line per item on stderr: what, why, how long it took, or "cached" when there was
nothing to do. Versions are pinned in :mod:`fetch.versions` and results cached by version in
the private cache (``$MOKKA_CACHE``, default ``~/.cache/mokka``). The demo's items come first
(Debian's nvidia-smi, containerd, runc, busybox and the CRI bindings); ``--tests`` adds what
only the tests need, Go builds included, so that no test ever compiles or downloads a program.
At the end the package lists are dropped, the ``.deb`` files already unpacked emptied (their
names stay), and Debian's Go toolchain removed when one was unpacked for the builds.

The Go builds run in the background, sharing Go's caches (:mod:`fetch.gobuilds`): when the first
item that needs one is reached, every item's builds are queued, so the next builds run while an
item does what it needs besides Go.

Tests ask for a Go program with :func:`go_binary`, which never builds: it names the command
to run when the program is missing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fetch import busybox, cdi_schema, containerd_dist, debcache, gobuilds, gotool, kubelet_api, nvidia_smi, versions
from fetch import cri_bindings as bindings
from fetch.debprogram import DebianProgram
from fetch.kube import binaries as kube_binaries
from fetch.kube import gobuild as kube_gobuild
from fetch.kube import gpu_operator
from fetch.kube import versions as kube_versions
from fetch.progress import Progress
from fetch.versions import GoBuild

__all__ = ["ITEMS", "NotPrepared", "debian_program", "go_binary", "main", "prepare"]

HOW = "run `.ci/setup --tests` (or `.venv/bin/python -m fetch.prepare --tests`)"


class NotPrepared(RuntimeError):
    """Something the tests need was not fetched or built by ``fetch.prepare``."""


@dataclass(frozen=True)
class Item:
    what: str
    why: str
    done: Callable[[Path], bool]  # whether make() would do nothing (never uses the network)
    make: Callable[[Path], object]  # fetch or build; returns what it made (shown)
    tests: bool = False  # only the tests need it
    go: tuple[gobuilds.Spec, ...] = ()  # the Go builds make() needs: built beforehand, in the background


def _unpacked(suite: str, package: str, member: str | Path) -> Callable[[Path], bool]:
    program = DebianProgram(suite, package, Path(member))
    return lambda cache: program.cached(cache) is not None


def _debs(why: str, *packages: versions.DebianPackage) -> Item:
    def done(cache: Path) -> bool:
        return all(debcache.cached(p.suite, p.package, cache) for p in packages)

    def make(cache: Path) -> object:
        return ", ".join(debcache.fetch(p.suite, [p.package], cache)[p.package].name for p in packages)

    names = ", ".join(f"{p.package} ({p.suite})" for p in packages)
    return Item(f"Debian {names}", why, done, make, True)


def _program(what: str, program: DebianProgram, why: str) -> Item:
    done = _unpacked(program.suite, program.package, program.member)
    return Item(f"{what} ({program})", why, done, program.binary, tests=True)


def _bindings_done(cache: Path) -> bool:
    spec = versions.CRI_API
    return debcache.cached(spec.suite, spec.package, cache) is not None and bindings.ready(cache)


def _go(spec: GoBuild) -> Item:
    source = f"tests/{spec.source.name}" if spec.source else f"{spec.module}@{spec.version}"
    return Item(
        f"{spec.name} (Go, {source})",
        spec.why,
        lambda cache: gotool.cached(spec, cache) is not None,
        lambda cache: gotool.build(spec, cache),
        tests=True,
        go=(spec,),
    )


def _smi(version: str, why: str, *, tests: bool = False) -> Item:
    suite = versions.NVIDIA_SMI_SUITES[version]
    return Item(
        f"nvidia-smi {version} (Debian {suite})",
        why,
        _unpacked(suite, "nvidia-smi", nvidia_smi.BINARY),
        lambda cache: nvidia_smi.fetch(version, cache),
        tests=tests,
    )


def _containerd(version: str) -> Item:
    suite = versions.CONTAINERD_SUITES[version]
    return Item(
        f"containerd {version} (Debian {suite})",
        "the demo's container runtime" if version == "2.1" else "`mokka demo --containerd 1.7` and the tests",
        _unpacked(suite, "containerd", "usr/bin/containerd"),
        lambda cache: containerd_dist.fetch(version, cache),
    )


# What the tests take from Go; each is built by `prepare --tests`, older builds are pruned.
GO_BUILDS = (versions.HELM, versions.GO_NVML_PROBE, versions.KIND)


ITEMS: tuple[Item, ...] = (
    _smi("550", "the real nvidia-smi the demo's container runs"),
    _smi("535", "the tests run 535 too"),
    _containerd("2.1"),
    _containerd("1.7"),
    Item(
        f"runc (Debian {versions.RUNC_SUITE})",
        "the OCI runtime under containerd and podman",
        _unpacked(versions.RUNC_SUITE, "runc", "usr/sbin/runc"),
        containerd_dist.runc,
    ),
    Item(
        f"busybox (Debian {versions.BUSYBOX_SUITE})",
        "the userland of the demo's and the tests' images",
        _unpacked(versions.BUSYBOX_SUITE, "busybox-static", "bin/busybox"),
        busybox.fetch,
    ),
    Item(
        f"CRI bindings (betterproto, {versions.CRI_API.package} {versions.CRI_API.upstream})",
        "CRI from Python: pods and containers without crictl",
        _bindings_done,
        lambda cache: bindings.load(cache).__name__,
    ),
    _smi("555", "the tests and the fidelity scores run 555 too", tests=True),
    Item(
        f"CDI schema (Debian {versions.CDI_SPEC.suite})",
        "`mokka cdi generate` validates against it; the CDI tests",
        _unpacked(versions.CDI_SPEC.suite, versions.CDI_SPEC.package, cdi_schema.SCHEMA_DIR / "schema.json"),
        cdi_schema.fetch_schema,
        tests=True,
    ),
    _debs("the official protos the NRI wire-format tests compare against", *versions.NRI_API, versions.TTRPC_API),
    _debs(
        "the Go fallbacks for machines without Go >= 1.24 (KWOK: 1.26) (unpacked only when used), and their test",
        *(
            versions.DebianPackage(spec.suite, f"{spec.package}-{part}")
            for spec in versions.GO_DEBIAN_BY_MINIMUM.values()
            for part in ("go", "src")
        ),
    ),
    Item(
        "Go toolchain",
        "for the Go builds below (PATH's go when new enough, else Debian's)",
        lambda cache: all(gotool.cached(s, cache) for s in GO_BUILDS) or gotool.existing(cache) is not None,
        gotool.find,
        tests=True,
    ),
    *(_go(spec) for spec in GO_BUILDS),
    Item(
        f"kubelet plugin API bindings (k8s.io/kubelet {kubelet_api.KUBELET_MODULE[1]} protos, Go module proxy)",
        "`mokka dra-plugin` and its tests",
        lambda cache: kubelet_api.current() and kubelet_api.module_dir(*kubelet_api.KUBELET_MODULE, cache) is not None,
        lambda cache: kubelet_api.generate(cache=cache, force=True),
        tests=True,
    ),
    Item(
        "Kubernetes, NVIDIA's device plugin and GFD, CoreDNS, KWOK, NFD (Go), etcd and CNI plugins (Debian)",
        "`mokka cluster` and the cluster tests (cold: about 18 CPU-minutes of Go builds)",
        lambda cache: kube_binaries.cached(cache) is not None,
        lambda cache: kube_binaries.ensure(cache).kubernetes,
        tests=True,
        go=kube_binaries.GO_BUILDS,
    ),
    Item(
        f"Karpenter's KWOK provider {kube_versions.KARPENTER} and its CRDs (Go; {kube_versions.KARPENTER_GOTOOLCHAIN}, "
        "newer than Debian's, from the Go module proxy)",
        "`mokka cluster up --karpenter` and its tests (cold: about 2 minutes)",
        lambda cache: kube_gobuild.cached(kube_binaries.KARPENTER, cache) is not None,
        lambda cache: kube_gobuild.build(kube_binaries.KARPENTER, cache),
        tests=True,
        go=(kube_binaries.KARPENTER,),
    ),
    _program(
        "OCI registry",
        kube_versions.REGISTRY,
        "the FGO mock-backend test: a local registry the cluster's containerd pulls Mokka's node image from",
    ),
    _program("Prometheus", kube_versions.PROMETHEUS, "the tests' image of the chart's integrations.prometheus"),
    Item(
        f"NVIDIA's GPU Operator {kube_versions.GPU_OPERATOR_RELEASE} (operator, validator, chart), NFD's image "
        f"build, NVIDIA's device plugin and GFD {kube_versions.GPU_OPERATOR_DEVICE_PLUGIN} and container toolkit "
        f"{kube_versions.CONTAINER_TOOLKIT} (Go)",
        "`mokka cluster up --gpu-operator` and its tests",
        lambda cache: gpu_operator.cached(cache) is not None,
        lambda cache: gpu_operator.ensure(cache).operator,
        tests=True,
        go=gpu_operator.GO_BUILDS,
    ),
)


def go_binary(spec: GoBuild, binary: str | None = None, cache: Path | None = None) -> Path:
    """The path of ``spec``'s (``binary``, default its first) program, built by ``prepare --tests``; never builds."""
    found = gotool.cached(spec, cache)
    if found is None:
        raise NotPrepared(f"{spec.name} {spec.version} is not built: {HOW}")
    return found / (binary or spec.binaries[0])


def debian_program(program: DebianProgram, cache: Path | None = None) -> Path:
    """The path of ``program``, unpacked by ``prepare --tests``; never fetches."""
    found = program.cached(cache)
    if found is None:
        raise NotPrepared(f"{program} is not unpacked: {HOW}")
    return found


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) if path.exists() else 0


def prepare(*, tests: bool = False, cache: Path | None = None, extra: Sequence[Item] = ()) -> None:
    """Make every item (``tests``: the tests' too), then ``extra`` (what a checkout's developer
    tooling adds: kind.prepare); raise on the first failure."""
    cache = cache or debcache.default_cache()
    items = [i for i in (*ITEMS, *extra) if tests or not i.tests]
    progress = Progress(len(items) + 1, prefix="prepare ")
    builds, queued = gobuilds.GoBuilds(cache), False
    try:
        for item in items:
            with progress.step(f"{item.what} — {item.why}") as note:
                if item.done(cache):
                    note("cached")
                    continue
                if item.go:
                    if not queued:  # every item's builds, in order: the later ones run while this one waits
                        builds.start(s for i in items for s in i.go)
                        queued = True
                    builds.wait(item.go)
                made = str(item.make(cache))
                note(made.removeprefix(f"{cache}/"))
    finally:
        builds.close()
    with progress.step("cache clean-up: apt's package lists dropped, the .debs already unpacked emptied") as note:
        note(f"{debcache.trim(cache) / 2**20:.0f} MB freed")
        if tests:  # every Go build is done
            if gotool.drop_debian_toolchain(cache):
                note("Debian's Go toolchain removed (its .debs stay)")
            if stale := gotool.prune(list(GO_BUILDS), cache):
                note("removed stale Go builds and caches: " + ", ".join(stale))
            kube_builds = (
                *kube_binaries.GO_BUILDS, kube_binaries.KUBEADM, kube_binaries.KARPENTER, *gpu_operator.GO_BUILDS
            )  # fmt: skip
            if stale := kube_gobuild.prune(kube_builds, cache):
                note("removed stale cluster builds: " + ", ".join(stale))
        sizes = {d.name: _size(d) for d in sorted(cache.iterdir()) if d.is_dir()}
        note(
            f"{cache}: {sum(sizes.values()) / 2**20:.0f} MB ("
            + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in sizes.items())
            + ")"
        )


def main(argv: list[str] | None = None, extra: Sequence[Item] = (), prog: str = "python -m fetch.prepare") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", action="store_true", help="also what only the tests need (Go builds included)")
    ap.add_argument(
        "--cache", type=Path, default=None, help="cache directory (default: $MOKKA_CACHE or ~/.cache/mokka)"
    )
    ap.add_argument("--list", action="store_true", help="list the items and whether each is cached; change nothing")
    args = ap.parse_args(argv)
    cache = args.cache or debcache.default_cache()
    if args.list:
        for item in (*ITEMS, *extra):
            state = "cached" if item.done(cache) else "missing"
            print(f"{'tests' if item.tests else 'demo ':<6}{state:<8}{item.what}: {item.why}")
        return 0
    try:
        prepare(tests=args.tests, cache=cache, extra=extra)
    except (debcache.FetchError, bindings.BindingsError, gotool.BuildError, OSError, ValueError) as exc:
        print(f"prepare: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
