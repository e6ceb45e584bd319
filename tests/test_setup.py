"""Setup and CI as a fresh machine runs them: tools found with a minimal PATH, everything the
tests need prepared once (never fetched or built by a test), a small cache, the Debian Go
fallback, and the scripts themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import VENV_TOOLS, tool

from fetch import debcache, gobuilds, gotool, prepare, versions
from fetch.kube import gobuild as kube_gobuild
from fetch.progress import Progress

REPO = Path(__file__).resolve().parent.parent
MINIMAL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # what CI runs with (.ci/run)


def minimal_env() -> dict[str, str]:
    env = {"PATH": MINIMAL_PATH, "HOME": os.environ.get("HOME", "/root"), "CI": "true"}
    env.update({k: v for k, v in os.environ.items() if k == "MOKKA_CACHE"})
    return env


def test_venv_tools_are_found_with_a_minimal_path() -> None:
    code = "import conftest; print([t for t in conftest.VENV_TOOLS if not conftest.tool(t)])"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO / "tests", env=minimal_env(), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", f"not found with PATH={MINIMAL_PATH}: {res.stdout}"
    for name in VENV_TOOLS:
        assert tool(name) == str(Path(sys.executable).parent / name)


@pytest.mark.slow
def test_tests_that_look_up_programs_pass_with_a_minimal_path() -> None:
    """The tests that run programs (venv tools, apt's, prepared Go builds) pass as CI runs them."""
    selection = [
        "tests/test_nvml_bindings.py::test_nvitop_once",
        "tests/test_nvml_bindings.py::test_gpustat_json",
        "tests/test_dockerfile.py::test_hadolint",
        "tests/test_kind.py::test_bootstrap_shellcheck",
        "tests/test_chart.py::test_lint",
        "tests/test_go_nvml.py",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "-rs", "-p", "no:cacheprovider", *selection],
        cwd=REPO,
        env=minimal_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "skipped" not in res.stdout.splitlines()[-1], res.stdout[-2000:]


def test_go_programs_come_prepared_or_name_the_command(tmp_path: Path) -> None:
    with pytest.raises(prepare.NotPrepared, match=r"helm v3\.\d+\.\d+ is not built: run `\.ci/setup --tests`"):
        prepare.go_binary(versions.HELM, cache=tmp_path)
    out = gotool.output_dir(versions.HELM, tmp_path)
    out.mkdir(parents=True)
    (out / "helm").write_text("#!/bin/sh\n")
    assert prepare.go_binary(versions.HELM, cache=tmp_path) == out / "helm"


def test_every_go_build_of_the_tests_is_prepared() -> None:
    """What the tests take from Go is in the prepare list (so `.ci/setup --tests` builds it)."""
    built = {item.what.split(" ", 1)[0] for item in prepare.ITEMS if item.tests}
    for spec in prepare.GO_BUILDS:
        assert spec.name in built
    for path in (REPO / "tests").glob("test_*.py"):
        if path.name != "test_setup.py":  # tests never build
            assert "gotool.build(" not in path.read_text() and "gotool.install(" not in path.read_text(), path


def test_local_go_build_is_keyed_by_its_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.go").write_text("package main\n\nfunc main() {}\n")
    spec = versions.GoBuild(name="hello", version="local", commands=(), source=src)
    first = gotool.output_dir(spec, tmp_path)
    assert first == gotool.output_dir(spec, tmp_path)
    (src / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert gotool.output_dir(spec, tmp_path) != first


def test_prune_keeps_current_builds_and_drops_old_ones(tmp_path: Path) -> None:
    current = gotool.output_dir(versions.HELM, tmp_path)
    old = tmp_path / "gobin" / "helm-v3.0.0-000000000000"
    crictl = tmp_path / "gobin" / "crictl-v1.34.0"
    other = tmp_path / "gobin" / "kind-v0.29.0-000000000000"  # a script's tool, not the tests'
    for d in (current, old, crictl, other, tmp_path / "gopath" / "pkg" / "mod" / "x", tmp_path / "gobuild"):
        d.mkdir(parents=True)
    (tmp_path / "gopath" / "pkg" / "mod" / "x").chmod(0o555)  # Go's module cache is read-only
    (tmp_path / "gobuild" / "x").mkdir()
    (tmp_path / "gobuild" / "x").chmod(0o555)
    removed = gotool.prune([versions.HELM], tmp_path)
    assert sorted(removed) == ["gobin/crictl-v1.34.0", "gobin/helm-v3.0.0-000000000000", "gobuild", "gopath"]
    assert current.is_dir() and other.is_dir() and not old.exists()
    assert not (tmp_path / "gobuild").exists() and not (tmp_path / "gopath").exists()


@pytest.mark.parametrize(
    ("package", "binary"),
    [("helm.sh/helm/v3/cmd/helm", "helm"), ("sigs.k8s.io/kind", "kind"), ("example.com/tool/v2", "tool")],
)
def test_command_names(package: str, binary: str) -> None:
    assert versions.command_name(package) == binary


def test_install_wants_a_pinned_version() -> None:
    with pytest.raises(gotool.BuildError, match="pin a version"):
        gotool.install("sigs.k8s.io/kind@latest")


@pytest.mark.slow
@pytest.mark.parametrize("minimum", sorted(versions.GO_DEBIAN_BY_MINIMUM), ids=lambda m: f"go{m[0]}.{m[1]}")
def test_debian_go_toolchain_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, minimum: tuple[int, int]
) -> None:
    """Without a Go on the machine, Debian's golang (trixie's 1.24; sid's 1.26 for KWOK) is unpacked
    from its cached .debs and works. Unpacked here into a scratch cache (about 280 MB) holding links
    to the real cache's .debs."""
    spec = versions.GO_DEBIAN_BY_MINIMUM[minimum]
    debs = tmp_path / "debs" / spec.suite
    debs.mkdir(parents=True)
    for part in ("go", "src"):
        deb = debcache.cached(spec.suite, f"{spec.package}-{part}")
        if deb is None:
            pytest.fail(f"{spec.package}-{part} is not in the cache: {prepare.HOW}")
        (debs / deb.name).symlink_to(deb)
    monkeypatch.setattr(gotool, "candidates", lambda: [])
    go = gotool.find(tmp_path, minimum)
    assert go == gotool.debian_toolchain(tmp_path, minimum)
    env = {"PATH": MINIMAL_PATH, "HOME": os.environ.get("HOME", "/root"), "GOTOOLCHAIN": "local"}
    res = subprocess.run([str(go), "version"], env=env, capture_output=True, text=True, check=True)
    assert f"go{spec.upstream}" in res.stdout
    std = subprocess.run([str(go), "list", "std"], env=env, capture_output=True, text=True, check=True)
    assert "net/http" in std.stdout.split()
    assert gotool.drop_debian_toolchain(tmp_path) and not go.exists()


def test_unpacked_keeps_only_what_is_asked(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    for f in ("usr/bin/keep", "usr/bin/drop", "usr/share/doc/x/copyright", "usr/lib/tree/a", "usr/lib/tree/b/c"):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f)
    (root / "usr/bin/link").symlink_to("drop")
    debcache._keep_only(root, [root / "usr/bin/keep", root / "usr/lib/tree"])
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert left == ["usr/bin/keep", "usr/lib/tree/a", "usr/lib/tree/b/c"]
    assert not (root / "usr/share").exists() and not (root / "usr/bin/link").is_symlink()


def _deb(tmp: Path, name: str, files: dict[str, str]) -> Path:
    """A real .deb (dpkg-deb --build) holding ``files``."""
    root = tmp / f"build-{name}"
    (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: x <x@example.org>\nDescription: test\n"
    )
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    out = tmp / "debs" / "bookworm" / f"{name}_1.0-1_all.deb"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(out)], check=True, capture_output=True)
    return out


