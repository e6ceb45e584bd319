"""`mokka host setup` / `mokka host cleanup`: stage a mock NVIDIA node under one root.

One plan, derived once from the validated profile, lists every step; ``apply`` runs the
steps through a :class:`~hostsetup.journal.Journal`, so each step is idempotent, atomic
and recorded, and ``cleanup`` restores the node byte for byte. Everything is computed
(profile compiled, paths checked) before the first write: a bad profile or an
unwritable root changes nothing.

Layout under ROOT (default /var/lib/mokka)::

    driver/usr/lib64/libnvidia-ml.so.<ver> (+ .so.1, .so)   the mock NVML, carrying the compiled state
    driver/usr/lib64/libcuda.so.<ver> (+ .so.1, .so)        the mock CUDA driver API
    driver/usr/bin/nvidia-smi                                when --nvidia-smi is given
    dev/nvidia0..N-1, nvidiactl, nvidia-uvm, ...             device nodes
    proc/driver/nvidia/..., proc/modules                     driver's procfs files
    sys/...                                                  PCI sysfs tree, /sys/module/nvidia
    lib/libmokka-sysfs.so                                    LD_PRELOAD redirect for C tools
    node.json                                                the layout the plugin and CDI read
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpumodel import driver_root, edits, nodelayout, state
from gpumodel.native import NativeMissing, library_path
from gpumodel.profile import Profile

from .journal import Journal, JournalError

DEFAULT_ROOT = Path("/var/lib/mokka")
RUN_NVIDIA = Path("/run/nvidia")


class SetupError(Exception):
    """Host setup cannot proceed; nothing was changed."""


@dataclass(frozen=True)
class Options:
    root: Path = DEFAULT_ROOT
    nvidia_smi: Path | None = None
    majors: str = "auto"  # "auto" | "real" | "safe"
    run_nvidia: Path | None = None  # where to make the /run/nvidia/driver link (None: skip)
    toolkit_ready: bool = False  # write <run_nvidia>/validations/toolkit-ready
    proc_devices: Path = Path("/proc/devices")


@dataclass
class Step:
    description: str
    run: Callable[[Journal], None]


@dataclass
class Plan:
    profile: Profile
    options: Options
    layout: nodelayout.NodeLayout
    steps: list[Step] = field(default_factory=list)

    def describe(self) -> str:
        lines = [
            f"host setup: {self.profile.gpu_count}x {self.profile.gpu.name} (profile {self.profile.name}) "
            f"under {self.options.root}"
        ]
        lines += [f"  {i + 1:2d}. {s.description}" for i, s in enumerate(self.steps)]
        return "\n".join(lines)


def real_driver_loaded(proc_devices: Path) -> bool:
    try:
        text = proc_devices.read_text()
    except OSError:
        return False
    return any(line.split()[-1:] in (["nvidia"], ["nvidia-frontend"]) for line in text.splitlines())


def choose_majors(options: Options) -> tuple[int, int]:
    mode = options.majors
    if mode == "auto":
        mode = "safe" if real_driver_loaded(options.proc_devices) else "real"
    table = edits.REAL_MAJORS if mode == "real" else edits.SAFE_MAJORS
    return table["gpu"], table["uvm"]


def _check_writable(root: Path) -> None:
    probe = root
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise SetupError(f"{root}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SetupError(f"{root}: {probe} is not writable")


def plan(profile: Profile, options: Options) -> Plan:
    """Every step of host setup, computed up front; raises SetupError before any write."""
    root = options.root.resolve() if options.root.exists() else options.root.absolute()
    _check_writable(root)
    if options.nvidia_smi is not None and not options.nvidia_smi.is_file():
        raise SetupError(f"--nvidia-smi {options.nvidia_smi}: no such file")
    try:
        staged = driver_root.contents(profile)
    except (state.StateError, NativeMissing) as exc:
        raise SetupError(str(exc)) from None
    shim: Path | None
    try:
        shim = library_path("libmokka-sysfs.so")
    except NativeMissing:
        shim = None
    gpu_major, uvm_major = choose_majors(options)
    devices = profile.devices()
    version = profile.driver.version
    libdir = root / "driver" / "usr" / "lib64"
    layout = nodelayout.NodeLayout(
        root=str(root),
        profile=profile.name,
        driver_version=version,
        libdir=str(libdir),
        state=str(libdir / f"libnvidia-ml.so.{version}"),  # the library carries the state
        dev_root=str(root / "dev"),
        gpu_major=gpu_major,
        uvm_major=uvm_major,
        gpus=tuple(nodelayout.GpuNode(d.index, d.uuid, d.bus_id, d.index) for d in devices),
        nvidia_smi=str(root / "driver" / "usr" / "bin" / "nvidia-smi") if options.nvidia_smi else None,
        sysfs_shim=str(root / "lib" / "libmokka-sysfs.so") if shim else None,
        cuda_library=str(libdir / f"libcuda.so.{version}"),
    )
    p = Plan(profile, options, layout)

    def driver(j: Journal) -> None:
        for f in staged.files:
            target = libdir / f.name
            # Running processes and containers map the state through the library's inode:
            # the same build is refreshed in place under the writer lock (which also repairs
            # a counter a killed writer left), anything else is replaced whole.
            if f.live and j.owns(target) and driver_root.refreshed_in_place(staged, target):
                continue
            j.write(target, f.data, f.mode)
        for name, target_name in staged.links:
            j.symlink(libdir / name, target_name)

    p.steps.append(
        Step(f"driver root {libdir}: libnvidia-ml.so.{version} carrying the state, libcuda.so.{version}, links", driver)
    )
    if options.nvidia_smi is not None:
        smi_src = options.nvidia_smi

        def smi(j: Journal) -> None:
            assert layout.nvidia_smi is not None
            j.copy(smi_src, Path(layout.nvidia_smi), 0o755)

        p.steps.append(Step(f"nvidia-smi from {smi_src} -> {layout.nvidia_smi}", smi))

    def nodes(j: Journal) -> None:
        for node in [edits.gpu_node(layout, g) for g in layout.gpus] + edits.control_nodes(layout):
            j.mknod(Path(node.host_path), node.major, node.minor)

    p.steps.append(
        Step(
            f"device nodes under {layout.dev_root}: nvidia0..{len(devices) - 1} (major {gpu_major}), "
            f"nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools (major {uvm_major})",
            nodes,
        )
    )

    def trees(j: Journal) -> None:
        from . import sysfs

        with tempfile.TemporaryDirectory(dir=root, prefix=".trees-") as tmp:
            sysfs.write_tree(profile, Path(tmp))
            for top in ("sys", "proc"):
                _install_tree(j, Path(tmp) / top, root / top)

    p.steps.append(
        Step(
            f"procfs and sysfs trees under {root}/proc and {root}/sys: /proc/driver/nvidia, "
            "/proc/modules, PCI functions, /sys/module/nvidia",
            trees,
        )
    )
    if shim is not None:
        shim_bytes = shim.read_bytes()

        def shim_step(j: Journal) -> None:
            assert layout.sysfs_shim is not None
            j.write(Path(layout.sysfs_shim), shim_bytes, 0o755)

        p.steps.append(Step(f"sysfs/procfs redirect shim -> {layout.sysfs_shim}", shim_step))
    if options.run_nvidia is not None:
        run_dir = options.run_nvidia

        def run_links(j: Journal) -> None:
            j.symlink(run_dir / "driver", str(root / "driver"))
            if options.toolkit_ready:
                j.write(run_dir / "validations" / "toolkit-ready", b"", 0o644)

        extra = " and validations/toolkit-ready" if options.toolkit_ready else ""
        p.steps.append(Step(f"{run_dir}/driver -> {root}/driver{extra}", run_links))

    def write_layout(j: Journal) -> None:
        j.write(root / "node.json", layout.to_json().encode(), 0o644)

    p.steps.append(Step(f"node layout {root}/node.json (read by the NRI plugin and the CDI generator)", write_layout))
    return p


def _install_tree(j: Journal, src: Path, dst: Path) -> None:
    """Replace the staged tree ``dst`` by ``src`` (a complete new tree) in one rename."""
    if dst.exists() and not j.owns(dst):
        raise JournalError(f"{dst}: exists and was not made by Mokka; refusing to replace it")
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
        os.rename(src, dst)
        shutil.rmtree(old)
    else:
        j.mkdir(dst.parent)
        os.rename(src, dst)
        j.adopt_dir(dst)


def apply(p: Plan, progress: Callable[[str], None] = lambda s: None) -> None:
    """Run every step; on failure undo what this run changed and re-raise."""
    root = Path(p.layout.root)
    journal = Journal.open(root)
    before = len(journal.entries)
    try:
        for i, step in enumerate(p.steps):
            progress(f"[{i + 1}/{len(p.steps)}] {step.description}")
            step.run(journal)
    except (OSError, JournalError) as exc:
        journal.undo(since=before)
        raise SetupError(f"host setup failed, changes of this run undone: {exc}") from None


def cleanup(root: Path) -> list[str]:
    """Undo everything host setup recorded under ``root``."""
    journal = Journal.open(root)
    if not journal.entries:
        return []
    return journal.undo()
