"""kind.dockerfile_image: Mokka's image built from the Dockerfile with Debian's podman on a locally
made debian:bookworm-slim, then checked from its archive as kind would get it.

The archive is loaded into a fresh private podman store (removed after) and run there: the
`mokka` CLI works, nvidia-smi is where the chart expects it, the image runs as uid 10001, the
build-time volumes left nothing in it, and its base is slim. Root, Debian's podman and (on a cold
cache) Debian's archive and PyPI are needed; later builds come from the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from containers import cleanup, sandbox
from fetch import debcache
from fetch.kube import binaries, versions

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kind import dockerfile_image as di  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (podman's private store, runc)"),
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="podman is not installed (.ci/setup --tests installs Debian's)"
    ),
]

NAME = "docker.io/library/mokka:dev"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    var_lib_containers = Path("/var/lib/containers").exists()
    out = tmp_path_factory.mktemp("dockerfile-image") / "mokka.tar"
    di.build(out, tag="mokka:dev", nvidia_smi="550", base_out=out.with_name("debian.tar"))
    if not var_lib_containers:
        assert not Path("/var/lib/containers").exists(), "podman wrote into the host's /var/lib/containers"
    return out


@pytest.fixture(scope="module")
def loaded(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[di.Podman]:
    store = tmp_path_factory.mktemp("podman-store") / "store"
    with di.Podman(store, keep_storage=False) as podman:
        res = podman("load", "--input", archive, timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        yield podman
    assert cleanup.leftovers(podman.base, "podman") == []
    assert not store.exists() and not cleanup.mounts_under(store)


# One container answers every question (each podman run here takes ~20 s: podman 4.3 waits out
# conmon's exit timeout with runc on this host).
PROBE = r"""
echo "version=$(mokka --version)"
echo "uid=$(id -u):$(id -g)"
echo "smi=$(test -x /usr/local/lib/mokka/nvidia-smi && stat -c '%a:%U' /usr/local/lib/mokka/nvidia-smi)"
echo "gfd=$(gpu-feature-discovery --version 2>&1 | head -n 1)"
echo "kwok=$(kwok --version 2>&1 | head -n 1)"
echo "stages=$(ls /usr/local/share/mokka/kwok | tr '\n' ' ')"
api='from k8snode.dra import api; print(",".join(n for n, _ in api.DRA_SERVICES))'
echo "kubelet_api=$(python3 -c "$api" 2>&1 | tail -n 1)"
echo "pages=$(find /usr/share/man /usr/share/info -type f | wc -l)"
echo "apt_doc=$(ls /usr/share/doc/apt | tr '\n' ' ')"
echo "uris=$(sed -n 's/^URIs: //p' /etc/apt/sources.list.d/debian.sources | tr '\n' ' ')"
echo "sources_list=$(ls /etc/apt/sources.list 2>/dev/null)"
echo "perl=$(for p in usrmerge perl; do dpkg -s "$p" >/dev/null 2>&1 && echo "$p"; done)"
"""


@pytest.fixture(scope="module")
def probe(loaded: di.Podman) -> dict[str, str]:
    res = loaded("run", "--rm", *loaded.run_args(), NAME, "sh", "-c", PROBE, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


def repo_tags(archive: Path) -> list[list[str]]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return [m["RepoTags"] for m in json.load(member)]


def test_archives_name_the_images_as_containerd_reads_them(archive: Path) -> None:
    assert repo_tags(archive) == [[NAME]]
    assert repo_tags(archive.with_name("debian.tar")) == [[di.BASE_IMAGE]]  # the smoke pod's image


def test_containerd_imports_it_as_kind_load_does(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """`kind load image-archive` runs `ctr -n k8s.io images import --all-platforms --digests` on each
    node: a private containerd 2.1 does the same, and CRI then lists the name `image: mokka:dev` means."""
    base = tmp_path_factory.mktemp("sb")  # short: unix socket paths are limited to 108 bytes
    shutil.rmtree(base)
    with sandbox.Sandbox(base, "2.1") as box:
        for tarball in (archive, archive.with_name("debian.tar")):
            box.ctr("images", "import", "--all-platforms", "--digests", str(tarball), timeout=300)
        deadline = time.monotonic() + 30
        while not {NAME, di.BASE_IMAGE} <= set(box.images()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {NAME, di.BASE_IMAGE} <= set(box.images())
    assert cleanup.leftovers(base) == []


def test_mokka_runs(probe: dict[str, str]) -> None:
    assert probe["version"].startswith("mokka, version"), probe


def test_nvidia_smi_where_the_chart_expects_it(probe: dict[str, str]) -> None:
    assert probe["smi"] == "755:root", probe


def test_the_fleets_programs_where_the_chart_expects_them(probe: dict[str, str]) -> None:
    """NVIDIA's GFD (fleet.controller.gfd) and KWOK with its module's stages (fleet.kwok), built in a
    stage of their own from the module proxy."""
    assert probe["gfd"] == f"GPU Feature Discovery version {versions.DEVICE_PLUGIN}", probe
    assert versions.KWOK in probe["kwok"], probe
    assert probe["stages"].split() == sorted(Path(s).name for s in binaries.KWOK_STAGES), probe


def test_the_fleet_stage_finds_the_hosts_builds_of_the_same_recipes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build-time home holds the host's GFD and KWOK builds where the fleet stage's
    ``gobuild.build`` looks (the same recipes and keys), so a cold build compiles neither again."""
    from fetch.kube import gobuild

    host = di._host_builds(None)
    assert [b.name for b in host] == [s.key() for s in (binaries.DEVICE_PLUGIN, binaries.KWOK)]
    home = di._build_home(tmp_path, None, host)
    stage_cache = home / ".cache" / "mokka"  # ~/.cache/mokka of root's RUN steps, the home mounted over /root
    for spec, build in zip((binaries.DEVICE_PLUGIN, binaries.KWOK), host, strict=True):
        assert gobuild.cached(spec, stage_cache) == gobuild.bin_root(stage_cache) / build.name
    assert not (home / ".config").exists()  # no CA bundle given: no pip configuration
    trixie = {"ID": "debian", "VERSION_CODENAME": "trixie"}
    monkeypatch.setattr(di.platform, "freedesktop_os_release", lambda: trixie)
    assert di._host_builds(None) == []  # another release's glibc: the stage compiles them