def test_trim_drops_lists_and_empties_unpacked_debs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"usr/bin/tool": "tool", "usr/share/doc/hello/README": "doc"}
    deb = _deb(tmp_path, "hello", files)
    kept = _deb(tmp_path, "protos", {"usr/share/x.proto": "proto"})  # never unpacked: stays whole
    lists = tmp_path / "apt" / "bookworm" / "lists"
    lists.mkdir(parents=True)
    (lists / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages.lz4").write_bytes(b"x" * 1000)
    tool = debcache.unpacked(deb, Path("usr/bin/tool"), tmp_path, keep=[Path("usr/bin/tool")])
    size = deb.stat().st_size
    assert debcache.trim(tmp_path) == 1000 + size
    assert not lists.exists() and deb.stat().st_size == 0 and kept.stat().st_size > 0
    # What was unpacked stays usable offline: fetch knows the package, unpacked() finds the file.
    assert debcache.fetch("bookworm", ["hello"], tmp_path) == {"hello": deb}
    assert debcache.unpacked(deb, Path("usr/bin/tool"), tmp_path) == tool and tool.read_text() == "tool"
    # Unpacking more than was kept downloads the package again.
    refetched: list[Path] = []

    def refetch(emptied: Path, cache: Path) -> Path:
        refetched.append(emptied)
        return _deb(tmp_path, "hello", files)

    monkeypatch.setattr(debcache, "_refetch", refetch)
    doc = debcache.unpacked(deb, Path("usr/share/doc/hello/README"), tmp_path)
    assert refetched == [deb] and doc.read_text() == "doc" and tool.read_text() == "tool"


def test_apt_keeps_no_binary_package_cache(tmp_path: Path) -> None:
    suite = debcache._Suite(tmp_path, "bookworm")
    suite.prepare()
    conf = suite.config.read_text()
    assert 'Dir::Cache::pkgcache "";' in conf and 'Dir::Cache::srcpkgcache "";' in conf


def test_prepare_lists_every_item_without_changing_anything(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fetch.prepare", "--list", "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == len(prepare.ITEMS)
    assert all(" missing " in ln for ln in lines if "Go toolchain" not in ln)  # the machine may have a Go
    assert any(ln.startswith("demo ") and "CRI bindings" in ln for ln in lines)
    assert any(ln.startswith("tests") and "helm" in ln for ln in lines)
    assert list(tmp_path.iterdir()) == []


def test_go_builds_run_in_order_jobs_at_a_time_and_leave_no_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduling of prepare's Go builds (the builds themselves are what `.ci/setup --tests` runs)."""
    import threading
    import time

    specs = [versions.GoBuild(name=f"p{i}", version="v1.0.0", commands=(f"example.com/p{i}",)) for i in range(5)]
    newer = kube_gobuild.GoBuild(name="k", module="example.com/k", version="v1.0.0", go=(1, 26))
    found: list[tuple[int, int]] = []

    def find(cache: Path, minimum: tuple[int, int]) -> Path:
        found.append(minimum)
        return Path("/nonexistent/go")

    monkeypatch.setattr(gotool, "find", find)
    (tmp_path / ".go-caches-999999999").mkdir()  # a killed run's (no such process)
    (tmp_path / f".go-caches-{os.getppid()}").mkdir()  # a live process's
    running: set[str] = set()
    most, order, lock = 0, [], threading.Lock()

    def build(spec: gobuilds.Spec, cache: Path, progress: object = None, caches: Path | None = None) -> Path:
        nonlocal most
        assert caches == tmp_path / f".go-caches-{os.getpid()}"
        with lock:
            running.add(spec.name)
            most = max(most, len(running))
            order.append(spec.name)
        time.sleep(0.05)
        (caches / spec.name).mkdir(parents=True)  # what Go would cache
        with lock:
            running.discard(spec.name)
        if spec.name == "p4":
            raise gotool.BuildError("p4: go build failed: boom")
        return cache / spec.name

    monkeypatch.setattr(gotool, "build", build)
    monkeypatch.setattr(kube_gobuild, "build", build)
    builds = gobuilds.GoBuilds(tmp_path, jobs=2)  # prepare runs one at a time (gobuilds.JOBS)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".go-caches-{os.getppid()}"]
    try:
        builds.start([*specs[:3], newer, *specs[3:]])
        builds.wait(specs[:2])
        builds.wait([specs[0], newer])  # queued already: not built twice
        with pytest.raises(gotool.BuildError, match="p4: go build failed: boom"):
            builds.wait(specs)
    finally:
        builds.close()
    assert most == 2 and sorted(found) == [versions.GO_MINIMUM, (1, 26)]
    assert [sorted(order[i : i + 2]) for i in (0, 2, 4)] == [["p0", "p1"], ["k", "p2"], ["p3", "p4"]]  # in turn
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".go-caches-{os.getppid()}"]


def test_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(2, prefix="prepare ")
    with progress.step("first — why") as note:
        note("cached")
    with pytest.raises(RuntimeError), progress.step("second — why"):
        raise RuntimeError("boom")
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("prepare [1/2] first — why: ok (") and err[0].endswith("s); cached")
    assert err[1].startswith("prepare [2/2] second — why: failed (")


def test_ci_scripts() -> None:
    scripts = [REPO / ".ci" / "setup", REPO / ".ci" / "run"]
    for script in scripts:
        assert os.access(script, os.X_OK), script
    res = subprocess.run(["shellcheck", "--severity=style", *map(str, scripts)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    run = (REPO / ".ci" / "run").read_text()
    assert ".ci/setup --tests" in run and ".venv/bin/python -m pytest" in run and "</dev/null" in run
    bad = subprocess.run([str(scripts[0]), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("setup: error: unknown argument --bogus")


def test_readme_commands_are_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    assert ".ci/setup --tests && .venv/bin/python -m pytest -n 3 " in readme
    assert 'exec .venv/bin/python -m pytest -n 3 "$@" </dev/null' in (REPO / ".ci" / "run").read_text()
    assert ".ci/setup && .venv/bin/mokka demo" in readme
    assert "MOKKA_CACHE" in readme and "crictl" not in readme
