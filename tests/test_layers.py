"""Layers import one way: the GPU model at the bottom, the node and the plugins above it, what
is fetched and built into the cache above them, running containers without Docker above that,
the local cluster (which runs both) above it, the benchmarks above everything they measure, the
command line on top.

Every ``import`` of the project's packages is read from the source (module level and inside
functions alike, ``if TYPE_CHECKING:`` blocks excepted): a package may import only packages of a
lower layer, never one of its own layer or above, and no two modules import each other in a cycle
at module level. The long-running plugin processes are checked by what they really load.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# package -> layer; a package imports only packages of lower layers.
LAYERS = {
    "gpumodel": 0,  # profiles, compiled state and its writer, edits model, node layout
    "cdi": 1,  # renders the edits model as CDI specs
    "hostsetup": 1,  # stages the mock node, configures containerd
    "nri_mokka": 1,  # the NRI plugin
    "k8snode": 1,  # the node as Kubernetes sees it: identity labels, kubelet plugins
    "virtualfleet": 2,  # virtual GPU nodes: pools, their templates (GFD on a staged node), the fleet controller
    "fetch": 2,  # what is fetched and built into the cache: Debian packages, Go builds, bindings, versions
    "containers": 3,  # containers without Docker: private containerd, CRI client, OCI images, mounts
    "localcluster": 4,  # a real Kubernetes with mock GPU nodes (a user feature: `mokka cluster`)
    "bench": 5,  # `mokka bench` and the fidelity scorer
    "mokka": 6,  # the command line (and the demo)
    # developer tooling above every package of the wheel, not in it: kind on podman here, its node image,
    # the Dockerfile built, the local cluster timed beside kind's
    "kind": 7,
}


def modules(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((REPO / package).rglob("*.py")):
        if "_pb" in path.parts:  # generated protobuf bindings import only themselves and betterproto
            continue
        rel = path.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: str, path: Path, *, module_level_only: bool) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in ``path`` of the project's own packages."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, top: bool) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                yield from (x for orelse in child.orelse for x in visit(orelse, top))
                continue
            inside_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import) and (top or not module_level_only):
                for alias in child.names:
                    yield alias.name, child.lineno
            elif isinstance(child, ast.ImportFrom) and (top or not module_level_only):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if is_package else 0)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                yield target, child.lineno
                for alias in child.names:  # `from pkg import module`
                    yield f"{target}.{alias.name}", child.lineno
            yield from visit(child, top and not inside_function)

    for target, line in visit(tree, True):
        if target.split(".")[0] in LAYERS:
            yield target, line


def all_modules() -> dict[str, Path]:
    return {name: path for package in LAYERS for name, path in modules(package)}


def test_every_package_is_placed() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
    assert packages == set(LAYERS), (
        "a new top-level package needs a layer in LAYERS (and in docs/guides/architecture.md)"
    )


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_point_down(package: str) -> None:
    wrong = []
    for module, path in modules(package):
        for target, line in imports(module, path, module_level_only=False):
            other = target.split(".")[0]
            if other != package and LAYERS[other] >= LAYERS[package]:
                wrong.append(
                    f"{path.relative_to(REPO)}:{line}: {package} (layer {LAYERS[package]}) imports "
                    f"{target} (layer {LAYERS[other]})"
                )
    assert not wrong, "\n".join(wrong)


def import_graph(known: dict[str, Path], *, module_level_only: bool) -> dict[str, set[str]]:
    """Each of ``known``'s modules -> the modules of ``known`` it imports."""
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = set()
        for target, _line in imports(name, path, module_level_only=module_level_only):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def test_no_module_level_import_cycles() -> None:
    graph = import_graph(all_modules(), module_level_only=True)
    # A package's __init__ importing its own submodules is how packages expose them: not a cycle
    # unless a submodule imports the package back at module level.
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def walk(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in seen:
                walk(nxt)
        stack.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            walk(node)
    assert not cycles, "\n".join(cycles)


def loaded_by(code: str) -> set[str]:
    res = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return set(res.stdout.split())


def test_the_nri_plugin_process_loads_no_tooling() -> None:
    mods = loaded_by("from nri_mokka import plugin")
    tops = {m.split(".")[0] for m in mods}
    assert not tops & {"fetch", "containers", "localcluster", "bench", "mokka", "hostsetup", "cdi", "k8snode"}
    assert not tops & {"pydantic", "cffi", "kubernetes"}, "the plugin process stays small"


# Packages whose files import each other one way only, at any level: imports inside functions count
# too (a late import is still a dependency), ``if TYPE_CHECKING:`` blocks do not. The local
# cluster's add-ons get what they use of the cluster passed in (localcluster.context), never by
# importing localcluster.cluster back.
ACYCLIC = ("fetch", "containers", "localcluster", "bench", "mokka")


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle_between_files_of_a_package(package: str) -> None:
    graph = import_graph(dict(modules(package)), module_level_only=False)

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [[start]], {start}
        while stack:
            path = stack.pop()
            for nxt in sorted(graph[path[-1]]):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append([*path, nxt])
        return None

    cycles = {" -> ".join(c) for name in graph for other in graph[name] if (c := reaches(other, name))}
    assert not cycles, "\n".join(sorted(cycles))


LONG = 500  # lines: a file longer than this says at its top why it is one file


def test_a_long_file_says_why_it_is_one() -> None:
    unexplained = []
    for name, path in all_modules().items():
        lines = path.read_text().count("\n")
        if lines > LONG and "One file, though long:" not in (ast.get_docstring(ast.parse(path.read_text())) or ""):
            unexplained.append(f"{path.relative_to(REPO)}: {lines} lines ({name}), and its docstring does not say why")
    assert not unexplained, "\n".join(unexplained)
