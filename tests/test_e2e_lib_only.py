"""End to end: a container that gets nothing but ``libnvidia-ml.so.<version>`` (plus the
device nodes and nvidia-smi) sees the node, and its live changes.

That is all NVIDIA's own tools hand a container: ``nvidia-ctk cdi generate``, the device
plugin's CDI mode and NVIDIA's DRA driver mount the library, never a state file beside it.
The spec here is written the way those tools write theirs (read-only bind mounts of the
library under its versioned and ``.so.1`` names, device nodes, no Mokka environment) and
applied by a private containerd; the workload image has nothing NVIDIA inside.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from containers import cleanup, images, sandbox
from gpumodel import edits, nodelayout, profile, state

pytestmark = [pytest.mark.consumers, pytest.mark.slow, pytest.mark.root]

GPU = 1
HOT = 91
LIBDIR = edits.LIBDIRS_IN_CONTAINER[platform.machine()]  # host setup stages for this machine
# Print GPU 1's temperature until the host's live change shows, at most ~60 s.
WATCH = (
    "nvidia-smi -L; env | grep -c ^MOKKA_ || true; i=0; "
    "while [ $i -lt 300 ]; do t=$(nvidia-smi --query-gpu=temperature.gpu --format=csv,noheader); "
    f'echo "temp $t"; [ "$t" = {HOT} ] && break; i=$((i+1)); sleep 0.2; done'
)


@pytest.fixture(autouse=True, scope="module")
def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (private containerd, device nodes, mounts)")


def lib_only_spec(layout: nodelayout.NodeLayout, out: Path) -> Path:
    """A CDI spec shaped like nvidia-ctk's: the library, device nodes, nvidia-smi; nothing else."""
    ro = ["ro", "nosuid", "nodev", "bind"]

    def node(path: str, host: str, major: int, minor: int) -> dict[str, object]:
        return {"path": path, "hostPath": host, "type": "c", "major": major, "minor": minor, "permissions": "rw"}

    dev = layout.dev_root
    assert layout.nvidia_smi is not None
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {
                "name": str(GPU),
                "containerEdits": {
                    "deviceNodes": [node(f"/dev/nvidia{GPU}", f"{dev}/nvidia{GPU}", layout.gpu_major, GPU)]
                },
            }
        ],
        "containerEdits": {
            "deviceNodes": [
                node("/dev/nvidiactl", f"{dev}/nvidiactl", layout.gpu_major, 255),
                node("/dev/nvidia-uvm", f"{dev}/nvidia-uvm", layout.uvm_major, 0),
            ],
            "mounts": [
                {
                    "hostPath": layout.library,
                    "containerPath": f"{LIBDIR}/libnvidia-ml.so.{layout.driver_version}",
                    "options": ro,
                },
                {"hostPath": layout.library, "containerPath": f"{LIBDIR}/libnvidia-ml.so.1", "options": ro},
                {"hostPath": layout.nvidia_smi, "containerPath": "/usr/bin/nvidia-smi", "options": ro},
            ],
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "nvidia-lib-only.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


@pytest.fixture
def box(
    tmp_path_factory: pytest.TempPathFactory, layout: nodelayout.NodeLayout, workload_image: Path
) -> Iterator[sandbox.Sandbox]:
    spec = lib_only_spec(layout, tmp_path_factory.mktemp("cdi-lib-only"))
    base = tmp_path_factory.mktemp("lo")
    shutil.rmtree(base)
    b = sandbox.Sandbox(
        base, "2.1", cdi_dirs=[spec.parent], log_file=tmp_path_factory.mktemp("logs") / "containerd.log"
    )
    with b:
        b.import_image(workload_image)
        yield b
    assert cleanup.leftovers(base) == []


def test_library_alone_shows_the_node_and_its_live_changes(box: sandbox.Sandbox, layout: nodelayout.NodeLayout) -> None:
    device = profile.load(layout.profile).devices()[GPU]
    assert device.spec.temperature.gpu != HOT
    pod = box.run_pod("lib-only")
    cid = box.create_container(
        pod, images.WORKLOAD_IMAGE, ["sh", "-c", WATCH], name="watch", cdi_devices=[f"nvidia.com/gpu={GPU}"]
    )
    box.start_container(cid)
    deadline = time.monotonic() + 60
    while "temp " not in box.logs(cid):
        assert time.monotonic() < deadline, box.logs(cid)
        time.sleep(0.1)

    def heat(node: object, gpus: object) -> None:
        gpus[GPU].temp_gpu = HOT  # type: ignore[index]

    state.update(Path(layout.library), heat)  # on the host, in place: the container's mount sees it
    try:
        assert box.wait(cid, timeout=90) == 0
        out = box.logs(cid)
    finally:
        state.update(
            Path(layout.library), lambda node, gpus: setattr(gpus[GPU], "temp_gpu", device.spec.temperature.gpu)
        )  # type: ignore[index]
    lines = out.splitlines()
    assert lines[0] == f"GPU 0: {device.spec.name} (UUID: {device.uuid})", out
    assert lines[1] == "0", "no MOKKA_* variable in the container"
    temps = [ln.split()[1] for ln in lines if re.fullmatch(r"temp \d+", ln)]
    assert temps[0] == str(device.spec.temperature.gpu) and temps[-1] == str(HOT), out
