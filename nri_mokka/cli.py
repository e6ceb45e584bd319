"""The ``mokka`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml

from . import __version__, nvidia_smi
from . import profile as profiles
from .native import NativeMissing
from .state import StateError


def fail(message: str, code: int = 1) -> None:
    click.echo(f"mokka: error: {message}", err=True)
    sys.exit(code)


def load_profile(name_or_file: str, gpus: int | None) -> profiles.Profile:
    try:
        return profiles.load(name_or_file).with_count(gpus)
    except profiles.ProfileError as exc:
        fail(str(exc))
    except ValueError as exc:  # pydantic ValidationError from with_count
        fail(f"{name_or_file}: {exc}")
    raise AssertionError("unreachable")


GPUS_OPTION = click.option(
    "--gpus", type=click.IntRange(1, profiles.MAX_GPUS), default=None, help="GPU count (default: the profile's)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mokka")
def main() -> None:
    """Make a CPU-only Linux node look like an NVIDIA GPU node.

    Profiles describe the GPUs; `driver-root` stages a mock libnvidia-ml.so.1 that the
    real nvidia-smi and every NVML binding read.
    """


@main.group()
def profile() -> None:
    """List, show and validate GPU profiles."""


@profile.command("list")
def profile_list() -> None:
    """List the built-in profiles."""
    rows = []
    for name in profiles.builtin_names():
        p = profiles.load(name)
        rows.append((name, f"{p.gpu_count}x {p.gpu.name}", p.description))
    width = max(len(r[0]) for r in rows)
    gwidth = max(len(r[1]) for r in rows)
    for name, gpus, desc in rows:
        click.echo(f"{name:<{width}}  {gpus:<{gwidth}}  {desc}")


@profile.command("show")
@click.argument("name_or_file")
@GPUS_OPTION
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--resolved", is_flag=True, help="Print every GPU with overrides applied and identity filled in.")
def profile_show(name_or_file: str, gpus: int | None, fmt: str, resolved: bool) -> None:
    """Print a profile (built-in NAME or a YAML FILE)."""
    p = load_profile(name_or_file, gpus)
    data: object = p.model_dump(mode="json", exclude_defaults=False)
    if resolved:
        data = {
            "profile": p.name,
            "gpus": [
                {
                    "index": d.index,
                    "bus_id": d.bus_id,
                    "uuid": d.uuid,
                    "serial": d.serial,
                    "numa_node": d.numa_node,
                    "module_id": d.module_id,
                    **d.spec.model_dump(mode="json"),
                }
                for d in p.devices()
            ],
        }
    if fmt == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


@profile.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def profile_validate(files: tuple[str, ...]) -> None:
    """Validate profile FILES; print each problem with its field path."""
    bad = 0
    for file in files:
        try:
            p = profiles.load(Path(file))
            from .state import compile_profile

            compile_profile(p)
        except (profiles.ProfileError, StateError) as exc:
            click.echo(str(exc), err=True)
            bad += 1
            continue
        click.echo(f"{file}: ok ({p.gpu_count}x {p.gpu.name})")
    if bad:
        sys.exit(1)


@main.command("driver-root")
@click.option("--profile", "profile_name", required=True, help="Built-in profile name or a profile YAML file.")
@GPUS_OPTION
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory to stage.")
def driver_root_cmd(profile_name: str, gpus: int | None, out: Path) -> None:
    """Stage a mock driver root: libnvidia-ml.so.<version>, its links and the state.

    Afterwards any NVML consumer run with LD_LIBRARY_PATH=OUT/usr/lib64 sees the
    profile's GPUs, e.g. `LD_LIBRARY_PATH=OUT/usr/lib64 nvidia-smi`.
    """
    from . import driver_root

    p = load_profile(profile_name, gpus)
    try:
        root = driver_root.stage(p, out)
    except (StateError, NativeMissing) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{out}: {exc.strerror or exc}")
    click.echo(f"staged {p.gpu_count}x {p.gpu.name} (profile {p.name}, driver {p.driver.version})")
    click.echo(f"  library: {root.library}")
    click.echo(f"  state:   {root.state}")
    click.echo(f"try: LD_LIBRARY_PATH={root.libdir} nvidia-smi")


@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.option(
    "--profile", "profile_name", default="h100", show_default=True, help="Built-in profile name or a profile YAML file."
)
@GPUS_OPTION
@click.option(
    "--smi-version",
    type=click.Choice(sorted(nvidia_smi.SUITES)),
    default="550",
    show_default=True,
    help="Debian nvidia-smi to use when the command is `nvidia-smi` and none is installed.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_cmd(profile_name: str, gpus: int | None, smi_version: str, command: tuple[str, ...]) -> None:
    """Run COMMAND against a throw-away mock driver root.

    Stages the profile in a temporary directory, points LD_LIBRARY_PATH at it and runs
    COMMAND. `nvidia-smi` is taken from PATH, else Debian's build is fetched into the
    cache (~/.cache/mokka). Example: `mokka exec --profile a100 -- nvidia-smi -q`.
    """
    import os
    import shutil
    import subprocess
    import tempfile

    from . import driver_root

    p = load_profile(profile_name, gpus)
    argv = list(command)
    if argv[0] == "nvidia-smi" and not shutil.which("nvidia-smi"):
        try:
            click.echo(f"fetching Debian's nvidia-smi {smi_version} into the cache...", err=True)
            argv[0] = str(nvidia_smi.fetch(smi_version))
        except Exception as exc:
            fail(f"cannot get nvidia-smi {smi_version}: {exc}")
    with tempfile.TemporaryDirectory(prefix="mokka-exec-") as tmp:
        root = driver_root.stage(p, Path(tmp))
        env = dict(os.environ, LD_LIBRARY_PATH=str(root.libdir))
        try:
            code = subprocess.run(argv, env=env, check=False).returncode
        except FileNotFoundError:
            fail(f"{argv[0]}: command not found", 127)
    sys.exit(code)


@main.command("bench")
@click.option("--profile", "profile_name", default="h100", show_default=True)
@GPUS_OPTION
@click.option(
    "--nvidia-smi",
    "smi",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="nvidia-smi binary to time (default: search the cache and PATH).",
)
@click.option("--calls", default=1_000_000, show_default=True, help="Calls per getter.")
def bench_cmd(profile_name: str, gpus: int | None, smi: str | None, calls: int) -> None:
    """Measure the mock library: ns per call, nvmlInit time, nvidia-smi wall time and RSS."""
    from . import bench

    p = load_profile(profile_name, gpus if gpus is not None else 8)
    bench.run(p, smi, calls)


if __name__ == "__main__":
    main()
