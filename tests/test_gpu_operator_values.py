"""What Mokka ships for NVIDIA's GPU Operator, without a cluster: the values file (every key
commented with its reason, every image pinned to what Mokka builds), the images it names, a user's
own operator directory, and the command line's one-line refusals."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fetch.kube import gpu_operator as build
from fetch.kube import versions
from localcluster.addons import gpu_operator


def test_every_image_is_pinned_to_what_mokka_builds_and_pulled_never() -> None:
    vals = gpu_operator.values()
    names = gpu_operator.image_names(vals)
    assert names["operator"] == f"nvcr.io/nvidia/gpu-operator:{versions.GPU_OPERATOR_RELEASE}"
    assert (
        names["devicePlugin"]
        == names["gfd"]
        == f"nvcr.io/nvidia/k8s-device-plugin:{versions.GPU_OPERATOR_DEVICE_PLUGIN}"
    )
    assert names["node-feature-discovery"].endswith(f":{versions.NFD}")
    for key in gpu_operator.IMAGE_KEYS:
        policy = vals[key]["image"]["pullPolicy"] if key == "node-feature-discovery" else vals[key]["imagePullPolicy"]
        assert policy == "Never", key
    assert vals["driver"]["enabled"] is False and vals["toolkit"]["enabled"] is False


def test_every_setting_says_why() -> None:
    """Each top-level key of the values file is preceded by a comment, or its block (its line too) holds one."""
    lines = gpu_operator.VALUES.read_text().splitlines()
    blocks: dict[str, list[str]] = {}
    current = ""
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            current = line.split(":")[0]
            blocks[current] = [line, *([lines[i - 1]] if i and lines[i - 1].startswith("#") else [])]
        elif current:
            blocks[current].append(line)
    unexplained = [key for key, body in blocks.items() if not any("#" in ln for ln in body)]
    assert not unexplained, unexplained


def _users_dir(tmp_path: Path) -> Path:
    user = tmp_path / "op"
    user.mkdir(parents=True)
    for d in ("chart", "assets", "manifests/state-driver"):
        (user / d).mkdir(parents=True)
    (user / "chart" / "Chart.yaml").write_text("name: gpu-operator\n")
    for program in gpu_operator.OPERATOR_PROGRAMS:
        (user / program).write_bytes(b"\x7fELF")
    return user


def test_a_users_operator_replaces_the_built_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = build.Operator(tmp_path / "built", tmp_path / "nfd", tmp_path / "dp", tmp_path / "tk")
    monkeypatch.setenv(gpu_operator.OPERATOR_ENV, str(_users_dir(tmp_path)))
    mine = gpu_operator.operator(built, tmp_path / "cache")
    assert (mine.chart / "Chart.yaml").read_text() == "name: gpu-operator\n"
    assert all((mine.operator / p).is_file() for p in gpu_operator.OPERATOR_PROGRAMS)
    assert (mine.nfd, mine.device_plugin) == (built.nfd, built.device_plugin)  # only the operator changes
    another = _users_dir(tmp_path / "another")
    monkeypatch.setenv(gpu_operator.OPERATOR_ENV, str(another))
    theirs = gpu_operator.operator(built, tmp_path / "cache")
    assert [d.name for d in (tmp_path / "cache" / "gpu-operator-user").iterdir()] == [theirs.operator.name]
    monkeypatch.delenv(gpu_operator.OPERATOR_ENV)
    assert gpu_operator.operator(built, tmp_path / "cache") is built


@pytest.mark.parametrize(
    ("remove", "said"),
    [("chart/Chart.yaml", "no chart/Chart.yaml"), ("manifests/state-driver", "no manifests/state-driver"),
     ("validator", "no validator (nor validator.xz) there")],
)  # fmt: skip
def test_an_incomplete_users_operator_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remove: str, said: str
) -> None:
    user = _users_dir(tmp_path)
    target = user / remove
    target.rmdir() if target.is_dir() else target.unlink()
    monkeypatch.setenv(gpu_operator.OPERATOR_ENV, str(user))
    built = build.Operator(tmp_path / "built", tmp_path / "nfd", tmp_path / "dp", tmp_path / "tk")
    with pytest.raises(gpu_operator.GpuOperatorUnavailable, match=re.escape(f"MOKKA_GPU_OPERATOR_DIR={user}: {said}")):
        gpu_operator.operator(built, tmp_path / "cache")


def test_the_values_command_prints_the_shipped_file() -> None:
    run = [sys.executable, "-m", "mokka.cli", "gpu-operator", "values"]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout == gpu_operator.VALUES.read_text()
    path = subprocess.run([*run, "--path"], capture_output=True, text=True, check=True).stdout.strip()
    assert Path(path) == gpu_operator.VALUES


def test_images_without_the_builds_is_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MOKKA_CACHE": str(tmp_path / "empty")}
    res = subprocess.run(
        [sys.executable, "-m", "mokka.cli", "gpu-operator", "images", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPU Operator's builds are not in" in lines[0], res.stderr
    assert not (tmp_path / "out").exists()
