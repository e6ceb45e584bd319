"""The command line as a whole: every option explained, every bad input one line
`mokka: error: ...` with a non-zero exit and nothing changed, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from mokka.cli import main
from nri_mokka import main as nri_main


def mokka(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mokka.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def commands(group: click.Group, path: tuple[str, ...] = ("mokka",)) -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_every_option_of_every_command_has_help_text() -> None:
    missing = [
        f"{name} {'/'.join(param.opts)}"
        for name, command in commands(main)
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert missing == []
    assert all(command.help for _, command in commands(main))


def one_error_line(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mokka: error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("nri-plugin", "--health-addr", "notaport"), "'notaport' is not HOST:PORT"),
        (("nri-plugin", "--health-addr", ":99999"), "':99999' is not HOST:PORT"),
        (("nri-plugin", "--health-addr", "::1:80"), "is not HOST:PORT"),
        (("nri-plugin", "--health-addr", "a b:80"), "is not HOST:PORT"),
        (("nri-plugin", "--idx", "abc"), "argument --idx: 'abc' is not two digits"),
        (("demo", "--gpus", "0"), "--gpus"),
        (("profile", "show"), "Missing argument"),
        (("no-such-command",), "No such command"),
        (("driver-root", "--profile", "h100"), "--out"),
        (("bench", "host-setup", "--rounds", "0"), "0 is not in the range x>=1"),
        (("bench", "nri", "--restarts", "0"), "0 is not in the range x>=1"),
    ],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    res = mokka(*args, cwd=tmp_path)
    line = one_error_line(res, needle)
    assert f"(see `mokka {args[0]}" in line or args[0] == "no-such-command"
    assert list(tmp_path.iterdir()) == []  # nothing made: no socket, no state


@pytest.mark.parametrize("good", [":8080", "127.0.0.1:8080", "localhost:1", "0.0.0.0:65535", "[::1]:8080"])
def test_health_addresses_the_plugin_can_serve(good: str) -> None:
    assert nri_main.parser().parse_args(["--health-addr", good]).health_addr == good


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"root": ', "not a node layout (JSONDecodeError: Expecting value"),
        (b'{"root": "/x"}', "not a node layout (KeyError: 'gpus')"),
        (b"\xff\xfe\x00", "not a node layout (not UTF-8 text)"),
    ],
)
def test_cdi_generate_with_a_corrupt_node_json(tmp_path: Path, content: bytes, needle: str) -> None:
    (tmp_path / "node.json").write_bytes(content)
    out = tmp_path / "cdi"
    res = mokka("cdi", "generate", "--root", str(tmp_path), "--output", str(out))
    one_error_line(res, f"{tmp_path}/node.json: ", needle)
    assert not out.exists() and (tmp_path / "node.json").read_bytes() == content


def test_demo_defaults_to_the_profiles_gpu_count() -> None:
    demo = main.commands["demo"]
    gpus = next(p for p in demo.params if p.name == "gpus")
    assert gpus.default is None and "profile's" in (gpus.help or "")
    res = mokka("demo", "--help")
    assert "--gpus" in res.stdout and "default: the profile's gpu_count" in " ".join(res.stdout.split())


def test_help_and_version_still_print() -> None:
    res = mokka("--version")
    assert res.returncode == 0 and res.stdout.startswith("mokka, version ")
    res = mokka("profile", "--help")
    assert res.returncode == 0 and "validate" in res.stdout and res.stderr == ""
    res = mokka("profile", "show", "t4", "--format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["name"] == "t4"
