"""`mokka demo`: an unmodified container on this CPU-only machine runs nvidia-smi and sees
the profile's GPUs — containerd, the NRI plugin and the mock node, end to end, in one go.

Everything lives under one private directory (``/run/mokka-demo``) and is torn down at the
end — also on Ctrl-C or failure — unless ``--keep``; the binaries it needs are cached under
``~/.cache/mokka`` (``$MOKKA_CACHE``), so a second run fetches nothing. It compiles nothing:
CRI is spoken from Python (:mod:`containers.cri`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import click

from containers import cleanup, images, sandbox
from containers.plugin_process import PluginProcess
from fetch import busybox, containerd_dist, debcache, nvidia_smi
from fetch import cri_bindings as bindings
from fetch.progress import Progress
from gpumodel import edits, nodelayout

T = TypeVar("T")
DEFAULT_BASE = Path("/run/mokka-demo")


class DemoError(Exception):
    """A prerequisite is missing or a step failed; the message says what to do."""


@dataclass
class Options:
    profile: str = "h100"
    gpus: int | None = None  # None: the profile's gpu_count
    containerd: str | None = None  # "1.7" | "2.1" | None: the machine's if usable, else 2.1
    keep: bool = False
    base: Path = DEFAULT_BASE


def _command() -> str:
    """How this ``mokka`` is run: the console script beside the interpreter, else ``mokka``."""
    beside = Path(sys.executable).parent / "mokka"
    return str(beside) if beside.is_file() else "mokka"


def check_prerequisites(base: Path) -> None:
    if os.geteuid() != 0:
        raise DemoError(
            "mokka demo needs root: it starts a private containerd and creates device nodes "
            f"(run it as root: sudo {_command()} demo)"
        )
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems:
        subprocess.run(["modprobe", "overlay"], capture_output=True, check=False)
        if "overlay" not in Path("/proc/filesystems").read_text():
            raise DemoError(
                "overlayfs is not available (containerd's snapshotter needs it): load it with `modprobe overlay`"
            )
    if base.exists() and any(base.iterdir()):
        raise DemoError(
            f"{base} is in use (a demo kept with --keep, or one still running): remove it with `mokka demo --stop`"
        )


def _fetch(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, with each way a first fetch fails said in one line: its real cause and what to do."""
    cache = debcache.default_cache()
    try:
        return fn()
    except debcache.FetchError as exc:
        cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DemoError(
            f"cannot get {what} from Debian's archive ({cause}): the first run downloads it into {cache} "
            "(or run .ci/setup where the archive is reachable); later runs need no network"
        ) from None
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and str(exc.filename or "").startswith(str(cache)):
            raise DemoError(
                f"cannot get {what}: the cache {cache} is not writable ({exc.strerror}): "
                "set MOKKA_CACHE to a writable directory"
            ) from None
        raise DemoError(f"cannot get {what}: {exc}") from None
    except (bindings.BindingsError, subprocess.CalledProcessError) as exc:
        raise DemoError(f"cannot get {what}: {exc}") from None


def _machine_containerd() -> tuple[Path, str] | None:
    """A containerd >= 1.7 already on PATH (with ctr and the runc shim beside it), if any:
    (its directory, "1.7" or "2.1" for the configuration dialect it speaks)."""
    found = shutil.which("containerd")
    if not found or not all((Path(found).parent / b).exists() for b in ("ctr", "containerd-shim-runc-v2")):
        return None
    out = subprocess.run([found, "--version"], capture_output=True, text=True, check=False).stdout
    for word in out.split():
        parts = word.lstrip("v").split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            major, minor = int(parts[0]), int(parts[1])
            if (major, minor) >= (1, 7):
                return Path(found).parent, ("1.7" if major == 1 else "2.1")
            return None
    return None


