"""`mokka profile ...` and `mokka driver-root`."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click
import yaml

from .root import GPUS_OPTION, error, fail, load_profile, main


@main.group()
def profile() -> None:
    """List, show, validate and import GPU profiles."""


@profile.command("list")
def profile_list() -> None:
    """List the built-in profiles."""
    from gpumodel import profile as profiles

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
@click.option(
    "--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True, help="Output format."
)
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
    from gpumodel import profile as profiles
    from gpumodel.state import StateError, compile_profile

    bad = 0
    for file in files:
        try:
            p = profiles.load(Path(file))
            compile_profile(p)
        except profiles.ProfileError as exc:
            error(str(exc))
            bad += 1
            continue
        except StateError as exc:
            error(f"{file}: {exc}")
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
    """Stage a mock driver root: libnvidia-ml.so.<version> carrying the state, libcuda, links.

    Afterwards any NVML consumer run with LD_LIBRARY_PATH=OUT/usr/lib64 sees the
    profile's GPUs, e.g. `LD_LIBRARY_PATH=OUT/usr/lib64 nvidia-smi`.
    """
    from gpumodel import driver_root
    from gpumodel.native import NativeMissing
    from gpumodel.state import StateError

    p = load_profile(profile_name, gpus)
    try:
        root = driver_root.stage(p, out)
    except (StateError, NativeMissing) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{out}: {exc.strerror or exc}")
    click.echo(f"staged {p.gpu_count}x {p.gpu.name} (profile {p.name}, driver {p.driver.version})")
    click.echo(f"  library: {root.library} (carries the state)")
    click.echo(f"  libcuda: {root.cuda}")
    click.echo(f"try: LD_LIBRARY_PATH={root.libdir} nvidia-smi")


@profile.command("import")
@click.argument("capture", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="Profile name (default: from the product name).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default: stdout).")
@click.option("--query-csv", type=click.Path(dir_okay=False, path_type=Path), help="nvidia-smi --query-gpu CSV.")
@click.option("--nvml", type=click.Path(dir_okay=False, path_type=Path), help="NVML dump (tools/capture).")
@click.option("--text", "smi_text", type=click.Path(dir_okay=False, path_type=Path), help="nvidia-smi -q text.")
@click.option("--keep-ids", is_flag=True, help="Keep the capture's serials and UUIDs (default: regenerate).")
@click.option("--driver", help="Report this driver version instead of the capture's.")
@click.option("--cuda", help="Report this CUDA version instead of the capture's.")
def profile_import(
    capture: Path,
    name: str | None,
    output: Path | None,
    query_csv: Path | None,
    nvml: Path | None,
    smi_text: Path | None,
    keep_ids: bool,
    driver: str | None,
    cuda: str | None,
) -> None:
    """Make a profile from a real node's `nvidia-smi -q -x` CAPTURE (plain or gzip).

    Every value the capture (and the optional files of the same node) carries goes into the
    profile; what none of them carries comes from the closest built-in board, and the
    output lists those fields as inferred.
    """
    from gpumodel import atomic, importer
    from gpumodel import profile as profiles

    if name is not None and not re.match(r"^[a-z0-9][a-z0-9._-]*$", name):
        fail(f"--name {name}: use lower-case letters, digits, '.', '_' and '-'")
    for flag, value, pattern in (("--driver", driver, r"^\d+\.\d+(\.\d+)?$"), ("--cuda", cuda, r"^\d+\.\d+$")):
        if value is not None and not re.match(pattern, value):
            fail(f"{flag} {value}: not a version number like {'550.163.01' if flag == '--driver' else '12.4'}")
    try:
        result = importer.import_capture(
            capture, name=name, query=query_csv, nvml=nvml, smi_q=smi_text, keep_ids=keep_ids, driver=driver, cuda=cuda
        )
        profiles.load_text(result.yaml_text(), str(output or "imported profile"))
    except (importer.ImportFailure, profiles.ProfileError) as exc:
        fail(str(exc).splitlines()[0])
    text = result.yaml_text()
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        atomic.write(output, text.encode())
    except OSError as exc:
        fail(f"{output}: {exc.strerror or exc}")
    gpus = result.data["gpu_count"]
    click.echo(f"wrote {output}: {gpus}x {result.data['gpu']['name']} (closest built-in: {result.base})", err=True)
    if result.inferred:
        click.echo(f"  inferred from {result.base} or derived: {', '.join(result.inferred)}", err=True)
    if result.unknown:
        click.echo(f"  unknown, left N/A: {', '.join(result.unknown)}", err=True)
    for note in result.notes:
        click.echo(f"  note: {note}", err=True)
