"""`mokka gpu-operator values|images`: what NVIDIA's GPU Operator needs on a cluster of the user's own
over Mokka's chart: the values file its chart is installed with, and its images, built without Docker."""

from __future__ import annotations

from pathlib import Path

import click

from .root import fail, main


@main.group("gpu-operator")
def gpu_operator() -> None:
    """NVIDIA's GPU Operator over Mokka's chart on your own cluster (docs/guides/gpu-operator.md)."""


@gpu_operator.command("values")
@click.option("--path", "path_only", is_flag=True, help="Print the file's path instead of its contents.")
def values_cmd(path_only: bool) -> None:
    """Print Mokka's values for the operator's chart (helm install ... -f <this>): each key that differs from
    the chart's defaults, with its reason."""
    from localcluster.addons.gpu_operator import VALUES

    click.echo(str(VALUES) if path_only else VALUES.read_text(), nl=path_only)


@gpu_operator.command("images")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for the images' OCI archives (created).",
)
def images_cmd(out: Path) -> None:
    """Build every image the values name (the operator, its validator, NVIDIA's device plugin and GFD,
    dcgm-exporter, the MIG manager, NFD) as OCI archives in --out, one line each: import them on every
    GPU node (ctr -n k8s.io images import FILE) or push them to your registry. The Go builds come from
    the cache (`mokka cluster up --gpu-operator` makes them); dcgm-exporter from $MOKKA_DCGM_DIR, the MIG
    manager from $MOKKA_MIG_PARTED_DIR."""
    from containers import images as oci
    from fetch import debcache
    from localcluster.addons.gpu_operator import GpuOperatorUnavailable, image_names, images, values

    try:
        inputs = images.Inputs.cached(debcache.default_cache())
        out.mkdir(parents=True, exist_ok=True)
        for archive in images.build_all(inputs, image_names(values()), out.absolute()):
            click.echo(f"{archive}  {', '.join(oci.names(archive))}")
    except (images.ImageError, GpuOperatorUnavailable, OSError) as exc:
        fail(f"{exc}, mokka gpu-operator images")
