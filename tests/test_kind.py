"""kind/: the cluster configs and the bootstrap script, kept correct without a container engine.

Nothing here starts a cluster (Mokka's CI machines have no docker). Instead: the configs are
parsed and checked for the NRI and CDI patches (as TOML, against the plugin socket the chart
uses and the CDI directory `mokka cdi generate` writes), the node images are pinned by digest
to a containerd 1.7 and a containerd 2.x image, the topology matches the fake-gpu-operator
pairing guide, and the bootstrap script passes `bash -n` and shellcheck and only uses chart
values, labels and files that exist.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fetch import versions

REPO = Path(__file__).resolve().parent.parent
KIND = REPO / "kind"
CHART = REPO / "charts" / "mokka"
BOOTSTRAP = KIND / "bootstrap.sh"
POOL = "run.ai/simulated-gpu-node-pool"

# The kind node images and the containerd each ships (from the kind release notes).
IMAGES = {
    "kindest/node:v1.31.4@sha256:2cb39f7295fe7eafee0842b1052a599a4fb0f8bcf3f83d96c7f4864c357c6c30": ("1.7", "v0.26.0"),
    "kindest/node:v1.33.1@sha256:050072256b9a903bd914c0b2866828150cb229cea0efe5892e2b644d5dd3b34f": ("2", "v0.29.0"),
}
CONFIGS = {"1.7": KIND / "cluster-containerd-1.7.yaml", "2": KIND / "cluster-containerd-2.yaml"}


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """How kind applies containerdConfigPatches: a TOML merge, tables key by key."""
    out = dict(base)
    for key, value in patch.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def patched(config: dict[str, Any]) -> dict[str, Any]:
    # kind's node config: containerd config version 2, with the CRI plugin configured.
    result: dict[str, Any] = {"version": 2, "plugins": {"io.containerd.grpc.v1.cri": {"sandbox_image": "pause"}}}
    for text in config["containerdConfigPatches"]:
        result = deep_merge(result, tomllib.loads(text))
    return result


def chart_values() -> dict[str, Any]:
    return load(CHART / "values.yaml")


@pytest.mark.parametrize("containerd", sorted(CONFIGS))
def test_cluster_config(containerd: str) -> None:
    config = load(CONFIGS[containerd])
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    nodes = config["nodes"]
    assert [n["role"] for n in nodes].count("control-plane") == 1
    for node in nodes:
        assert set(node) <= {"role", "image", "labels", "extraMounts", "kubeadmConfigPatches"}
        assert node["image"] in IMAGES, f"{node['image']}: not a pinned node image of this table"
        assert IMAGES[node["image"]][0] == containerd, f"{node['image']} does not ship containerd {containerd}"
    # The topology of the fake-gpu-operator pairing guide: one integration worker, two scale workers.
    pools = [n.get("labels", {}).get(POOL) for n in nodes if n["role"] == "worker"]
    assert sorted(pools) == ["integration", "scale", "scale"]
    assert all(not n.get("labels") for n in nodes if n["role"] == "control-plane")


@pytest.mark.parametrize("containerd", sorted(CONFIGS))
def test_nri_and_cdi_patches(containerd: str) -> None:
    merged = patched(load(CONFIGS[containerd]))
    assert merged["version"] == 2, "kind's node config is version 2: patches must use version-2 plugin names"
    nri = merged["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False, "NRI must be enabled (containerd 1.7 ships it disabled)"
    assert nri.get("disable_connections", False) is False, "externally started plugins must be able to connect"
    assert nri["socket_path"] == chart_values()["plugin"]["socket"], "the chart's plugin connects to this socket"
    cri = merged["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True
    # `mokka cdi generate` writes to /var/run/cdi by default.
    from mokka.cli import node as cli_node

    default_output = next(p.default for p in cli_node.cdi_generate.params if p.name == "out_dir")
    assert str(default_output) in cri["cdi_spec_dirs"]
    assert cri["sandbox_image"] == "pause", "a patch must merge into kind's CRI table, not replace it"


def test_both_containerd_generations_are_covered() -> None:
    majors = {IMAGES[n["image"]][0] for path in CONFIGS.values() for n in load(path)["nodes"]}
    assert majors == {"1.7", "2"}


def test_bootstrap_syntax() -> None:
    res = subprocess.run(["bash", "-n", str(BOOTSTRAP)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert BOOTSTRAP.stat().st_mode & 0o111, "bootstrap.sh must be executable"


def test_bootstrap_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    res = subprocess.run(["shellcheck", "--severity=style", str(BOOTSTRAP)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_bootstrap_matches_repo() -> None:
    text = BOOTSTRAP.read_text()
    # It creates the cluster from these configs, with the kind release each image was built for.
    for containerd, path in CONFIGS.items():
        assert f'"$HERE/{path.name}"' in text
        kind_version = IMAGES[load(path)["nodes"][0]["image"]][1]
        assert re.search(rf"{re.escape(containerd)}\) CONFIG=.*KIND_VERSION={re.escape(kind_version)}", text)
    # Builds and loads the image, installs the chart, and checks nvidia-smi -L in a plain pod.
    for step in ("docker build", "load docker-image", "upgrade --install mokka", "nvidia-smi -L", "GPU [0-9]*:"):
        assert step in text, step
    assert '"$REPO/charts/mokka"' in text and (REPO / "Dockerfile").exists()
    # The pinned helm is the one the chart tests use.
    assert f"HELM_VERSION={versions.HELM.version}" in text


def test_bootstrap_values_exist() -> None:
    """Every --set KEY the script passes is a value of the chart (the schema forbids others)."""
    values = chart_values()
    keys = re.findall(r'--set(?:-string)? "?([A-Za-z][A-Za-z0-9_.\\/-]*?)=', BOOTSTRAP.read_text())
    assert keys, "no --set found"
    for key in keys:
        parts = re.split(r"(?<!\\)\.", key)
        if parts[0] == "nodeSelector":  # a free-form map of labels
            continue
        node: Any = values
        for part in parts:
            if not (isinstance(node, dict) and part in node):
                pytest.fail(f"bootstrap.sh sets {key}, which is not a chart value")
            node = node[part]


def test_bootstrap_selects_the_integration_pool() -> None:
    text = BOOTSTRAP.read_text()
    assert 'nodeSelector.run\\.ai/simulated-gpu-node-pool=integration"' in text
    assert '{"nodeSelector":{"run.ai/simulated-gpu-node-pool":"integration"}}' in text
    assert f"POOL_LABEL={POOL}" in text


def test_the_kind_guide_says_how_kind_runs_on_a_users_machine_and_here() -> None:
    section = (REPO / "docs" / "guides" / "kind.md").read_text()
    for said in ("kind/bootstrap.sh", "KIND_EXPERIMENTAL_PROVIDER=podman", "tests/test_kind_cluster.py"):
        assert said in section, said
