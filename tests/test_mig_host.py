"""MIG on a staged node: /dev/nvidia-caps, the capability files and mig-minors host setup
stages, and what cleanup undoes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mig_fixtures import mig_profile_data, write_profile

from gpumodel import mig, nodelayout, profile
from hostsetup import node


def setup(tmp_path: Path, data: dict[str, object]) -> Path:
    root = tmp_path / "root"
    prof = profile.load(write_profile(tmp_path / "p.yaml", data))
    node.apply(node.plan(prof, node.Options(root=root, majors="safe")))
    return root


def test_mig_capable_gpus_get_capability_nodes_and_files(tmp_path: Path) -> None:
    root = setup(
        tmp_path,
        mig_profile_data(
            "h100", 2, mode=True, instances=[{"profile": "3g.40gb", "compute": ["1c.3g.40gb", "1c.3g.40gb"]}]
        ),
    )
    layout = nodelayout.NodeLayout.load(root)
    assert layout.caps_major == 122  # the safe range: nothing a driver allocates
    caps = root / "dev/nvidia-caps"
    names = {p.name for p in caps.iterdir()} - {f"nvidia-cap{mig.FABRIC_IMEX_MINOR}"}  # IMEX's, on every node
    # GI ids 0..13 (7g: 0, 4g/3g: 1, 3g: 2, 2g/1g.20gb: 3-5, 1g.20gb: 6, 1g: 7-13), CIs up to the slices
    assert len(names) == 2 + 2 * (14 + 7 + 4 + 3 + 3 * 2 + 1 + 7 * 1)
    assert (
        "nvidia-cap" + str(mig.cap_minor(0, 14)) not in names
        and "nvidia-cap" + str(mig.cap_minor(0, 1, 4)) not in names
    )
    for minor, mode in ((1, 0o400), (2, 0o444), (mig.cap_minor(1, 0, 6), 0o444), (mig.cap_minor(1, 13, 0), 0o444)):
        st = (caps / f"nvidia-cap{minor}").lstat()
        assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 122 and os.minor(st.st_rdev) == minor
        assert stat.S_IMODE(st.st_mode) == mode
    minors = (root / "proc/driver/nvidia-caps/mig-minors").read_text()
    assert minors == mig.mig_minors_text()
    proc = root / "proc/driver/nvidia/capabilities"
    assert (proc / "mig/config").read_text().startswith("DeviceFileMinor: 1\n")
    # the declared 3g sits at 4:4, GI id 2, with CIs 0 and 1, on both GPUs
    for gpu in (0, 1):
        gi = proc / f"gpu{gpu}/mig/gi2"
        assert (
            gi / "access"
        ).read_text() == f"DeviceFileMinor: {mig.cap_minor(gpu, 2)}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
        assert sorted(p.name for p in gi.iterdir()) == ["access", "ci0", "ci1"]
        assert (gi / "ci1/access").read_text().startswith(f"DeviceFileMinor: {mig.cap_minor(gpu, 2, 1)}\n")
    node.cleanup(root)
    assert not root.exists() or not any(root.iterdir())


def test_boards_without_mig_get_none(tmp_path: Path) -> None:
    root = setup(tmp_path, mig_profile_data("t4", 1))
    assert nodelayout.NodeLayout.load(root).caps_major is None
    assert not (root / "dev/nvidia-caps").exists()
    assert (root / "proc/driver/nvidia-caps/mig-minors").exists()  # the driver lists them on any board
