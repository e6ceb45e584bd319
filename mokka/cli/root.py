"""The root ``mokka`` group and what its commands share (errors, profile loading, options)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from mokka import __version__

if TYPE_CHECKING:
    from gpumodel.profile import Profile

# Heavy modules (pydantic, cffi) are imported inside the commands that need them, so the
# long-running `mokka nri-plugin` stays small. MAX_GPUS mirrors profile.MAX_GPUS (a test checks).
MAX_GPUS = 64


def fail(message: str, code: int = 1) -> None:
    click.echo(f"mokka: error: {message}", err=True)
    sys.exit(code)


def load_profile(name_or_file: str, gpus: int | None) -> Profile:
    from gpumodel import profile

    try:
        return profile.load(name_or_file).with_count(gpus)
    except profile.ProfileError as exc:
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
