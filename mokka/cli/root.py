"""The root ``mokka`` group and what its commands share (errors, profile loading, options)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from mokka import __version__

if TYPE_CHECKING:
    from gpumodel.profile import Profile

# Heavy modules (pydantic, cffi) are imported inside the commands that need them, so the
# long-running `mokka nri-plugin` stays small. MAX_GPUS mirrors profile.MAX_GPUS (a test checks).
MAX_GPUS = 64


def error(message: str) -> None:
    """Print ``message`` on stderr, each line as ``mokka: error: LINE``."""
    for line in message.splitlines() or [""]:
        click.echo(f"mokka: error: {line}", err=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` as :func:`error` does and exit with ``code``."""
    error(message)
    sys.exit(code)


def load_profile(name_or_file: str, gpus: int | None) -> Profile:
    from gpumodel import profile

    try:
        return profile.load(name_or_file).with_count(gpus)
    except profile.ProfileError as exc:
        fail(str(exc))
    except ValueError as exc:  # pydantic ValidationError from with_count
        from pydantic import ValidationError

        fail(profile.format_errors(exc, name_or_file) if isinstance(exc, ValidationError) else f"{name_or_file}: {exc}")


def host_port(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Option callback: ``HOST:PORT`` or ``:PORT`` (every address), PORT 1..65535, HOST a name or IPv4 address."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535 or ":" in host or " " in host:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. :8080 or 127.0.0.1:8080; PORT 1..65535)")
    return value


GPUS_OPTION = click.option(
    "--gpus", type=click.IntRange(1, MAX_GPUS), default=None, help="GPU count (default: the profile's)."
)

# Where a command that talks to a cluster's API finds it (k8snode.dra.cluster.load_client's order).
KUBECONFIG_OPTION = click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="API server credentials (default: in-cluster, else $KUBECONFIG or ~/.kube/config).",
)


class Cli(click.Group):
    """The root group: usage errors (a bad option value, a missing argument) print one line
    ``mokka: error: ...`` too, as every other bad input does."""

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.UsageError as exc:
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # click >= 8.2: `mokka`
                exc.show()
                sys.exit(exc.exit_code)
            where = exc.ctx.command_path if exc.ctx else "mokka"
            fail(f"{exc.format_message()} (see `{where} --help`)", exc.exit_code)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("aborted")
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mokka")
def main() -> None:
    """Make a CPU-only Linux node look like an NVIDIA GPU node.

    Start with `mokka demo` (root): an unmodified container runs nvidia-smi and sees mock
    GPUs. Profiles describe the GPUs; `driver-root` stages the mock libnvidia-ml.so.1 for
    local use; `host setup`, `cdi generate`, `containerd-config install` and `nri-plugin`
    make a node serve mock GPUs to its containers.
    """
