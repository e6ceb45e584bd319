"""The documentation's reference pages, generated from the code on every build (never kept in git):
every ``mokka`` command and option from the click definitions, every profile field from the pydantic
model, every chart value from ``charts/mokka/values.schema.json`` with its default from
``values.yaml``. ``docs/hooks.py`` adds them to the site; the tests check that they cover everything.
"""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "mokka"
PAGES = {
    "reference/commands.md": "commands",
    "reference/profile.md": "profile",
    "reference/values.md": "values",
    "reference/errors.md": "errors",
}


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------------------------------- commands


def commands() -> Iterator[tuple[str, click.Command]]:
    """(``mokka ...`` path, command) of every command, groups included, in order."""
    from mokka.cli import main

    def walk(path: str, cmd: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in sorted(cmd.commands):
                yield from walk(f"{path} {name}", cmd.commands[name])

    yield from walk("mokka", main)


def _help(text: str) -> list[str]:
    """A command's help as Markdown: its paragraphs, a ``\\b`` paragraph (kept as written) fenced."""
    out = []
    for para in inspect.cleandoc(click.unstyle(text)).split("\n\n"):
        if para.startswith("\b\n"):
            out += ["```", para.removeprefix("\b\n"), "```", ""]
        else:
            out += [" ".join(para.split()), ""]
    return out[:-1]


def _default(opt: click.Option, ctx: click.Context) -> str:
    value = opt.get_default(ctx, call=False)
    if value is None or value is False or value == () or callable(value) or "UNSET" in repr(value):
        return ""
    return str(value)


def commands_page() -> str:
    out = [
        "# Commands",
        "",
        "Every `mokka` command and option, generated from the command line's own definitions "
        "(`mokka COMMAND --help` prints the same).",
        "",
    ]
    for path, cmd in commands():
        ctx = click.Context(cmd, info_name=path)
        out += [f"## `{path}`", "", f"```\n{cmd.get_usage(ctx)}\n```", ""]
        if cmd.help:
            out += [*_help(cmd.help), ""]
        options = [
            p for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden and "--help" not in p.opts
        ]
        if options:
            out += ["| option | what | default |", "|---|---|---|"]
            for opt in options:
                record = opt.get_help_record(ctx)
                names = record[0] if record else ", ".join(opt.opts)
                out.append(f"| `{_cell(names)}` | {_cell(opt.help or '')} | {_cell(_default(opt, ctx))} |")
            out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- profile


def profile_fields() -> Iterator[tuple[str, str, str]]:
    """(dotted path, type, description) of every field of a profile."""
    from gpumodel.profile import Profile

    schema = Profile.model_json_schema()
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        for key in ("anyOf", "allOf"):
            refs = [n for n in node.get(key, []) if "$ref" in n]
            if refs:
                return resolve(refs[0])
        return node

    def kind(node: dict[str, Any]) -> str:
        if "$ref" in node:
            return node["$ref"].rsplit("/", 1)[-1]
        if "anyOf" in node:
            return " or ".join(kind(n) for n in node["anyOf"])
        if node.get("type") == "array":
            return f"list of {kind(node.get('items', {}))}"
        if "enum" in node:
            return " / ".join(map(str, node["enum"]))
        return str(node.get("type", "any"))

    def walk(prefix: str, node: dict[str, Any], seen: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
        for name, field in (node.get("properties") or {}).items():
            path = f"{prefix}{name}"
            yield path, kind(field), field.get("description", "")
            inner = resolve(field.get("items", field) if field.get("type") == "array" else field)
            title = inner.get("title", "")
            if inner.get("properties") and title not in seen:
                yield from walk(path + ("[]." if field.get("type") == "array" else "."), inner, (*seen, title))

    yield from walk("", schema, (schema.get("title", ""),))


def profile_page() -> str:
    out = [
        "# Profile fields",
        "",
        "Every field of a profile (a built-in's YAML under `gpumodel/profiles/`, or one's own: "
        "`mokka profile import` writes them), generated from the pydantic model `gpumodel.profile.Profile`.",
        "",
        "| field | type | what |",
        "|---|---|---|",
    ]
    out += [f"| `{path}` | {_cell(kind)} | {_cell(text)} |" for path, kind, text in profile_fields()]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------- chart values


def value_paths(values: Any, prefix: str = "") -> Iterator[str]:
    """Every leaf key of ``values.yaml`` (an empty map or list is a leaf)."""
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from value_paths(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def schema_values() -> Iterator[tuple[str, str, str]]:
    """(dotted path, type, description) of every value the chart's schema declares."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(prefix: str, node: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
        for name, field in (node.get("properties") or {}).items():
            path = f"{prefix}{name}"
            kind = field.get("type", "enum" if "enum" in field else "any")
            yield path, kind if isinstance(kind, str) else " or ".join(kind), field.get("description", "")
            yield from walk(path + ".", field)

    yield from walk("", schema)


def values_page() -> str:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def default(path: str) -> str:
        node: Any = defaults
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return ""
            node = node[part]
        return "" if isinstance(node, dict) and node else json.dumps(node)

    out = [
        "# Chart values",
        "",
        "Every value of `charts/mokka` (`helm install ... --set PATH=VALUE`), generated from its "
        "`values.schema.json` (which helm validates against) with the defaults of its `values.yaml`.",
        "",
        "| value | type | default | what |",
        "|---|---|---|---|",
    ]
    for path, kind, text in schema_values():
        shown = default(path)
        out.append(f"| `{path}` | {_cell(kind)} | {f'`{_cell(shown)}`' if shown else ''} | {_cell(text)} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------- errors

ERROR_CALLS = {"fail", "ClusterError", "PoolError", "ProfileError", "FaultError", "BenchError", "ProviderError"}


def _template(node: ast.expr) -> str | None:
    """A message argument as a template: literal text, each interpolated value as ``…``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return None if left is None or right is None else left + right
    return None


def errors() -> Iterator[tuple[str, int, str]]:
    """(file, line, message template) of every one-line error the code raises for a user to read:
    the command line's ``fail(...)`` and the errors it turns into one line."""
    for package in ("mokka", "localcluster", "virtualfleet", "gpumodel", "bench", "hostsetup", "k8snode"):
        for path in sorted((REPO / package).rglob("*.py")):
            if "_pb" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in ERROR_CALLS and (text := _template(node.args[0])):
                    yield str(path.relative_to(REPO)), node.lineno, " ".join(text.split())


def errors_page() -> str:
    out = [
        "# Errors",
        "",
        "The one-line errors Mokka's code raises by name for a user to read (`mokka: error: ...` on the "
        "command line, a pool's `Ready` condition, a failed `cluster up`): the command line's `fail(...)` and "
        f"the project's error types ({', '.join(sorted(ERROR_CALLS - {'fail'}))}), generated from the code; `…` "
        "stands for what the message fills in (a path, a name, a value). Messages passed on from Python's "
        "own errors (a ValueError's) are not listed. Each says what is wrong and where; bad input changes nothing.",
        "",
    ]
    current = ""
    for path, line, text in errors():
        if path != current:
            out += ["", f"## `{path}`", "", "| line | message |", "|---|---|"]
            current = path
        out.append(f"| {line} | {_cell(text)} |")
    return "\n".join(out) + "\n"


def page(name: str) -> str:
    pages = {"commands": commands_page, "profile": profile_page, "values": values_page, "errors": errors_page}
    return pages[name]()
