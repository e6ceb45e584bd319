"""End to end: CDI requests for mock GPUs through a real containerd (1.7 and 2.1) and podman.

Host setup stages the h100 profile (eight GPUs, Debian's nvidia-smi 550) under a temporary
root, the CDI generator writes its spec, and a private containerd started by the test creates
pods through CRI as kubelet would. A container asking for GPU 1 (by a ``cdi.k8s.io/``
annotation or by the CRI ``CDI_devices`` field) must see exactly that GPU: nvidia-smi, run
from the read-only mount CDI injected into an image with nothing NVIDIA inside, lists one GPU,
numbered 0, with GPU 1's UUID. Podman's ``--device nvidia.com/gpu=0`` must do the same for GPU 0.
Every test checks that nothing is left behind: processes, mounts, cgroups, directories.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import cdi
from containers import cleanup, images, podman, sandbox
from gpumodel import edits, nodelayout, profile

pytestmark = [pytest.mark.consumers, pytest.mark.slow, pytest.mark.root]

VERSIONS = ["1.7", "2.1"]
PROFILE = "h100"
LIBRARY_IN_CONTAINER = f"{edits.LIBDIRS_IN_CONTAINER[platform.machine()]}/libnvidia-ml.so.1"  # host setup's default
# What the workload container prints, section by section.
PROBE = (
    "echo '--- smi'; nvidia-smi -L; echo \"exit $?\"; "
    "echo '--- dev'; ls -l /dev; "
    "echo '--- env'; env; "
    "echo '--- mounts'; cat /proc/self/mountinfo; "
    f"echo '--- write'; touch {LIBRARY_IN_CONTAINER} 2>/dev/null && echo writable || echo read-only"
)


@pytest.fixture(autouse=True, scope="module")
def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (private containerd, device nodes, mounts)")


@pytest.fixture(scope="module")
def cdi_spec(tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout) -> Path:
    return cdi.write(cdi.render(layout), tmp_path_factory.mktemp("cdi"))


@pytest.fixture(params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def containerd(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, cdi_spec: Path, workload_image: Path
) -> Iterator[sandbox.Sandbox]:
    """A private containerd with the spec's directory as its CDI directory; checked clean afterwards."""
    base = tmp_path_factory.mktemp("sb")  # short: unix socket paths are limited to 108 bytes
    shutil.rmtree(base)
    log_file = tmp_path_factory.mktemp("logs") / f"containerd-{request.param}.log"
    box = sandbox.Sandbox(base, request.param, cdi_dirs=[cdi_spec.parent], log_file=log_file)
    with box:
        box.import_image(workload_image)
        assert images.WORKLOAD_IMAGE in box.images()  # CRI ListImages sees what ctr imported
        yield box
    assert cleanup.leftovers(base) == []
    assert not [pid for pid, argv in _containerd_processes().items() if any(str(base) in a for a in argv)]


