"""The ``mokka`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import yaml

from . import __version__, nvidia_smi

if TYPE_CHECKING:
    from . import profile as profiles

# Heavy modules (pydantic, cffi) are imported inside the commands that need them, so the
# long-running `mokka nri-plugin` stays small. MAX_GPUS mirrors profile.MAX_GPUS (a test checks).
MAX_GPUS = 64


def fail(message: str, code: int = 1) -> None:
    click.echo(f"mokka: error: {message}", err=True)
    sys.exit(code)


def load_profile(name_or_file: str, gpus: int | None) -> profiles.Profile:
    from . import profile as profiles

    try:
        return profiles.load(name_or_file).with_count(gpus)
    except profiles.ProfileError as exc:
        fail(str(exc))
    except ValueError as exc:  # pydantic ValidationError from with_count
        fail(f"{name_or_file}: {exc}")
    raise AssertionError("unreachable")


GPUS_OPTION = click.option(
    "--gpus", type=click.IntRange(1, MAX_GPUS), default=None, help="GPU count (default: the profile's)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mokka")
def main() -> None:
    """Make a CPU-only Linux node look like an NVIDIA GPU node.

    Start with `mokka demo` (root): an unmodified container runs nvidia-smi and sees mock
    GPUs. Profiles describe the GPUs; `driver-root` stages the mock libnvidia-ml.so.1 for
    local use; `host setup`, `cdi generate`, `containerd-config install` and `nri-plugin`
    make a node serve mock GPUs to its containers.
    """


@main.group()
def profile() -> None:
    """List, show and validate GPU profiles."""


@profile.command("list")
def profile_list() -> None:
    """List the built-in profiles."""
    from . import profile as profiles

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
    from . import profile as profiles
    from .state import StateError

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
    from .native import NativeMissing
    from .state import StateError

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


@main.group()
def host() -> None:
    """Stage a mock NVIDIA node (driver root, /dev, /proc, /sys) and remove it again."""


@host.command("setup")
@click.option("--profile", "profile_name", required=True, help="Built-in profile name or a profile YAML file.")
@GPUS_OPTION
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/mokka"),
    show_default=True,
    help="Directory that holds everything staged.",
)
@click.option(
    "--nvidia-smi",
    "smi",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="An nvidia-smi binary to stage as ROOT/driver/usr/bin/nvidia-smi (mounted into containers).",
)
@click.option(
    "--majors",
    type=click.Choice(["auto", "real", "safe"]),
    default="auto",
    show_default=True,
    help="Device numbers: real (195, as the NVIDIA driver), safe (120/121, Linux's local-use range), "
    "auto (safe when a real NVIDIA driver is loaded, else real).",
)
@click.option(
    "--run-nvidia",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also create RUN_NVIDIA/driver -> ROOT/driver (GPU Operator components look at /run/nvidia).",
)
@click.option("--toolkit-ready", is_flag=True, help="Also create RUN_NVIDIA/validations/toolkit-ready.")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def host_setup(
    profile_name: str,
    gpus: int | None,
    root: Path,
    smi: Path | None,
    majors: str,
    run_nvidia: Path | None,
    toolkit_ready: bool,
    dry_run: bool,
) -> None:
    """Stage the mock node under ROOT. Idempotent; `mokka host cleanup` undoes it byte for byte."""
    import time

    from hostsetup import node

    if toolkit_ready and run_nvidia is None:
        fail("--toolkit-ready needs --run-nvidia (e.g. --run-nvidia /run/nvidia)")
    p = load_profile(profile_name, gpus)
    options = node.Options(root=root, nvidia_smi=smi, majors=majors, run_nvidia=run_nvidia, toolkit_ready=toolkit_ready)
    try:
        plan = node.plan(p, options)
    except node.SetupError as exc:
        fail(str(exc))
    click.echo(plan.describe())
    if dry_run:
        click.echo("dry run: nothing changed")
        return
    start = time.perf_counter()
    try:
        node.apply(plan, progress=lambda line: click.echo(line, err=True))
    except node.SetupError as exc:
        fail(str(exc))
    click.echo(f"done in {time.perf_counter() - start:.2f} s; undo with: mokka host cleanup --root {root}")


@host.command("cleanup")
@click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), default=Path("/var/lib/mokka"), show_default=True
)
def host_cleanup(root: Path) -> None:
    """Undo everything `mokka host setup` did under ROOT (and its /run/nvidia links)."""
    from hostsetup import journal, node

    try:
        done = node.cleanup(root)
    except journal.JournalError as exc:
        fail(str(exc))
    for line in done:
        click.echo(line)
    click.echo(f"{root}: nothing to clean up" if not done else f"{root}: restored ({len(done)} changes undone)")


@main.group("containerd-config")
def containerd_config() -> None:
    """Enable NRI and CDI in containerd and register the `nvidia` runtime handler (and undo it)."""


CONFIG_OPTION = click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/etc/containerd/config.toml"),
    show_default=True,
    help="containerd's main config file.",
)


@containerd_config.command("install")
@CONFIG_OPTION
@click.option(
    "--containerd",
    "containerd_bin",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="containerd binary to ask for its version (default: containerd on PATH).",
)
@click.option("--containerd-version", type=str, default=None, help="Assume this version (e.g. 1.7, 2.1).")
@click.option(
    "--runtime",
    type=str,
    default=None,
    help="BinaryName of the nvidia handler (default: nvidia-container-runtime if present, else runc).",
)
@click.option("--dry-run", is_flag=True, help="Show the diff and change nothing.")
@click.option("--no-restart", is_flag=True, help="Do not restart containerd afterwards.")
def containerd_install(
    config: Path,
    containerd_bin: Path | None,
    containerd_version: str | None,
    runtime: str | None,
    dry_run: bool,
    no_restart: bool,
) -> None:
    """Install (idempotent; prefers a conf.d drop-in where containerd merges it safely)."""
    from hostsetup import containerd_config as cc

    try:
        plan = cc.plan(config, containerd_version=containerd_version, containerd=containerd_bin, runtime=runtime)
        click.echo(plan.summary())
        diff = plan.diff()
        if diff:
            click.echo(diff, nl=False)
        if dry_run or not plan.changes:
            click.echo("dry run: nothing changed" if dry_run else "already installed: nothing to change")
            return
        cc.apply(plan)
        click.echo(f"installed; undo with: mokka containerd-config remove --config {config}")
        if not no_restart:
            click.echo(cc.restart(config))
    except cc.ConfigError as exc:
        fail(str(exc))


@containerd_config.command("remove")
@CONFIG_OPTION
@click.option("--force", is_flag=True, help="Undo Mokka's keys even in files edited since the install.")
@click.option("--dry-run", is_flag=True, help="Show the diff and change nothing.")
@click.option("--no-restart", is_flag=True, help="Do not restart containerd afterwards.")
def containerd_remove(config: Path, force: bool, dry_run: bool, no_restart: bool) -> None:
    """Restore the configuration as it was before `install` (the original bytes where untouched since)."""
    from hostsetup import containerd_config as cc

    try:
        plan = cc.plan_remove(config, force=force)
        diff = plan.diff()
        if diff:
            click.echo(diff, nl=False)
        if dry_run or not plan.changes:
            click.echo("dry run: nothing changed" if dry_run else "nothing to remove")
            return
        cc.apply(plan)
        click.echo("removed")
        if not no_restart:
            click.echo(cc.restart(config))
    except cc.ConfigError as exc:
        fail(str(exc))


@main.group()
def cdi() -> None:
    """Generate CDI specs for CDI-aware runtimes (containerd, CRI-O, podman)."""


@cdi.command("generate")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/mokka"),
    show_default=True,
    help="Root staged by `mokka host setup` (its node.json describes the node).",
)
@click.option(
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/run/cdi"),
    show_default=True,
    help="Directory for the spec file.",
)
@click.option("--kind", default="nvidia.com/gpu", show_default=True, help="CDI kind: VENDOR/CLASS.")
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Validate against the official CDI JSON schema (fetched from Debian once, then cached).",
)
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the spec instead of writing it.")
def cdi_generate(root: Path, out_dir: Path, kind: str, validate: bool, to_stdout: bool) -> None:
    """Write the CDI spec: devices by index, by UUID and `all`, edits from the node layout."""
    import cdi as cdi_pkg
    from nri_mokka import edits

    try:
        layout = edits.NodeLayout.load(root)
    except FileNotFoundError:
        fail(f"{root}/node.json not found: run `mokka host setup --root {root}` first")
    try:
        spec = cdi_pkg.render(layout, kind=kind)
        if validate:
            cdi_pkg.validate(spec, cdi_pkg.fetch_schema())
    except cdi_pkg.CdiError as exc:
        fail(str(exc))
    if to_stdout:
        click.echo(json.dumps(spec, indent=2))
        return
    try:
        path = cdi_pkg.write(spec, out_dir)
    except cdi_pkg.CdiError as exc:
        fail(str(exc))
    names = [d["name"] for d in spec["devices"]]
    click.echo(
        f"wrote {path} (cdiVersion {spec['cdiVersion']}, kind {spec['kind']}, {len(names)} devices: "
        f"{', '.join(names[:3])}, ... all)"
    )


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


@main.command("demo")
@click.option("--profile", "profile_name", default="h100", show_default=True)
@click.option("--gpus", type=click.IntRange(1, MAX_GPUS), default=8, show_default=True)
@click.option(
    "--containerd",
    "version",
    type=click.Choice(["1.7", "2.1"]),
    default=None,
    help="Debian's containerd to use (default: the machine's containerd >= 1.7, else 2.1).",
)
@click.option("--keep", is_flag=True, help="Leave containerd, the plugin and the pod running.")
@click.option("--stop", "stop_", is_flag=True, help="Tear down a demo left by --keep (or by a killed run).")
def demo_cmd(profile_name: str, gpus: int, version: str | None, keep: bool, stop_: bool) -> None:
    """An unmodified container runs nvidia-smi and sees mock GPUs — no GPU, Kubernetes or Docker.

    Fetches what is missing (containerd, runc, nvidia-smi from Debian; crictl from the Go
    module proxy) into ~/.cache/mokka, stages a mock node, starts a private containerd with
    NRI and the Mokka plugin, creates a pod through CRI and prints the container's
    nvidia-smi. Everything is torn down afterwards (also on Ctrl-C) unless --keep. Needs root.
    """
    import logging

    from . import demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if stop_:
        left = demo.stop()
        if left:
            fail("could not remove: " + "; ".join(left))
        click.echo("demo stopped; nothing left behind")
        return
    try:
        code = demo.run(demo.Options(profile=profile_name, gpus=gpus, containerd=version, keep=keep))
    except demo.DemoError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        click.echo("\ninterrupted: everything the demo started was torn down", err=True)
        sys.exit(130)
    sys.exit(code)


@main.command("nri-plugin")
@click.option(
    "--socket",
    "socket_path",
    default="/var/run/nri/nri.sock",
    show_default=True,
    help="containerd's NRI socket (ignored when started by containerd: it passes the socket as fd 3).",
)
@click.option("--idx", default="10", show_default=True, help="Plugin index: two digits, ordering among plugins.")
@click.option("--name", default="mokka", show_default=True)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/mokka"),
    show_default=True,
    help="Root staged by `mokka host setup` (read: node.json).",
)
@click.option("--health-addr", default=None, help="Serve /healthz and /readyz on HOST:PORT (e.g. :8080).")
@click.option(
    "--mode",
    type=click.Choice(["all", "opt-in"]),
    default="all",
    show_default=True,
    help="all: every container except opted-out pods and excluded namespaces; opt-in: only pods "
    "annotated mokka.io/inject=true.",
)
@click.option("--exclude-namespace", "exclude", multiple=True, default=["kube-system"], show_default=True)
@click.option(
    "--cdi-devices",
    is_flag=True,
    help="Hand GPUs over as CDI device references (containerd >= 2.1, with a spec from `mokka cdi generate`); "
    "older runtimes get device nodes as usual.",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (wire-level).")
def nri_plugin(
    socket_path: str,
    idx: str,
    name: str,
    root: Path,
    health_addr: str | None,
    mode: str,
    exclude: tuple[str, ...],
    cdi_devices: bool,
    verbose: bool,
) -> None:
    """Run the NRI plugin: containers gain the node's mock GPUs at creation.

    Logs one line per decision (container, pod, what was injected and why). Reconnects
    with backoff whenever containerd restarts or its socket is absent. A plugin config
    string from containerd (YAML: mode, excludeNamespaces, cdiDevices) overrides the flags.
    """
    import asyncio
    import logging

    from . import decision, plugin

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = decision.Config(
        mode=mode,  # type: ignore[arg-type]  # click.Choice guarantees the literal
        exclude_namespaces=frozenset(exclude),
        cdi_devices=cdi_devices,
    )
    try:
        asyncio.run(plugin.serve(root, socket_path, name, idx, health_addr, config))
    except ValueError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


@main.group()
def bench() -> None:
    """Benchmarks: print figures side by side with their targets (tests never time anything)."""


@bench.command("nvml")
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
def bench_nvml(profile_name: str, gpus: int | None, smi: str | None, calls: int) -> None:
    """The mock library: ns per call, nvmlInit time, nvidia-smi wall time and RSS, size."""
    from . import bench as benchmarks

    p = load_profile(profile_name, gpus if gpus is not None else 8)
    benchmarks.run(p, smi, calls)


@bench.command("nri")
@click.option("--containerd", "version", type=click.Choice(["1.7", "2.1"]), default="2.1", show_default=True)
@click.option("--rounds", default=3, show_default=True, help="Interleaved rounds (with / without the plugin).")
@click.option("--creates", default=100, show_default=True, help="CreateContainer calls per round and side.")
@click.option("--restarts", default=10, show_default=True, help="containerd restarts to time re-registration.")
def bench_nri(version: str, rounds: int, creates: int, restarts: int) -> None:
    """The NRI plugin on a private containerd (root): CreateContainer cost, CPU, RSS, re-registration."""
    from . import bench as benchmarks

    benchmarks.nri(version, rounds, creates, restarts)


@bench.command("host-setup")
@click.option("--profile", "profile_name", default="h100", show_default=True)
@click.option("--rounds", default=5, show_default=True)
def bench_host_setup(profile_name: str, rounds: int) -> None:
    """`mokka host setup` wall time for 8 and 64 GPUs (fresh root each round, then cleanup)."""
    from . import bench as benchmarks

    benchmarks.host_setup(profile_name, rounds)


if __name__ == "__main__":
    main()
