"""Every version Mokka fetches or builds, pinned in one place.

Debian packages come from a named suite through :mod:`fetch.debcache` (cached by the
``.deb``'s own version); Go programs are built by :mod:`fetch.gotool` from the Go module
proxy at a pinned module version and cached by it. ``python -m fetch.prepare`` fetches and
builds all of it once (``--tests`` adds what only the tests need).

Adding a Go program the tests need is one :class:`GoBuild` here and its name in
:data:`fetch.prepare.GO_BUILDS`; a test then gets its path from ``fetch.prepare.go_binary(SPEC)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BUSYBOX_SUITE",
    "CDI_SPEC",
    "CONTAINERD_SUITES",
    "CRI_API",
    "GO_DEBIAN",
    "GO_DEBIAN_BY_MINIMUM",
    "GO_MINIMUM",
    "GO_NVML_PROBE",
    "HELM",
    "KIND",
    "NRI_API",
    "NVIDIA_SMI_SUITES",
    "RUNC_SUITE",
    "TTRPC_API",
    "DebianPackage",
    "GoBuild",
    "command_name",
]

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DebianPackage:
    """A package of one Debian suite; ``upstream`` is the upstream version it must have (prefix match)."""

    suite: str
    package: str
    upstream: str = ""


@dataclass(frozen=True)
class GoBuild:
    """Go programs to build: ``commands`` (main package import paths) of ``module`` at ``version``,
    through a throw-away wrapper module that requires it; or, with ``source``, the main package
    of a local module of this repository, as the binary ``name`` (cached by the hash of its files).

    ``ldflags`` are what a project's release build stamps in (``-X pkg.var=value``); ``cgo`` for
    programs that need it (go-nvml dlopens the library through cgo).
    """

    name: str
    version: str
    commands: tuple[str, ...]
    module: str = ""
    source: Path | None = None
    ldflags: tuple[str, ...] = ()
    cgo: bool = False
    env: tuple[tuple[str, str], ...] = field(default=())
    why: str = ""  # what it is for, shown by fetch.prepare

    @property
    def binaries(self) -> tuple[str, ...]:
        if self.source is not None:
            return (self.name,)
        return tuple(command_name(c) for c in self.commands)


def command_name(package: str) -> str:
    """The binary ``go build`` names after a main package: its last element, a major-version
    suffix (``…/kind/v2``) skipped."""
    parts = package.rstrip("/").split("/")
    if len(parts) > 1 and parts[-1][:1] == "v" and parts[-1][1:].isdigit():
        return parts[-2]
    return parts[-1]


# ---- Debian ------------------------------------------------------------------------------

# nvidia-smi: 550 in trixie, 535 in bookworm, 555 in experimental (non-free); all run against
# the mock anywhere.
NVIDIA_SMI_SUITES = {"550": "trixie", "535": "bookworm", "555": "experimental"}
# containerd 1.7.24 (trixie) and 2.1.x (sid) run on bookworm when extracted (glibc >= 2.34).
CONTAINERD_SUITES = {"1.7": "trixie", "2.1": "sid"}
# runc from bookworm: trixie's and sid's need glibc 2.38.
RUNC_SUITE = "bookworm"
BUSYBOX_SUITE = "bookworm"
# The CRI API (runtime.v1) the sandbox speaks: trixie's containerd 1.7.24 and sid's 2.1.9 are
# both built with cri-api 0.32.3 (their Static-Built-Using), so this api.proto is theirs.
CRI_API = DebianPackage("trixie", "golang-github-kubernetes-cri-api-dev", "0.32.3")
# The official CDI JSON schema (for `mokka cdi generate --validate` and the CDI tests).
CDI_SPEC = DebianPackage("trixie", "golang-tags.cncf-container-device-interface-dev")
# NRI and ttrpc protos the wire-format tests compare the plugin's own proto against: the NRI
# of containerd 1.7 (0.6.1, trixie) and of 2.1 (0.8.0, sid).
NRI_API = (
    DebianPackage("trixie", "golang-github-containerd-nri-dev", "0.6.1"),
    DebianPackage("sid", "golang-github-containerd-nri-dev", "0.8.0"),
)
TTRPC_API = DebianPackage("trixie", "golang-github-containerd-ttrpc-dev")

# ---- Go ----------------------------------------------------------------------------------

# `go` from PATH (or /usr/local/go) when at least this new, else Debian's golang (GO_DEBIAN).
GO_MINIMUM = (1, 24)
GO_DEBIAN = DebianPackage("trixie", "golang-1.24", "1.24")
# Debian's golang for a build whose module asks for a newer Go (KWOK v0.8's go.mod: go 1.26.0).
GO_DEBIAN_BY_MINIMUM = {GO_MINIMUM: GO_DEBIAN, (1, 26): DebianPackage("sid", "golang-1.26", "1.26")}

HELM_VERSION = "v3.18.6"  # its client-go is 0.33: Kubernetes 1.33
HELM = GoBuild(
    name="helm",
    module="helm.sh/helm/v3",
    version=HELM_VERSION,
    commands=("helm.sh/helm/v3/cmd/helm",),
    why="the chart tests' helm lint / template; NVIDIA's DRA chart (mokka cluster up --allocator nvidia-dra)",
    # What helm's release build stamps in: its version and the Kubernetes version it renders for.
    ldflags=(
        f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        *(
            f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={n}"
            for pkg in ("chartutil", "lint/rules")
            for part, n in (("Major", 1), ("Minor", 33))
        ),
    ),
)

KIND_VERSION = "v0.33.0"
KIND = GoBuild(
    name="kind",
    module="sigs.k8s.io/kind",
    version=KIND_VERSION,
    commands=("sigs.k8s.io/kind",),
    why="the kind tests (tests/test_kind_cluster.py): kind on podman with a node image built here",
)

# A go-nvml program (the binding NVIDIA's device plugin and GFD use), from tests/go-nvml.
GO_NVML_PROBE = GoBuild(
    name="nvmlprobe",
    version="local",
    commands=(),
    source=REPO / "tests" / "go-nvml",
    cgo=True,
    env=(("CGO_CFLAGS", "-O2 -Wno-deprecated-declarations"),),
    why="a go-nvml program (as the device plugin and GFD bind NVML) against the mock",
)
