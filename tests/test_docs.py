"""The documentation site (``mkdocs.yml``, ``docs/``): ``mkdocs build --strict`` passes (a broken link
or a missing page fails it); the generated reference names every ``mokka`` command, every chart
value of ``values.yaml``, every profile field and the errors raised by name; the home page starts
with the README's two commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docs"))

import reference  # noqa: E402


def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    argv = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "-q",
        "-f",
        str(REPO / "mkdocs.yml"),
        "-d",
        str(tmp_path),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    guides = [f"guides/{p.stem}/index.html" for p in (REPO / "docs" / "guides").glob("*.md")]
    pages = ("index.html", "quickstart/index.html", "concepts/index.html", *guides)
    assert len(guides) >= 15
    for page in (*pages, *(f"{p.removesuffix('.md')}/index.html" for p in reference.PAGES)):
        assert (tmp_path / page).is_file(), page
    assert "mokka karpenter-config" in (tmp_path / "reference/commands/index.html").read_text()


def test_the_reference_names_every_command_value_and_field() -> None:
    commands = reference.page("commands")
    paths = [path for path, _ in reference.commands()]
    assert len(paths) > 40 and "mokka cluster up" in paths and "mokka fault fabric" in paths
    for path in paths:
        assert f"## `{path}`" in commands, path
    values = reference.page("values")
    leaves = list(reference.value_paths(yaml.safe_load((reference.CHART / "values.yaml").read_text())))
    assert "integrations.prometheus.image.tag" in leaves
    declared = {path for path, _, _ in reference.schema_values()}
    free_form = {path for path, kind, _ in reference.schema_values() if kind == "object"} - {
        p.rsplit(".", 1)[0] for p in declared if "." in p
    }  # resources, affinity, ...: Kubernetes' own objects, given whole

    def covered(leaf: str) -> bool:
        parts = leaf.split(".")
        return f"| `{leaf}` |" in values or any(".".join(parts[:i]) in free_form for i in range(1, len(parts)))

    missing = [leaf for leaf in leaves if not covered(leaf)]
    assert missing == [], f"values.yaml keys the schema (so the reference) does not declare: {missing}"
    errors = reference.page("errors")
    assert len(list(reference.errors())) > 100
    assert "--karpenter: no --virtual pool to provision nodes for" in errors
    profile = reference.page("profile")
    fields = [path for path, _, _ in reference.profile_fields()]
    assert "gpu.fabric.degraded_bandwidth" in fields
    for path in fields:
        assert f"| `{path}` |" in profile, path


def test_the_home_page_starts_with_the_readmes_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    two = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert two.count("\n") == 2 and ".ci/setup --tests && .venv/bin/python -m pytest" in two
    assert two in (REPO / "docs" / "index.md").read_text()


def test_the_quick_start_and_the_ci_guide_name_only_commands_that_exist() -> None:
    """Every `mokka ...` the Quick start and the CI guide show is a command (the two CI commands run
    as written)."""
    import re

    text = (REPO / "docs" / "quickstart.md").read_text() + (REPO / "docs" / "guides" / "ci.md").read_text()
    paths = {path for path, _ in reference.commands()}
    said = re.findall(r"(?<!install )(?<![\w/-])mokka((?: [a-z][a-z-]*)+)", text)  # not helm's release name
    assert len(said) >= 8
    for words in said:
        parts = ["mokka", *words.split()]
        named = next((" ".join(parts[:i]) for i in range(len(parts), 1, -1) if " ".join(parts[:i]) in paths), None)
        assert named is not None and named != "mokka", f"mokka{words}"


def test_the_readme_is_one_screen_that_leads_into_the_docs() -> None:
    """The README: the two commands first, what Mokka is, the pip path, the consumers with the tests
    that run them (each test file exists), and links into the docs (each page exists)."""
    import re

    readme = (REPO / "README.md").read_text()
    assert readme.startswith("# Mokka\n\n```sh\n.ci/setup && .venv/bin/mokka demo")
    assert len(readme.splitlines()) <= 70
    for test in set(re.findall(r"`(test_[a-z0-9_]+\.py)`", readme)):
        assert (REPO / "tests" / test).is_file(), test
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link
