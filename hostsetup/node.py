"""`mokka host setup` / `mokka host cleanup`: stage a mock NVIDIA node under one root.

One plan, derived once from the validated profile, lists every step; ``apply`` runs the
steps through the crash-safe :class:`~hostsetup.journal.Journal` at ``ROOT/.mokka/journal.jsonl``,
so each step is idempotent, recorded before it changes anything, and ``cleanup`` restores the
node byte for byte, also after a setup that was killed at any point. Everything is computed
(profile compiled, paths checked, device numbers chosen) before the first write: a bad
profile or an unwritable root changes nothing. A re-run converges on the new plan: what an
earlier run staged and this one does not (GPUs beyond the new count, an nvidia-smi no longer
asked for, a /run/nvidia link) is undone.

Layout under ROOT (default /var/lib/mokka)::

    driver/usr/lib64/libnvidia-ml.so.<ver> (+ .so.1, .so)   the mock NVML, carrying the compiled state
    driver/usr/lib64/libcuda.so.<ver> (+ .so.1, .so)        the mock CUDA driver API
    driver/usr/lib64/libdcgm.so.4 (+ .so)                  the mock DCGM (dcgm-exporter), read through that NVML
    driver/usr/bin/nvidia-smi                                the nvidia-smi binary given
    driver/lib*/ld-linux*, libc.so.6, ...                    the host's C runtime for it: `chroot driver nvidia-smi`
    driver/usr/bin/nvidia-imex, nvidia-imex-ctl              the mock IMEX daemon and its query tool
    driver/var/log/kern.log                                  the driver's Xid lines of injected faults (`mokka fault`)
    dev/nvidia0..N-1, nvidiactl, nvidia-uvm, ...             device nodes
    dev/nvidia-caps/nvidia-cap<N>                            MIG capabilities (MIG-capable GPUs)
    dev/nvidia-caps-imex-channels/channel0                   IMEX channel 0 (NVLink-fabric boards)
    dev/nvidia-caps/nvidia-cap4323                           fabric-imex-mgmt, the IMEX daemon's (same boards)
    proc/driver/nvidia/..., proc/modules                     driver's procfs files
    proc/devices                                             the driver's majors (NVIDIA DRA's ALT_PROC_DEVICES_PATH)
    driver/dev/..., driver/proc/...                          the same device nodes and procfs files again: driver/ is
                                                             a whole driver root (usr, dev, proc), as a driver
                                                             container's is, for tools given one (NVIDIA's DRA chart)
    sys/...                                                  PCI sysfs tree, /sys/module/nvidia, InfiniBand classes
    dev/infiniband/uverbsN, umadN, issmN                     the InfiniBand adapters' device nodes (profiles with them)
    ib-relay/                                                where a process serving a MAD class (ibping -S) listens
                                                             (a link to the subnet's, on a local cluster's node)
    lib/libmokka-sysfs.so                                    LD_PRELOAD redirect for C tools
    lib/mokka-proc-hook                                      OCI hook: the driver's procfs files in a container's /proc
    node.json                                                the layout the plugin and CDI read
    .mokka/journal.jsonl                                     what to undo
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpumodel import driver_root, edits, mig, mig_state, nodelayout, state
from gpumodel.native import IMEX_TOOLS, PROC_HOOK, SYSFS_SHIM, NativeMissing, library_path
from gpumodel.profile import Profile

from . import infiniband, majors, sysfs
from .journal import Journal, JournalError

DEFAULT_ROOT = Path("/var/lib/mokka")
JOURNAL = Path(".mokka/journal.jsonl")
OLD_JOURNAL = Path(".mokka/journal.json")  # Mokka before the write-ahead journal
RELAY_MODE = 0o1777  # the InfiniBand relay directory: any process given an adapter may serve a MAD class there


class SetupError(Exception):
    """Host setup cannot proceed; nothing was changed (or this run's changes were undone)."""


@dataclass(frozen=True)
class Options:
    root: Path = DEFAULT_ROOT
    nvidia_smi: Path | None = None
    majors: str = "auto"  # "auto" | "real" | "safe"
    run_nvidia: Path | None = None  # where to make the /run/nvidia/driver link (None: skip)
    toolkit_ready: bool = False  # write <run_nvidia>/validations/toolkit-ready
    proc_devices: Path = Path("/proc/devices")
    machine: str | None = None  # the node's architecture; default: this machine's (uname -m)
    # The InfiniBand subnet's relay directory every node of a cluster shares, made by the caller with
    # RELAY_MODE (<root>/ib-relay links to it); None: the node's own, <root>/ib-relay. Used only on a
    # node with adapters.
    ib_relay: Path | None = None


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
            f"under {self.layout.root}"
        ]
        lines += [f"  {i + 1:2d}. {s.description}" for i, s in enumerate(self.steps)]
        return "\n".join(lines)


