"""`mokka host ...`, `mokka containerd-config ...` and `mokka cdi generate`: a node that serves mock GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .root import GPUS_OPTION, fail, load_profile, main


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
    help="The nvidia-smi binary to stage as ROOT/driver/usr/bin/nvidia-smi (mounted into containers). "
    "Default: Debian's nvidia-smi 550, fetched into Mokka's cache once.",
)
@click.option("--no-nvidia-smi", is_flag=True, help="Stage no nvidia-smi.")
@click.option(
    "--majors",
    type=click.Choice(["auto", "real", "safe"]),
    default="auto",
    show_default=True,
    help="Device numbers: real (195, and for nvidia-uvm the major the kernel would hand a new driver now), "
    "safe (120/121, Linux's local-use range), auto (safe when a real NVIDIA driver is loaded, else real).",
)
@click.option(
    "--machine",
    type=click.Choice(["x86_64", "aarch64"]),
    default=None,
    help="The node's architecture: where containers get the library (/usr/lib/<arch>-linux-gnu). "
    "Default: this machine's.",
)
@click.option(
    "--run-nvidia",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also create RUN_NVIDIA/driver -> ROOT/driver (GPU Operator components look at /run/nvidia).",
)
@click.option("--toolkit-ready", is_flag=True, help="Also create RUN_NVIDIA/validations/toolkit-ready.")
@click.option(
    "--rack",
    default=None,
    metavar="NAME",
    help="Put the node's GPUs in NVLink domain NAME: fabric Completed/Success with the rack's cluster UUID "
    "(every node set up with the same NAME reports the same one: one nvidia.com/gpu.clique).",
)
@click.option(
    "--fabric-delay",
    type=click.FloatRange(min=0),
    default=0,
    metavar="SECONDS",
    help="The fabric manager is ready SECONDS after setup: until then the fabric probe reads In Progress.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
@click.option("-v", "--verbose", is_flag=True, help="Print the plan first, and what a re-run undid.")
def host_setup(
    profile_name: str,
    gpus: int | None,
    root: Path,
    smi: Path | None,
    no_nvidia_smi: bool,
    majors: str,
    machine: str | None,
    run_nvidia: Path | None,
    toolkit_ready: bool,
    rack: str | None,
    fabric_delay: float,
    dry_run: bool,
    verbose: bool,
) -> None:
    """Stage the mock node under ROOT. Idempotent; `mokka host cleanup` undoes it byte for byte.

    Every change is journaled (ROOT/.mokka/journal.jsonl) before it is made: a setup killed at
    any point is finished by running it again, or undone by `mokka host cleanup`.
    """
    import time

    from hostsetup import node

    if toolkit_ready and run_nvidia is None:
        fail("--toolkit-ready needs --run-nvidia (e.g. --run-nvidia /run/nvidia)")
    if smi is not None and no_nvidia_smi:
        fail("--nvidia-smi and --no-nvidia-smi exclude each other")
    p = load_profile(profile_name, gpus)
    if rack is not None or fabric_delay:
        from gpumodel import fleet
        from gpumodel.profile import ProfileError

        try:
            p = fleet.with_fabric_delay(fleet.in_rack(p, rack) if rack is not None else p, fabric_delay)
        except ProfileError as exc:
            fail(f"{exc}, --rack/--fabric-delay")
    if smi is None and not no_nvidia_smi:
        smi = _debian_nvidia_smi(fetch=not dry_run)
    options = node.Options(
        root=root, nvidia_smi=smi, majors=majors, run_nvidia=run_nvidia, toolkit_ready=toolkit_ready, machine=machine
    )
    try:
        plan = node.plan(p, options)
    except node.SetupError as exc:
        fail(str(exc))
    if dry_run or verbose:
        click.echo(plan.describe())
    if dry_run:
        click.echo("dry run: nothing changed")
        return
    start = time.perf_counter()
    try:
        undone = node.apply(plan, progress=lambda line: click.echo(line, err=True))
    except node.SetupError as exc:
        fail(str(exc))
    if verbose:
        for line in undone:
            click.echo(line)
    click.echo(
        f"staged {p.gpu_count}x {p.gpu.name} under {plan.layout.root} in {time.perf_counter() - start:.2f} s; "
        f"undo with: mokka host cleanup --root {root}"
    )


def _debian_nvidia_smi(fetch: bool) -> Path | None:
    """Debian's nvidia-smi 550 from Mokka's cache (fetched once; a dry run fetches nothing)."""
    from fetch import nvidia_smi

    if not fetch:
        found = nvidia_smi.cached("550")
        if found is None:
            click.echo("Debian's nvidia-smi 550 is not in the cache yet: a real run fetches it")
        return found
    try:
        return nvidia_smi.fetch("550")
    except Exception as exc:  # network, archive or verification trouble: one line, and the way out
        fail(
            f"cannot get Debian's nvidia-smi 550 ({type(exc).__name__}: {exc}), needed by default; "
            "give one with --nvidia-smi PATH or stage none with --no-nvidia-smi"
        )
    raise AssertionError("unreachable")


@host.command("cleanup")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/mokka"),
    show_default=True,
    help="Root given to `mokka host setup`.",
)
@click.option("-v", "--verbose", is_flag=True, help="Print every change undone.")
def host_cleanup(root: Path, verbose: bool) -> None:
    """Undo everything `mokka host setup` did under ROOT (and its /run/nvidia links), also after a
    setup that was killed midway."""
    from hostsetup import journal, node

    try:
        done = node.cleanup(root)
    except journal.JournalError as exc:
        fail(str(exc))
    if verbose:
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
@click.option(
    "--containerd-version",
    type=str,
    default=None,
    help="Assume this containerd version: 1.7 or 2.x (e.g. 2.1); never run as a program.",
)
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
    """Install (idempotent; prefers a conf.d drop-in where containerd merges it safely). Every file is
    journaled (CONFIG.mokka-journal) before it is written: an install killed midway is finished by
    running it again, or undone by `remove`."""
    from hostsetup import containerd as cc

    try:
        if not dry_run:
            for line in cc.recover(config):
                click.echo(line)
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
    """Restore the configuration as it was before `install` (the original bytes where untouched since),
    also after an install that was killed midway."""
    from hostsetup import containerd as cc

    try:
        recovered = [] if dry_run else cc.recover(config)
        for line in recovered:
            click.echo(line)
        plan = cc.plan_remove(config, force=force)
        diff = plan.diff()
        if diff:
            click.echo(diff, nl=False)
        if dry_run or not plan.changed:
            if dry_run:
                click.echo("dry run: nothing changed")
            else:
                click.echo("removed what an interrupted install had left" if recovered else "nothing to remove")
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
    "--hca-kind",
    default="mokka.io/hca",
    show_default=True,
    help="CDI kind of the InfiniBand adapters' spec, written beside the GPUs' when the node has adapters.",
)
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Validate against the official CDI JSON schema (fetched from Debian once, then cached).",
)
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the GPUs' spec instead of writing the specs.")
def cdi_generate(root: Path, out_dir: Path, kind: str, hca_kind: str, validate: bool, to_stdout: bool) -> None:
    """Write the CDI spec: devices by index, by UUID and `all`, edits from the node layout (MIG
    devices as `<gpu>:<mig>` and by MIG UUID, as the MIG layout stands now). On a node with
    InfiniBand adapters, also their spec (`mokka.io/hca=mlx5_0`, ... and `all`: each adapter's
    /dev/infiniband nodes, and the node's sysfs view)."""
    import cdi as cdi_pkg
    from fetch import cdi_schema
    from gpumodel import nodelayout

    from .dra import hca_cdi_spec

    try:
        layout = nodelayout.NodeLayout.load(root)
    except FileNotFoundError:
        fail(f"{root}/node.json not found: run `mokka host setup --root {root}` first")
    except nodelayout.LayoutError as exc:
        fail(f"{exc}; run `mokka host setup --root {root}` again")
    mig = []
    if layout.caps_major is not None:  # MIG-capable GPUs: follow the layout the state holds now
        from gpumodel import mig_state, state

        try:
            mig = mig_state.read(Path(layout.state))
        except (OSError, state.StateError) as exc:
            fail(f"cannot read the MIG layout from {layout.state}: {getattr(exc, 'strerror', None) or exc}")
    try:
        specs = [cdi_pkg.render(layout, kind=kind, mig=mig)]
        hca_spec = hca_cdi_spec(layout, hca_kind)
        if hca_spec is not None:
            specs.append(hca_spec)
        if validate:
            for spec in specs:
                cdi_pkg.validate(spec, cdi_schema.fetch_schema())
    except cdi_pkg.CdiError as exc:
        fail(str(exc))
    if to_stdout:
        click.echo(json.dumps(specs[0], indent=2))
        return
    try:
        paths = [cdi_pkg.write(spec, out_dir) for spec in specs]
    except cdi_pkg.CdiError as exc:
        fail(str(exc))
    for spec, path in zip(specs, paths, strict=True):
        names = [d["name"] for d in spec["devices"]]
        click.echo(
            f"wrote {path} (cdiVersion {spec['cdiVersion']}, kind {spec['kind']}, {len(names)} devices: "
            f"{', '.join(names[:3])}, ... all)"
        )
