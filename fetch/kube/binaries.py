"""The cluster's binaries: Kubernetes, NVIDIA's device plugin + GFD, CoreDNS and KWOK built from the Go module proxy,
etcd from Debian trixie; each built or fetched once into the cache, versions from :mod:`versions`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fetch import debcache
from fetch.kube import gobuild, versions

_K8S_MINOR = versions.KUBERNETES.removeprefix("v").split(".")[1]
_K8S_VERSION_VARS = [
    f"-X {pkg}.{var}={value}"
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for var, value in (
        ("gitVersion", versions.KUBERNETES),
        ("gitMajor", "1"),
        ("gitMinor", _K8S_MINOR),
        ("gitTreeState", "clean"),
    )
]

KUBERNETES = gobuild.GoBuild(
    name="kubernetes",
    module="k8s.io/kubernetes",
    version=versions.KUBERNETES,
    # One program for the six commands (gosrc/kube.go): a third of their separate size.
    main=Path(__file__).resolve().parent / "gosrc" / "kube.go",
    links=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet", "kubectl"),
    ldflags=tuple(_K8S_VERSION_VARS),
    staging_version=versions.KUBERNETES_STAGING,
)

# kubeadm (kind's node image runs it), apart from KUBERNETES so that build's key stays: the same
# version and stamped version as the other commands.
KUBEADM = gobuild.GoBuild(
    name="kubeadm",
    module="k8s.io/kubernetes",
    version=versions.KUBERNETES,
    commands=("k8s.io/kubernetes/cmd/kubeadm",),
    ldflags=tuple(_K8S_VERSION_VARS),
    staging_version=versions.KUBERNETES_STAGING,
)

DEVICE_PLUGIN = gobuild.GoBuild(
    name="k8s-device-plugin",
    module="github.com/NVIDIA/k8s-device-plugin",
    version=versions.DEVICE_PLUGIN,
    commands=(
        "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin",
        "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery",
        # The CDI hook the device plugin's CDI specs name, and nvidia-ctk, at the toolkit version the
        # device plugin itself requires.
        "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook",
        "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk",
    ),
    ldflags=(f"-X github.com/NVIDIA/k8s-device-plugin/internal/info.version={versions.DEVICE_PLUGIN}",),
    cgo=True,  # go-nvml dlopens libnvidia-ml through cgo
)

# The cluster's DNS (Services by name), as every Kubernetes cluster has it.
COREDNS = gobuild.GoBuild(
    name="coredns",
    module="github.com/coredns/coredns",
    version=versions.COREDNS,
    commands=("github.com/coredns/coredns",),
)

# KWOK's own "fast" stages (its module ships them): a node Ready at once and its heartbeat with a
# lease; a pod Running at once, Succeeded when its containers are meant to end, deleted when asked.
KWOK_STAGES = tuple(
    f"kustomize/stage/{kind}/{variant}/{name}.yaml"
    for kind, variant, name in (
        ("node", "fast", "node-initialize"),
        ("node", "heartbeat-with-lease", "node-heartbeat-with-lease"),
        ("pod", "fast", "pod-ready"),
        ("pod", "fast", "pod-complete"),
        ("pod", "fast", "pod-delete"),
    )
)
# Thousands of virtual nodes without a kubelet each (``--virtual``).
KWOK = gobuild.GoBuild(
    name="kwok",
    module="sigs.k8s.io/kwok",
    version=versions.KWOK,
    commands=("sigs.k8s.io/kwok/cmd/kwok",),
    go=(1, 26),
    files=KWOK_STAGES,
)

# Karpenter's KWOK provider (``--karpenter``) with its CRDs: NodePool, NodeClaim and the rest from
# its chart, KWOKNodeClass from its API.
KARPENTER = gobuild.GoBuild(
    name="karpenter-kwok",
    module="sigs.k8s.io/karpenter",
    version=versions.KARPENTER,
    commands=("sigs.k8s.io/karpenter/kwok",),
    go=(1, 26),
    env=(("GOTOOLCHAIN", versions.KARPENTER_GOTOOLCHAIN),),
    files=(("kwok/charts/crds", "crds"), ("kwok/apis/crds", "nodeclass-crds")),
)

# Node Feature Discovery's master and worker (the labels the GPU Operator and NVIDIA's DRA chart
# select GPU nodes by), with NFD's CRDs from its module. Built as a host's NFD: it reads the node's
# own /sys and /etc (the image NFD publishes reads them under /host-, where its pods mount them).
NFD = gobuild.GoBuild(
    name="node-feature-discovery",
    module="sigs.k8s.io/node-feature-discovery",
    version=versions.NFD,
    commands=(
        "sigs.k8s.io/node-feature-discovery/cmd/nfd-master",
        "sigs.k8s.io/node-feature-discovery/cmd/nfd-worker",
    ),
    ldflags=(f"-X sigs.k8s.io/node-feature-discovery/pkg/version.version={versions.NFD}",),
    files=("deployment/base/nfd-crds/nfd-api-crds.yaml",),
    requires=(("sigs.k8s.io/node-feature-discovery/api/nfd", versions.NFD),),
)

GO_BUILDS = (KUBERNETES, DEVICE_PLUGIN, COREDNS, KWOK, NFD)
CNI_DIR = "usr/lib/cni"
CNI_PLUGINS = ("bridge", "host-local", "loopback")


@dataclass(frozen=True)
class Binaries:
    """Paths of every program the cluster runs."""

    kubernetes: Path  # kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl
    device_plugin: Path  # nvidia-device-plugin, gpu-feature-discovery, nvidia-cdi-hook, nvidia-ctk
    coredns: Path
    kwok: Path
    nfd: Path  # nfd-master, nfd-worker, nfd-api-crds.yaml
    etcd: Path
    cni: Path  # directory of the CNI plugins (bridge, host-local, loopback)

    def __getitem__(self, name: str) -> Path:
        for d in (self.kubernetes, self.device_plugin, self.coredns, self.kwok, self.nfd):
            if (d / name).is_file():
                return d / name
        if name == "etcd":
            return self.etcd
        raise KeyError(name)


def etcd(cache: Path | None = None) -> Path:
    """Debian trixie's etcd server binary, fetched and unpacked once (only the binary kept)."""
    deb = debcache.fetch(versions.ETCD_SUITE, [versions.ETCD_PACKAGE], cache)[versions.ETCD_PACKAGE]
    member = Path("usr/bin/etcd")
    return debcache.unpacked(deb, member, cache, keep=[member])