def _containerd_processes() -> dict[int, list[str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, NotADirectoryError):
            continue
        if argv and Path(argv[0]).name in ("containerd", "containerd-shim-runc-v2"):
            found[int(entry.name)] = argv
    return found


def sections(output: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        if line.startswith("--- "):
            current = line[4:].strip()
            found[current] = []
        elif current:
            found[current].append(line)
    return found


NODE_RE = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(?P<major>\d+),\s+(?P<minor>\d+)\s.*\s(?P<name>\S+)$")


def device_nodes(listing: list[str]) -> dict[str, tuple[int, int]]:
    """``ls -l /dev`` lines -> {name: (major, minor)} of the character devices."""
    return {m["name"]: (int(m["major"]), int(m["minor"])) for m in map(NODE_RE.match, listing) if m}


def assert_sees_exactly(output: str, layout: nodelayout.NodeLayout, gpu: int) -> None:
    """The probe's output shows GPU ``gpu`` of the profile, alone, renumbered 0."""
    got = sections(output)
    device = profile.load(PROFILE).devices()[gpu]
    gpu_lines = [ln for ln in got["smi"] if re.match(r"GPU \d+:", ln)]
    assert gpu_lines == [f"GPU 0: {device.spec.name} (UUID: {device.uuid})"], output
    assert "exit 0" in got["smi"], output
    nodes = device_nodes(got["dev"])
    assert sorted(n for n in nodes if re.fullmatch(r"nvidia\d+", n)) == [f"nvidia{gpu}"], output
    assert nodes[f"nvidia{gpu}"] == (layout.gpu_major, gpu)
    assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} <= set(nodes), output
    assert not [e for e in got["env"] if e.startswith("MOKKA_STATE=")], output  # the library carries the state
    # the versioned file is mounted (libnvidia-ml.so.1 beside it: a second mount through CDI, the
    # hook's link to it through the plugin, as on a GPU node)
    versioned = f"{LIBRARY_IN_CONTAINER.removesuffix('.so.1')}.so.{layout.driver_version}"
    library = [ln.split() for ln in got["mounts"] if ln.split()[4] == versioned]
    assert len(library) == 1, output
    assert "ro" in library[0][5].split(","), library  # per-mount options
    assert got["write"] == ["read-only"], output


def test_cdi_annotation(containerd: sandbox.Sandbox, layout: nodelayout.NodeLayout) -> None:
    pod = containerd.run_pod("cdi-annotation")
    res = containerd.run_container(
        pod,
        images.WORKLOAD_IMAGE,
        ["sh", "-c", PROBE],
        name="gpu1",
        annotations={"cdi.k8s.io/mokka": "nvidia.com/gpu=1"},
    )
    assert res.exit_code == 0, res.logs
    assert_sees_exactly(res.logs, layout, 1)
    # A container of the same pod without a request gets nothing.
    plain = containerd.run_container(pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], name="plain")
    got = sections(plain.logs)
    assert not [ln for ln in got["dev"] if "nvidia" in ln], plain.logs
    assert not [ln for ln in got["env"] if ln.startswith("MOKKA_")], plain.logs
    assert "exit 127" in got["smi"], plain.logs  # no nvidia-smi in the image


def test_cri_cdi_devices_field(containerd: sandbox.Sandbox, layout: nodelayout.NodeLayout) -> None:
    """The CRI ``CDI_devices`` field (what kubelet fills from device plugins and DRA); 1.7.24 honours it too."""
    pod = containerd.run_pod("cdi-field")
    res = containerd.run_container(
        pod, images.WORKLOAD_IMAGE, ["sh", "-c", PROBE], name="gpu1", cdi_devices=["nvidia.com/gpu=1"]
    )
    assert res.exit_code == 0, res.logs
    assert_sees_exactly(res.logs, layout, 1)


def test_unresolvable_cdi_device(containerd: sandbox.Sandbox, layout: nodelayout.NodeLayout) -> None:
    """A GPU the spec does not have fails CreateContainer, with the CDI error."""
    pod = containerd.run_pod("cdi-unknown")
    missing = len(layout.gpus)
    with pytest.raises(sandbox.SandboxError, match=rf"unresolvable CDI devices nvidia.com/gpu={missing}"):
        containerd.create_container(
            pod, images.WORKLOAD_IMAGE, ["true"], annotations={"cdi.k8s.io/mokka": f"nvidia.com/gpu={missing}"}
        )


def test_podman_device(
    tmp_path_factory: pytest.TempPathFactory, workload_rootfs: Path, cdi_spec: Path, layout: nodelayout.NodeLayout
) -> None:
    """Debian's podman: ``--device nvidia.com/gpu=0`` with ``--rootfs`` of the same workload root."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (.ci/setup installs Debian's)")
    rootfs = tmp_path_factory.mktemp("podman-rootfs") / "rootfs"
    shutil.copytree(workload_rootfs, rootfs, symlinks=True)  # the runtime adds mount targets to it
    base = tmp_path_factory.mktemp("pm")
    shutil.rmtree(base)
    before = set(podman.PODMAN_CDI_DIRS[1].glob("mokka-*.json"))
    res = podman.podman_run(base, rootfs, ["sh", "-c", PROBE], devices=["nvidia.com/gpu=0"], cdi_spec=cdi_spec)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_sees_exactly(res.stdout, layout, 0)
    assert cleanup.leftovers(base, "podman") == []
    assert set(podman.PODMAN_CDI_DIRS[1].glob("mokka-*.json")) == before
