"""kind/bootstrap.sh as a developer runs it, on real kind here: the script itself, run by
:mod:`kind.provider` in its private namespaces (podman: no docker daemon), builds Mokka's image
from the Dockerfile (:mod:`kind.dockerfile_image`), loads it and debian:bookworm-slim into the
nodes (``kind load image-archive``), installs the chart on the ``integration`` worker, and checks
that a plain pod there lists the profile's GPUs with ``nvidia-smi -L`` and that the node carries
``nvidia.com/gpu.present=true``; then ``bootstrap.sh --delete`` and nothing left.

The cluster is created by the provider from kind/cluster-containerd-2.yaml on the node image built
here (as tests/test_kind_cluster.py does); bootstrap.sh finds it and reuses it (its own config
names kindest/node, which nothing here can pull). The private network namespace reaches no
network, so the image is first built on the host's (the Dockerfile's RUN steps reach Debian's
archive and PyPI): bootstrap.sh's own build, inside, then takes every layer from the cache.
Needs root, podman and ``.ci/setup --tests`` (kind, helm, the Kubernetes build, the node image).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fetch import debcache, prepare, versions
from fetch.kube import binaries

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpumodel import profile  # noqa: E402
from kind import nodeimage, provider  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (private namespaces, podman's private store)"),
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman is not installed (.ci/setup --tests installs it)"
    ),
]

NAME = "mokka"
CONFIG = REPO / "kind" / "cluster-containerd-2.yaml"
BOOTSTRAP = REPO / "kind" / "bootstrap.sh"
POOL = "run.ai/simulated-gpu-node-pool"
PROFILE = "h100"
HOW = prepare.HOW


@pytest.fixture
def parts() -> dict[str, Path]:
    """kind, helm, kubectl and the node image, as `.ci/setup --tests` left them (never built here)."""
    try:
        kind = prepare.go_binary(versions.KIND)
        helm = prepare.go_binary(versions.HELM)
    except prepare.NotPrepared as exc:
        pytest.fail(str(exc))
    kube = binaries.cached()
    if kube is None:
        pytest.fail(f"the Kubernetes build is missing: {HOW}")
    try:
        image = nodeimage.cached()
    except nodeimage.ImageError as exc:
        pytest.fail(str(exc))
    if image is None:
        pytest.fail(f"kind's node image is not built: {HOW}")
    if not provider.dns_tools_cached():
        pytest.fail(f"the dnsname CNI plugin and dnsmasq for podman are not fetched: {HOW}")
    return {"kind": kind, "helm": helm, "kubectl": kube.kubernetes / "kubectl", "image": image}


@pytest.fixture
def base() -> Iterator[Path]:
    # short: podman's sockets live below it (a Unix socket path has 108 bytes)
    path = Path(tempfile.mkdtemp(prefix="mokka-kb-", dir="/tmp"))
    yield path
    if path.exists() and not any(path.iterdir()):
        path.rmdir()
    shutil.rmtree(path.with_name(path.name + "-warm"), ignore_errors=True)


def test_bootstrap_on_kind_podman(parts: dict[str, Path], base: Path) -> None:
    cache = debcache.default_cache()
    times: dict[str, float] = {}
    t = time.monotonic()

    def lap(what: str) -> None:
        nonlocal t
        times[what] = round(time.monotonic() - t, 1)
        t = time.monotonic()

    # the image bootstrap.sh builds, built once on the host's network: its build inside then
    # needs none (the same recipe, the same sources, every layer cached)
    warm = base.with_name(base.name + "-warm")
    warm.mkdir()
    argv: list[str | Path] = [sys.executable, "-m", "kind.dockerfile_image", "--out", warm / "mokka.tar",
            "--base-out", warm / "base.tar", "--tag", "mokka:dev", "--nvidia-smi", "550"]  # fmt: skip
    built = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False,
        env={**os.environ, "MOKKA_CACHE": str(cache)},
    )  # fmt: skip
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    shutil.rmtree(warm)
    lap("image build on the host (cache)")

    before = provider.host_state()
    env = provider.KindEnvironment(base, parts["kind"], parts["kubectl"])
    tools = (parts["helm"], parts["kind"], parts["kubectl"], Path(sys.executable))
    path = ":".join(str(p.parent) for p in tools)

    def bootstrap(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return env.run(
            ["bash", BOOTSTRAP, "--name", NAME, "--profile", PROFILE, *args],
            env={"PATH": f"{path}:{env.env()['PATH']}", "MOKKA_CACHE": str(cache)},
            timeout=timeout,
            check=False,
        )

    try:
        env.start()
        env.load_image(parts["image"], nodeimage.NODE_IMAGE)
        config = base / "cluster.yaml"
        config.write_text(provider.cluster_config(CONFIG, nodeimage.NODE_IMAGE, nodeimage.etcd_image_tag()))
        created = env.kind("create", "cluster", "--name", NAME, "--config", str(config), check=False)
        assert created.returncode == 0, (created.stdout + created.stderr)[-3000:]
        env.record_containers()
        env.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=300s", timeout=320)
        lap("kind create cluster (provider)")

        res = bootstrap(timeout=1500)
        out = res.stdout + res.stderr
        lap("bootstrap.sh")
        assert res.returncode == 0, out[-4000:]
        assert "exists: reusing it" in out
        assert "== image mokka:dev (nvidia-smi 550, podman)" in out
        gpus = profile.load(PROFILE).gpu_count
        assert gpus == 8
        listed = [line for line in out.splitlines() if line.startswith("GPU ") and "NVIDIA H100" in line]
        assert len(listed) == gpus, out[-4000:]
        assert f"== ok: {gpus} mock GPUs in a plain pod on cluster {NAME} (context kind-{NAME})" in out

        # the chart's pod runs on the integration worker only, from the loaded image
        pods = env.kubectl(
            "-n", "mokka", "get", "pods", "--no-headers",
            "-o", "custom-columns=N:.spec.nodeName,P:.status.phase,I:.spec.containers[0].image",
        ).split("\n")  # fmt: skip
        rows = [line.split() for line in pods if line.strip()]
        assert rows == [[f"{NAME}-worker", "Running", "mokka:dev"]], rows
        labelled = env.kubectl("get", "nodes", "-l", f"{POOL}=integration,nvidia.com/gpu.present=true", "-o", "name")
        assert labelled.split() == [f"node/{NAME}-worker"]

        deleted = bootstrap("--delete", timeout=300)
        assert deleted.returncode == 0, (deleted.stdout + deleted.stderr)[-3000:]
        lap("bootstrap.sh --delete")
        assert env.podman("ps", "--all", "--quiet").split() == []
        assert env.podman("volume", "ls", "--quiet").split() == []
        assert NAME not in env.kind("get", "clusters").stdout.split()
    finally:
        problems = env.close()
        lap("close")
        print(f"kind bootstrap timings (s): {times}")
    assert problems == []
    assert env.leftovers() == []
    after = provider.host_state()
    assert {k: after[k] for k in before if after[k] != before[k]} == {}, "the host's network namespace changed"