def test_the_dra_plugins_kubelet_api_is_compiled_in(probe: dict[str, str]) -> None:
    """`mokka dra-plugin` (the chart's dra.enabled) speaks the kubelet's plugin APIs: their bindings are
    compiled at build time, since a pod has neither the network nor a writable package to do it."""
    assert probe["kubelet_api"] == "v1.DRAPlugin,v1beta1.DRAPlugin", probe


def test_runs_as_uid_10001(probe: dict[str, str]) -> None:
    assert probe["uid"] == "10001:10001", probe


def test_the_base_is_slim_with_the_archive_as_sources(probe: dict[str, str]) -> None:
    assert probe["pages"] == "0"  # no manual or info pages
    assert probe["apt_doc"].split() == ["copyright"]  # the copyright files stay
    mirror = debcache.MIRROR.rstrip("/")
    assert probe["uris"].split() == [mirror, mirror.removesuffix("/debian") + "/debian-security"]
    assert probe["sources_list"] == "" and probe["perl"] == ""  # deb822 only; usr-is-merged, not usrmerge


def test_build_volumes_left_nothing(archive: Path) -> None:
    """The build-time home over /root (pip's CA) leaves no entry in any layer."""
    found = []
    with tarfile.open(archive) as outer:
        for member in outer.getmembers():
            if not member.isfile() or not member.name.endswith(".tar"):
                continue
            fh = outer.extractfile(member)
            assert fh is not None
            with tarfile.open(fileobj=fh) as layer:
                found += [
                    n
                    for n in layer.getnames()
                    if n.lstrip("./").startswith(("root/.config", "etc/pip.conf", "run/mokka"))
                ]
    assert found == []


def test_a_failing_build_is_one_line(archive: Path, tmp_path: Path) -> None:
    """An nvidia-smi version Debian has not: the build stops at that step, one error line, no traceback."""
    cmd = [sys.executable, "-m", "kind.dockerfile_image", "--out", str(tmp_path / "x.tar"), "--tag", "mokka:broken"]
    res = subprocess.run([*cmd, "--nvidia-smi", "999"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("dockerfile_image: error: podman build of ") and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "x.tar").exists()


def test_help() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "kind.dockerfile_image", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 0 and "--out PATH" in res.stdout and "--nvidia-smi" in res.stdout