def cni_plugins(cache: Path | None = None) -> Path:
    """Debian's CNI plugins the cluster uses (bridge, host-local, loopback), unpacked once; the others dropped."""
    deb = debcache.fetch(versions.CNI_SUITE, [versions.CNI_PACKAGE], cache)[versions.CNI_PACKAGE]
    keep = [Path(CNI_DIR) / name for name in CNI_PLUGINS]
    return debcache.unpacked(deb, keep[0], cache, keep=keep).parent


def cached(cache: Path | None = None) -> Binaries | None:
    """Every binary, when all are in the cache already (no network, no build)."""
    dirs = [gobuild.cached(spec, cache) for spec in GO_BUILDS]
    cache = cache or debcache.default_cache()
    etcds = sorted((cache / "extract").glob(f"{versions.ETCD_PACKAGE}_*/usr/bin/etcd"))
    cnis = sorted(d for d in (cache / "extract").glob(f"{versions.CNI_PACKAGE}_*/{CNI_DIR}") if (d / "bridge").exists())
    if None in dirs or not etcds or not cnis:
        return None
    k8s, dp, dns, kwok, nfd = dirs
    assert k8s is not None and dp is not None and dns is not None and kwok is not None and nfd is not None
    return Binaries(k8s, dp, dns, kwok, nfd, etcds[-1], cnis[-1])


def ensure(cache: Path | None = None, progress: gobuild.Progress = gobuild.stderr_progress) -> Binaries:
    """Build or fetch what is missing; one progress line per step."""
    return Binaries(
        kubernetes=gobuild.build(KUBERNETES, cache, progress),
        device_plugin=gobuild.build(DEVICE_PLUGIN, cache, progress),
        coredns=gobuild.build(COREDNS, cache, progress),
        kwok=gobuild.build(KWOK, cache, progress),
        nfd=gobuild.build(NFD, cache, progress),
        etcd=etcd(cache),
        cni=cni_plugins(cache),
    )


def main() -> int:
    """``python -m fetch.kube.binaries``: build or fetch every binary, one progress line per step."""
    import sys
    import time

    t0 = time.monotonic()
    found = cached()
    if found is not None:
        print(f"Kubernetes binaries: cached ({found.kubernetes.parent})", file=sys.stderr)
        return 0
    try:
        ensure()
    except (gobuild.BuildError, debcache.FetchError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Kubernetes binaries: ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