def resolve_root(root: Path) -> Path:
    """The root as every run spells it (symbolic links resolved, also below a missing tail)."""
    return Path(os.path.realpath(root))


def journal_path(root: Path) -> Path:
    return resolve_root(root) / JOURNAL


def _check_writable(root: Path) -> None:
    probe = root
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise SetupError(f"{root}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SetupError(f"{root}: {probe} is not writable")


def _built(name: str) -> Path | None:
    """A native program or library that may not have been built (staged only when it was)."""
    try:
        return library_path(name)
    except NativeMissing:
        return None


def _program_step(what: str, src: Path, dest: Path) -> Step:
    """Copy ``src`` (read now, before any write) to ``dest``, executable."""
    data = src.read_bytes()

    def copy(j: Journal) -> None:
        j.write(dest, data, 0o755)

    return Step(f"{what} -> {dest}", copy)


def plan(profile: Profile, options: Options) -> Plan:
    """Every step of host setup, computed up front; raises SetupError before any write."""
    root = resolve_root(options.root)
    _check_writable(root)
    machine = options.machine or platform.machine()
    if machine not in nodelayout.MACHINES:
        raise SetupError(f"machine {machine!r}: Mokka stages nodes for {', '.join(nodelayout.MACHINES)}")
    if options.nvidia_smi is not None and not options.nvidia_smi.is_file():
        raise SetupError(f"--nvidia-smi {options.nvidia_smi}: no such file")
    if options.ib_relay is not None and not options.ib_relay.is_dir():
        raise SetupError(f"InfiniBand relay directory {options.ib_relay}: no such directory")
    try:
        staged = driver_root.contents(profile)
        numbers = majors.choose(options.majors, options.proc_devices)
        imex_tools = {name: library_path(name).read_bytes() for name in IMEX_TOOLS}
    except (state.StateError, NativeMissing, majors.MajorError) as exc:
        raise SetupError(str(exc)) from None
    shim, hook = _built(SYSFS_SHIM), _built(PROC_HOOK)
    devices = profile.devices()
    mig_boards = {d.index: b for d in devices if (b := mig_state.board_of(d.spec)) is not None}  # minor = index
    version = profile.driver.version
    libdir = root / "driver" / "usr" / "lib64"
    layout = nodelayout.NodeLayout(
        root=str(root),
        profile=profile.name,
        driver_version=version,
        libdir=str(libdir),
        state=str(libdir / f"libnvidia-ml.so.{version}"),  # the library carries the state
        dev_root=str(root / "dev"),
        gpu_major=numbers.gpu,
        uvm_major=numbers.uvm,
        gpus=tuple(nodelayout.GpuNode(d.index, d.uuid, d.bus_id, d.index) for d in devices),
        nvidia_smi=str(root / "driver" / "usr" / "bin" / "nvidia-smi") if options.nvidia_smi else None,
        sysfs_shim=str(root / "lib" / SYSFS_SHIM) if shim else None,
        cuda_library=str(libdir / f"libcuda.so.{version}"),
        dcgm_library=str(libdir / driver_root.DCGM_SONAME),
        machine=machine,
        caps_major=numbers.caps if mig_boards else None,
        kernel_log=str(root / "driver" / "var" / "log" / "kern.log"),
        imex_major=numbers.imex,
        imex_caps_major=numbers.caps,
        proc_devices=str(root / "proc" / "devices"),
        imex_tools=str(root / "driver" / "usr" / "bin"),
        proc_hook=str(root / "lib" / PROC_HOOK) if hook else None,
        ib_relay=str(root / "ib-relay") if infiniband.device_nodes(profile) else None,
    )
    p = Plan(profile, options, layout)
    dev_root, driver_dev = Path(layout.dev_root), root / "driver" / "dev"

    def made(nodes: list[edits.DeviceNode]) -> list[tuple[Path, int, int, int]]:
        """``nodes`` under dev/ and again under driver/dev/."""
        out = []
        for n in nodes:
            path = Path(n.host_path)
            out += [
                (path, n.major, n.minor, n.file_mode),
                (driver_dev / path.relative_to(dev_root), n.major, n.minor, n.file_mode),
            ]
        return out

    def driver(j: Journal) -> None:
        for f in staged.files:
            target = libdir / f.name
            # Running processes and containers map the state through the library's inode:
            # the same build is refreshed in place under the writer lock (which also repairs
            # a counter a killed writer left), anything else is replaced whole.
            if f.live and j.owns(target) and driver_root.refreshed_in_place(staged, target):
                j.keep(target)
                continue
            j.write(target, f.data, f.mode)
        for name, target_name in staged.links:
            j.symlink(libdir / name, target_name)

    p.steps.append(
        Step(
            f"driver root {libdir}: libnvidia-ml.so.{version} carrying the state, libcuda.so.{version}, "
            f"{driver_root.DCGM_SONAME}, links",
            driver,
        )
    )
    if options.nvidia_smi is not None:
        smi_src = options.nvidia_smi

        def smi(j: Journal) -> None:
            assert layout.nvidia_smi is not None
            j.write(Path(layout.nvidia_smi), smi_src.read_bytes(), 0o755)

        p.steps.append(Step(f"nvidia-smi from {smi_src} -> {layout.nvidia_smi}", smi))
        runtime = {rel: src.read_bytes() for rel, src in driver_root.c_runtime(machine).items()}
        if runtime:

            def c_runtime(j: Journal) -> None:
                for rel, data in runtime.items():
                    j.write(root / "driver" / rel, data, 0o755)

            p.steps.append(Step(f"the C runtime nvidia-smi runs on -> {root}/driver/lib*", c_runtime))

    def imex(j: Journal) -> None:
        for name, data in imex_tools.items():
            j.write(root / "driver" / "usr" / "bin" / name, data, 0o755)

    p.steps.append(Step(f"mock IMEX daemon and query tool -> {layout.imex_tools}: {', '.join(IMEX_TOOLS)}", imex))

    def kernel_log(j: Journal) -> None:
        # Created empty so containers can mount it; a re-run keeps what faults logged.
        assert layout.kernel_log is not None
        log = Path(layout.kernel_log)
        if j.owns(log) and log.is_file():
            j.keep(log)
        else:
            j.write(log, b"", 0o644)

    p.steps.append(Step(f"kernel log for injected faults {layout.kernel_log}", kernel_log))

    def nodes(j: Journal) -> None:
        wanted = [edits.gpu_node(layout, g) for g in layout.gpus] + edits.control_nodes(layout)
        j.mknods(made(wanted))

    p.steps.append(
        Step(
            f"device nodes under {layout.dev_root} (and driver/dev): nvidia0..{len(devices) - 1} "
            f"(major {numbers.gpu}), nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools "
            f"(major {numbers.uvm}; {numbers.mode} numbers)",
            nodes,
        )
    )

    ib_nodes = [
        (dev_root / "infiniband" / name, major, minor) for name, major, minor in infiniband.device_nodes(profile)
    ]
    if ib_nodes:

        def ib_device_nodes(j: Journal) -> None:
            j.mknods([(path, major, minor, 0o666) for path, major, minor in ib_nodes])

        p.steps.append(
            Step(
                f"InfiniBand nodes under {layout.dev_root}/infiniband: rdma_cm, and uverbs, umad and issm of "
                f"{sum(name.startswith('uverbs') for name, _, _ in infiniband.device_nodes(profile))} adapter(s) "
                f"(major {infiniband.UVERBS_MAJOR})",
                ib_device_nodes,
            )
        )

    if layout.ib_relay:
        relay, shared = Path(layout.ib_relay), options.ib_relay

        def ib_relay(j: Journal) -> None:
            if shared is not None:
                j.symlink(relay, str(shared))
            else:  # a tree of its own, so that cleanup takes the sockets a killed server left with it
                j.install_tree(relay, lambda tmp: os.chmod(tmp, RELAY_MODE))

        p.steps.append(
            Step(
                f"InfiniBand relay directory {relay}"
                + (f" -> {shared} (the subnet's)" if shared else "")
                + ": MADs a process serves (ibping -S) reach it from the node's other processes and containers",
                ib_relay,
            )
        )

    # Boards on an NVLink fabric (IMEX's reach): channel 0 and the IMEX daemon's capability node,
    # as a node set up for IMEX has them; every node's /proc/devices names both majors.
    if all(d.spec.fabric.state != "Not Supported" for d in devices):

        def imex_nodes(j: Journal) -> None:
            j.mknods(made(edits.imex_nodes(layout)))

        p.steps.append(
            Step(
                f"IMEX nodes under {layout.dev_root} (and driver/dev): nvidia-caps-imex-channels/channel0 "
                f"(major {numbers.imex}), "
                f"nvidia-caps/nvidia-cap{mig.FABRIC_IMEX_MINOR} (fabric-imex-mgmt, major {numbers.caps})",
                imex_nodes,
            )
        )

    if mig_boards:
        caps = [1, 2] + [
            mig.cap_minor(minor, gi, ci) for minor, board in mig_boards.items() for gi, ci in mig.instance_ids(board)
        ]

        def cap_nodes(j: Journal) -> None:
            wanted = [edits.mig_cap_node(layout, minor) for minor in caps]
            j.mknods(made(wanted))

        p.steps.append(
            Step(
                f"MIG capability nodes under {layout.dev_root}/nvidia-caps (and driver/dev): config, monitor and "
                f"every GPU and compute instance the {len(mig_boards)} MIG-capable GPU(s) can hold "
                f"(major {numbers.caps})",
                cap_nodes,
            )
        )

    tree, empty = sysfs.files(profile), sysfs.directories(profile)
    tree[Path("proc/devices")] = majors.proc_devices_text(numbers).encode()

    def trees(j: Journal) -> None:
        for top in sysfs.TOPS:
            j.install_tree(root / top, functools.partial(sysfs.write_part, tree, empty, top))
        j.install_tree(root / "driver" / "proc", functools.partial(sysfs.write_part, tree, empty, "proc"))

    p.steps.append(
        Step(
            f"procfs and sysfs trees under {root}/proc (and driver/proc) and {root}/sys: /proc/driver/nvidia, "
            "/proc/modules, /proc/devices, PCI functions, /sys/module/nvidia",
            trees,
        )
    )
    for what, src, dest in (
        ("sysfs/procfs redirect shim", shim, layout.sysfs_shim),
        ("OCI hook showing containers the driver's /proc", hook, layout.proc_hook),
    ):
        if src is not None and dest is not None:
            p.steps.append(_program_step(what, src, Path(dest)))
    if options.run_nvidia is not None:
        run_dir = options.run_nvidia.absolute()

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


def apply(p: Plan, progress: Callable[[str], None] = lambda s: None) -> list[str]:
    """Run every step, then undo what earlier runs staged and this plan does not; return what was
    swept, rolled back (a killed run's leftovers) and undone.

    An interrupted earlier run is rolled back first. On failure what this run added is undone
    and SetupError raised.
    """
    root = Path(p.layout.root)
    try:
        _refuse_old_journal(root)
        journal = Journal.open(root / JOURNAL, f"mokka host setup under {root}")
    except (OSError, JournalError) as exc:
        raise SetupError(_describe(exc)) from None
    since = journal.next_seq
    try:
        for i, step in enumerate(p.steps):
            progress(f"[{i + 1}/{len(p.steps)}] {step.description}")
            step.run(journal)
        pruned = journal.prune()
        journal.compact()
        return journal.swept + journal.recovered + pruned
    except (OSError, JournalError) as exc:
        try:
            journal.undo(since)
            if not journal.entries:
                journal.teardown()
        except (OSError, JournalError) as again:
            raise SetupError(
                f"host setup failed ({_describe(exc)}) and undoing this run failed too ({_describe(again)}); "
                f"run `mokka host cleanup --root {root}`"
            ) from None
        raise SetupError(f"host setup failed, what this run added is undone: {_describe(exc)}") from None
    finally:
        journal.close()


def cleanup(root: Path) -> list[str]:
    """Undo everything host setup recorded under ``root`` (also after a killed setup); [] if nothing was there.

    Raises JournalError (the journal is unreadable or a change cannot be undone).
    """
    file = journal_path(root)
    _refuse_old_journal(file.parent.parent)
    try:
        journal = Journal.open(file)
        try:
            done = journal.swept + journal.recovered + journal.undo()
            done += journal.teardown()
        finally:
            journal.close()
    except OSError as exc:
        raise JournalError(f"host cleanup under {root} stopped: {_describe(exc)}; fix that and run it again") from None
    return done


def _refuse_old_journal(root: Path) -> None:
    if (root / OLD_JOURNAL).exists():
        raise JournalError(
            f"{root / OLD_JOURNAL}: staged by an older Mokka; undo it with that version's `mokka host cleanup` first"
        )


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