def run(opts: Options) -> int:
    """Run the demo; return the container's exit status."""
    from gpumodel.profile import ProfileError, load
    from hostsetup import node

    try:
        prof = load(opts.profile).with_count(opts.gpus)
    except (ProfileError, ValueError) as exc:
        raise DemoError(str(exc)) from None
    check_prerequisites(opts.base)
    progress = Progress(total=7)
    base = opts.base
    plugin: PluginProcess | None = None
    box: sandbox.Sandbox | None = None
    node_root = base / "node"
    staged = False
    done = False
    # SIGTERM tears down like Ctrl-C.
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with progress.step("binaries: containerd, runc, nvidia-smi, busybox; CRI bindings") as note:
            machine = _machine_containerd() if opts.containerd is None else None
            local = machine[0] if machine else None
            version = machine[1] if machine else (opts.containerd or "2.1")
            if local is not None:
                note(f"containerd from {local}")
            else:
                bindir = _fetch(f"containerd {version}", lambda: containerd_dist.fetch(version))
                note(f"containerd {version} from Debian ({bindir})")
            runc = Path(shutil.which("runc") or _fetch("runc", containerd_dist.runc))
            smi = _fetch("nvidia-smi 550", lambda: nvidia_smi.fetch("550"))
            _fetch("busybox", busybox.fetch)
            _fetch("the CRI bindings", bindings.load)
            note(f"nvidia-smi {smi}")
            note(f"cache {debcache.default_cache()}")
        with progress.step(f"mock node: {prof.gpu_count}x {prof.gpu.name} under {node_root}") as note:
            base.mkdir(parents=True, exist_ok=True)
            node.apply(node.plan(prof, node.Options(root=node_root, nvidia_smi=smi)))
            staged = True
            layout = nodelayout.NodeLayout.load(node_root)
            note(f"{len(layout.gpus)} GPUs, device major {layout.gpu_major}")
        with progress.step("workload image (glibc + busybox, nothing NVIDIA)"):
            needs = [smi, Path(layout.library)] + ([Path(layout.sysfs_shim)] if layout.sysfs_shim else [])
            rootfs = images.make_rootfs(base / "workload", programs=needs)
            image = images.oci_archive(rootfs, base / "workload.tar", images.WORKLOAD_IMAGE)
            shutil.rmtree(rootfs)
        with progress.step(f"containerd {version if local is None else '(machine)'} with NRI and CDI") as note:
            box = sandbox.Sandbox(base / "sb", version, nri=True, runtime_handlers={"runc": runc}, bindir=local)
            box.start()
            box.import_image(image)
            note(f"containerd {box.server_version}, socket {box.address}")
        with progress.step("NRI plugin (mokka nri-plugin)") as note:
            log_path = base / "plugin.log"
            plugin = PluginProcess(box.nri_socket, node_root, log_path.open("ab"))
            try:
                plugin.wait_registered()
            except (RuntimeError, TimeoutError) as exc:
                raise DemoError(f"{exc}:\n{log_path.read_text()[-2000:]}") from None
            note(f"registered; log {log_path}")
        with progress.step("pod and container through CRI: nvidia-smi") as note:
            pod = box.run_pod("mokka-demo")
            result = box.run_container(pod, images.WORKLOAD_IMAGE, ["nvidia-smi"], name="nvidia-smi")
            note(f"exit {result.exit_code}")
        click.echo(result.logs, nl=not result.logs.endswith("\n"))
        injected = [ln.split(": ", 2)[-1] for ln in log_path.read_text().splitlines() if "/nvidia-smi:" in ln]
        click.echo("What the plugin injected into the container (it has nothing NVIDIA of its own):")
        if injected:
            click.echo(f"  {injected[-1]}")
        all_edits = edits.with_driver_procfs(layout, edits.container_edits(layout, layout.gpus))
        click.echo(f"  device nodes: {', '.join(n.path for n in all_edits.device_nodes)}")
        for m in all_edits.mounts:
            click.echo(f"  mount ({m.options[0]}): {m.host_path} -> {m.container_path}")
        for h in all_edits.hooks:  # the driver's /proc, the libraries' second names, the staged trees
            click.echo(f"  hook: {h.path} {' '.join(h.args[1:])}")
        click.echo(f"  env: {' '.join(sorted(all_edits.env_dict()))}")
        with progress.step("teardown" if not opts.keep else "kept running (--keep)") as note:
            if opts.keep:
                note(f"stop it with `mokka demo --stop`; CRI socket {box.address}")
            else:
                done = True
                teardown(base, box, plugin, node_root if staged else None)
                note("processes, mounts, cgroups and files removed")
        return result.exit_code
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not opts.keep and not done:
            teardown(base, box, plugin, node_root if staged else None)


def teardown(base: Path, box: sandbox.Sandbox | None, plugin: PluginProcess | None, node_root: Path | None) -> None:
    """Stop everything the demo started and remove every file it made outside the cache."""
    from hostsetup import node

    problems = []
    if plugin is not None:
        plugin.stop()
    _stop_plugins(base)  # one started just as Ctrl-C arrived is not in `plugin` yet
    if box is not None:
        try:
            box.stop()
        except sandbox.SandboxError as exc:
            problems.append(str(exc))
    if node_root is not None:
        with contextlib.suppress(Exception):
            node.cleanup(node_root)
    shutil.rmtree(base, ignore_errors=True)
    if problems:
        click.echo("mokka demo: teardown incomplete: " + "; ".join(problems), err=True)


def _stop_plugins(base: Path) -> None:
    """SIGTERM (then SIGKILL) every NRI plugin process (`python -m nri_mokka`) serving a socket under ``base``."""
    pids = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            argv = (proc_dir / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ("nri-plugin" in argv or "nri_mokka" in argv) and str(base) in argv:
            pids.append(int(proc_dir.name))
            with contextlib.suppress(OSError):
                os.kill(pids[-1], signal.SIGTERM)
    deadline = time.monotonic() + 10
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.waitpid(pid, os.WNOHANG)  # our own child: reap it
            if Path(f"/proc/{pid}/stat").exists() and ") Z " in Path(f"/proc/{pid}/stat").read_text():
                break
            time.sleep(0.02)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stop(base: Path = DEFAULT_BASE) -> list[str]:
    """Tear down a demo kept with --keep (or one that was killed): whatever is under ``base``."""
    from hostsetup import node

    if not base.exists():
        return []
    if os.geteuid() != 0:
        raise DemoError(f"stopping the demo under {base} needs root, as running it did (hint: sudo mokka demo --stop)")
    _stop_plugins(base)
    for version in ("2.1", "1.7"):
        if (base / "sb").exists():
            box = sandbox.Sandbox(base / "sb", version, nri=True)
            box.adopt()
            with contextlib.suppress(sandbox.SandboxError):
                box.stop()
    if (base / "node").exists():
        with contextlib.suppress(Exception):
            node.cleanup(base / "node")
    shutil.rmtree(base, ignore_errors=True)
    return cleanup.leftovers(base)
