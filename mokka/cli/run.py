"""`mokka exec`, `mokka demo` and `mokka nri-plugin`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .root import GPUS_OPTION, MAX_GPUS, fail, load_profile, main


@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@GPUS_OPTION
@click.option(
    "--smi-version",
    default="550",
    show_default=True,
    help="Debian nvidia-smi to use when the command is `nvidia-smi` and none is installed.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(profile_name: str, gpus: int | None, smi_version: str, command: tuple[str, ...]) -> None:
    """Run COMMAND against a throw-away mock node: its driver and its PCI and InfiniBand sysfs.

    Stages the profile in a temporary directory, points LD_LIBRARY_PATH at its driver and
    preloads the sysfs shim over its /sys and /proc trees, then runs COMMAND: nvidia-smi, lspci,
    nvidia-smi topo -m and the InfiniBand tools (ibstat, ibstatus, ibv_devices) see the profile's
    GPUs and adapters. `nvidia-smi` is taken from PATH, else Debian's build is fetched into the cache
    (~/.cache/mokka). Examples: `mokka exec --profile a100 -- nvidia-smi -q`,
    `mokka exec --profile h100 -- ibstat`.
    """
    import os
    import shutil
    import subprocess
    import tempfile

    from fetch import nvidia_smi
    from gpumodel import driver_root

    if smi_version not in nvidia_smi.SUITES:
        fail(f"--smi-version {smi_version}: Debian ships nvidia-smi {', '.join(sorted(nvidia_smi.SUITES))}")
    p = load_profile(profile_name, gpus)
    argv = list(command)
    if argv[0] == "nvidia-smi" and not shutil.which("nvidia-smi"):
        try:
            if not nvidia_smi.cached(smi_version):
                click.echo(f"fetching Debian's nvidia-smi {smi_version} into the cache...", err=True)
            argv[0] = str(nvidia_smi.fetch(smi_version))
        except Exception as exc:
            fail(f"cannot get nvidia-smi {smi_version}: {exc}")
    from gpumodel.native import SYSFS_SHIM, NativeMissing, library_path
    from hostsetup import infiniband, sysfs

    with tempfile.TemporaryDirectory(prefix="mokka-exec-") as tmp:
        root = driver_root.stage(p, Path(tmp))
        env = dict(os.environ, LD_LIBRARY_PATH=str(root.libdir))
        try:
            shim = library_path(SYSFS_SHIM)
        except NativeMissing:
            shim = None  # a build without the shim: the driver alone, as before
        if shim is not None:
            sysfs.write_tree(p, Path(tmp) / "node")
            for name, _major, _minor in infiniband.device_nodes(p):  # libibverbs checks they exist
                path = Path(tmp) / "node" / "dev" / "infiniband" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            preload = " ".join(x for x in (str(shim), os.environ.get("LD_PRELOAD", "")) if x)
            env.update(LD_PRELOAD=preload, MOKKA_SYSFS_ROOT=str(Path(tmp) / "node"))
        try:
            code = subprocess.run(argv, env=env, check=False).returncode
        except FileNotFoundError:
            fail(f"{argv[0]}: command not found", 127)
    sys.exit(code)


@main.command("demo")
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@click.option(
    "--gpus", type=click.IntRange(1, MAX_GPUS), default=None, help="GPU count (default: the profile's gpu_count)."
)
@click.option(
    "--containerd",
    "version",
    type=click.Choice(["1.7", "2.1"]),
    default=None,
    help="Debian's containerd to use (default: the machine's containerd >= 1.7, else 2.1).",
)
@click.option("--keep", is_flag=True, help="Leave containerd, the plugin and the pod running.")
@click.option("--stop", "stop_", is_flag=True, help="Tear down a demo left by --keep (or by a killed run).")
def demo_cmd(profile_name: str, gpus: int | None, version: str | None, keep: bool, stop_: bool) -> None:
    """An unmodified container runs nvidia-smi and sees mock GPUs — no GPU, Kubernetes or Docker.

    Fetches what is missing (containerd, runc, nvidia-smi and busybox from Debian) into the
    cache (~/.cache/mokka, or $MOKKA_CACHE), stages a mock node with the profile's GPUs, starts
    a private containerd with NRI and the Mokka plugin, creates a pod through CRI and prints
    the container's nvidia-smi. Everything is torn down afterwards (also on Ctrl-C) unless
    --keep. Needs root.
    """
    import logging

    from containers.command import SandboxError
    from mokka import demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if stop_:
        try:
            left = demo.stop()
        except demo.DemoError as exc:
            fail(str(exc))
        if left:
            fail("could not remove: " + "; ".join(left))
        click.echo("demo stopped; nothing left behind")
        return
    try:
        code = demo.run(demo.Options(profile=profile_name, gpus=gpus, containerd=version, keep=keep))
    except demo.DemoError as exc:
        fail(str(exc))
    except SandboxError as exc:  # containerd failed us midway
        fail(f"{exc}\neverything the demo started was torn down")
    except KeyboardInterrupt:
        click.echo("\ninterrupted: everything the demo started was torn down", err=True)
        sys.exit(130)
    sys.exit(code)


@main.command(
    "nri-plugin",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def nri_plugin(args: tuple[str, ...]) -> None:
    """Run the NRI plugin: containers gain the node's mock GPUs at creation.

    Runs `python -m nri_mokka ARGS` in this process (the plugin does not load this command
    line's modules); `mokka nri-plugin --help` lists its options.
    """
    import os

    argv = [sys.executable, "-m", "nri_mokka", *args]
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        fail(f"cannot run {sys.executable} -m nri_mokka: {exc.strerror}")
