"""Node identity: GFD labels, NFD features and FGO's profile shape from a Profile, and the
Node patching through the real `kubernetes` client against a local HTTP server that speaks
the two Kubernetes API calls used (GET and merge-PATCH of /api/v1/nodes/NAME).

No real API server runs here: kube-apiserver cannot be `go install`ed (k8s.io/kubernetes
uses replace directives) and nothing else that serves the API is in reach of CI. The fake
implements what those calls rely on: JSON merge patch (RFC 7386, null deletes), optimistic
concurrency on metadata.resourceVersion (409 Conflict), and Status errors (403, 404).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from gpumodel import profile
from k8snode import nodeinfo

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client (pip install kubernetes)")

LABEL_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


# --------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA  RTX (TM) 6000", "NVIDIA-RTX-TM-6000"),
        ("  NVIDIA L40S ", "NVIDIA-L40S"),
    ],
)
def test_gfd_product(name: str, product: str) -> None:
    assert nodeinfo.gfd_product(name) == product


@pytest.mark.parametrize(
    ("cc", "family"),
    [
        ("7.0", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.6", "ampere"),
        ("8.9", "ada-lovelace"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("12.0", "blackwell"),
        ("4.0", "undefined"),
    ],
)
def test_gfd_family(cc: str, family: str) -> None:
    assert nodeinfo.gfd_family(cc) == family


@pytest.mark.parametrize("name", profile.builtin_names())
def test_labels_of_every_builtin(name: str) -> None:
    import re

    p = profile.load(name)
    labels = nodeinfo.gfd_labels(p)
    gpu = p.devices()[0].spec
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.count"] == str(p.gpu_count)
    assert labels["nvidia.com/gpu.memory"] == str(gpu.memory.total_mib)
    assert labels["nvidia.com/gpu.product"] == nodeinfo.gfd_product(gpu.name)
    assert labels["nvidia.com/gpu.family"] == nodeinfo.gfd_family(gpu.compute_capability)
    assert f"{labels['nvidia.com/gpu.compute.major']}.{labels['nvidia.com/gpu.compute.minor']}" == (
        gpu.compute_capability
    )
    assert labels["nvidia.com/cuda.driver-version.full"] == p.driver.version
    assert labels["nvidia.com/cuda.runtime-version.full"] == p.driver.cuda
    assert labels["nvidia.com/mig.capable"] == ("false" if gpu.modes.mig is None else "true")
    for key, value in labels.items():
        assert re.match(LABEL_NAME, key) and key.startswith("nvidia.com/"), key
        assert len(value) <= 63 and re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", value), (key, value)


def test_label_examples() -> None:
    assert nodeinfo.gfd_labels(profile.load("t4"))["nvidia.com/gpu.product"] == "Tesla-T4"
    assert nodeinfo.gfd_labels(profile.load("l40s"))["nvidia.com/gpu.family"] == "ada-lovelace"
    assert nodeinfo.gfd_labels(profile.load("b200"))["nvidia.com/gpu.family"] == "blackwell"
    h100 = nodeinfo.gfd_labels(profile.load("h100").with_count(2))
    assert h100["nvidia.com/gpu.count"] == "2"
    assert h100["nvidia.com/gpu.mode"] == "compute"
    assert h100["nvidia.com/cuda.driver.major"] == profile.load("h100").driver.version.split(".")[0]


def test_nfd_features() -> None:
    p = profile.load("h100")  # GPUs and ConnectX-7 InfiniBand adapters
    assert nodeinfo.nfd_features(p) == {
        "pci-0207_15b3.present": "true",
        "pci-0302_10de.present": "true",
        "pci-10de.present": "true",
        "pci-15b3.present": "true",
    }
    text = nodeinfo.nfd_feature_file(p)
    assert text.startswith("#") and text.endswith("\n")
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "pci-0207_15b3.present=true",
        "pci-0302_10de.present=true",
        "pci-10de.present=true",
        "pci-15b3.present=true",
    ]
    assert nodeinfo.nfd_features(profile.load("l40s")) == {"pci-0302_10de.present": "true", "pci-10de.present": "true"}


def fgo_extract(body: dict[str, Any]) -> dict[str, Any]:
    """What fake-gpu-operator's loader takes from a profile (its profile.Extract and
    profile.PCITopology, restated from FGO's source): the fields and the fallbacks."""
    dd = body.get("device_defaults", {})
    system = body.get("system", {})
    count = body.get("device_count") or len(body.get("devices", []))
    numa = {}
    for rc in body.get("pcie_topology", {}).get("root_complexes", []):
        for bdf in rc["devices"]:
            numa[bdf.lower()] = rc["numa_node"]
    by_index = {d["index"]: numa.get(d["pci"]["bus_id"].lower()) for d in body.get("devices", [])}
    return {
        "product": dd.get("name"),
        "architecture": dd.get("architecture"),
        "memory_mib": dd.get("memory", {}).get("total_bytes", 0) // (1024 * 1024),
        "driver": system.get("driver_version"),
        "cuda": system.get("cuda_version"),
        "count": count,
        "numa": by_index,
    }


@pytest.mark.parametrize("name", profile.builtin_names())
def test_fgo_profile_shape(name: str) -> None:
    p = profile.load(name)
    body = nodeinfo.fgo_profile(p)
    got = fgo_extract(body)
    devices = p.devices()
    assert got == {
        "product": p.gpu.name,
        "architecture": nodeinfo.gfd_family(p.gpu.compute_capability),
        "memory_mib": p.gpu.memory.total_mib,
        "driver": p.driver.version,
        "cuda": p.driver.cuda,
        "count": p.gpu_count,
        "numa": {d.index: d.numa_node for d in devices},
    }
    assert len(body["devices"]) == p.gpu_count == body["device_count"]
    assert [d["uuid"] for d in body["devices"]] == [d.uuid for d in devices]
    assert body["device_defaults"]["pci"]["device_id"] & 0xFFFF == 0x10DE
    assert body["device_defaults"]["pci"]["device_id"] >> 16 == p.gpu.pci.device_id
    assert isinstance(body["system"]["driver_version"], str) and isinstance(body["system"]["cuda_version"], str)


def test_fgo_profile_follows_count() -> None:
    body = nodeinfo.fgo_profile(profile.load("h100").with_count(3))
    assert body["device_count"] == 3 and len(body["devices"]) == 3


# --------------------------------------------------------------------------- fake API server


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeApiServer:
    """GET and merge-PATCH of Nodes, with resourceVersion conflicts and injected failures."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]], str, Any]] = []
        self.authorization: list[str | None] = []  # each request's Authorization header
        self.fail_next: list[int] = []  # statuses to answer the next PATCHes with
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
                     "message": message},
                )  # fmt: skip

            def _node(self) -> str | None:
                parts = urlparse(self.path).path.split("/")
                if len(parts) == 5 and parts[1:4] == ["api", "v1", "nodes"]:
                    return parts[4]
                return None

            def do_GET(self) -> None:
                name = self._node()
                server.requests.append(("GET", self.path, {}, "", None))
                server.authorization.append(self.headers.get("Authorization"))
                if name is None or name not in server.nodes:
                    self._status(404, "NotFound", f'nodes "{name}" not found')
                    return
                self._send(200, server.nodes[name])

            def do_PATCH(self) -> None:
                name = self._node()
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                query = parse_qs(urlparse(self.path).query)
                server.requests.append(("PATCH", self.path, query, self.headers.get("Content-Type", ""), body))
                server.authorization.append(self.headers.get("Authorization"))
                if server.fail_next:
                    code = server.fail_next.pop(0)
                    self._status(code, {403: "Forbidden", 409: "Conflict"}.get(code, "InternalError"), "injected")
                    return
                if name is None or name not in server.nodes:
                    self._status(404, "NotFound", f'nodes "{name}" not found')
                    return
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    self._status(415, "UnsupportedMediaType", "only merge patches here")
                    return
                node = server.nodes[name]
                want_rv = (body.get("metadata") or {}).get("resourceVersion")
                if want_rv is not None and want_rv != node["metadata"]["resourceVersion"]:
                    self._status(409, "Conflict", "the object has been modified")
                    return
                server.update(name, body)
                self._send(200, server.nodes[name])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.nodes[name] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, "resourceVersion": "1", "labels": dict(labels or {}), "annotations": {}},
            "spec": {"podCIDR": "10.244.1.0/24"},
        }

    def update(self, name: str, patch: dict[str, Any]) -> None:
        node = merge_patch(self.nodes[name], patch)
        node["metadata"]["resourceVersion"] = str(int(self.nodes[name]["metadata"]["resourceVersion"]) + 1)
        self.nodes[name] = node

    def labels(self, name: str) -> dict[str, str]:
        return dict(self.nodes[name]["metadata"].get("labels") or {})

    def patches(self) -> list[Any]:
        return [r for r in self.requests if r[0] == "PATCH"]


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def identity(server: FakeApiServer, nfd_dir: Path | None, node: str = "worker-1") -> nodeinfo.NodeIdentity:
    from kubernetes import client

    config = client.Configuration()
    config.host = server.url
    return nodeinfo.NodeIdentity(client.CoreV1Api(client.ApiClient(config)), node, nfd_dir, sleep=lambda s: None)


def test_apply_then_remove_restores_the_node(api_server: FakeApiServer, tmp_path: Path) -> None:
    original = {"kubernetes.io/hostname": "worker-1", "nvidia.com/gpu.product": "Real-GPU"}
    api_server.add_node("worker-1", original)
    ident = identity(api_server, tmp_path / "features.d")
    p = profile.load("h100")

    set_labels = ident.apply(p)
    labels = api_server.labels("worker-1")
    assert set_labels == nodeinfo.gfd_labels(p)
    assert {k: labels[k] for k in set_labels} == set_labels
    assert labels["kubernetes.io/hostname"] == "worker-1"
    record = json.loads(api_server.nodes["worker-1"]["metadata"]["annotations"][nodeinfo.ANNOTATION])
    assert record["previous"]["nvidia.com/gpu.product"] == "Real-GPU"
    assert record["previous"]["nvidia.com/gpu.present"] is None
    assert (tmp_path / "features.d" / "mokka").read_text() == nodeinfo.nfd_feature_file(p)
    assert api_server.nodes["worker-1"]["spec"] == {"podCIDR": "10.244.1.0/24"}

    _, _, query, ctype, body = api_server.patches()[0]
    assert ctype == "application/merge-patch+json"
    assert query.get("fieldManager") == [nodeinfo.FIELD_MANAGER]
    assert set(body) == {"metadata"} and set(body["metadata"]) == {"labels", "annotations", "resourceVersion"}

    restored = ident.remove()
    assert restored == sorted(set_labels)
    assert api_server.labels("worker-1") == original
    assert nodeinfo.ANNOTATION not in api_server.nodes["worker-1"]["metadata"].get("annotations", {})
    assert not (tmp_path / "features.d" / "mokka").exists()


def test_apply_is_idempotent(api_server: FakeApiServer, tmp_path: Path) -> None:
    api_server.add_node("worker-1")
    ident = identity(api_server, tmp_path)
    ident.apply(profile.load("t4"))
    patches = len(api_server.patches())
    ident.apply(profile.load("t4"))
    assert len(api_server.patches()) == patches, "a second apply must not patch an unchanged node"
    ident.remove()
    assert api_server.labels("worker-1") == {}
    assert ident.remove() == [], "remove without Mokka's record changes nothing"
    assert len(api_server.patches()) == patches + 1


def test_reapply_keeps_the_original_previous_values(api_server: FakeApiServer) -> None:
    api_server.add_node("worker-1", {"nvidia.com/gpu.count": "1"})
    ident = identity(api_server, None)
    ident.apply(profile.load("h100"))
    ident.apply(profile.load("h100").with_count(4))  # a new profile: labels change again
    assert api_server.labels("worker-1")["nvidia.com/gpu.count"] == "4"
    ident.remove()
    assert api_server.labels("worker-1") == {"nvidia.com/gpu.count": "1"}


def test_remove_leaves_labels_changed_by_others(api_server: FakeApiServer) -> None:
    api_server.add_node("worker-1")
    ident = identity(api_server, None)
    ident.apply(profile.load("a100"))
    api_server.update("worker-1", {"metadata": {"labels": {"nvidia.com/gpu.product": "Someone-Else"}}})
    restored = ident.remove()
    assert "nvidia.com/gpu.product" not in restored
    assert api_server.labels("worker-1") == {"nvidia.com/gpu.product": "Someone-Else"}


def test_conflict_is_retried_from_a_fresh_read(api_server: FakeApiServer) -> None:
    api_server.add_node("worker-1")
    ident = identity(api_server, None)
    api_server.fail_next.append(409)
    ident.apply(profile.load("h100"))
    assert [r[0] for r in api_server.requests] == ["GET", "PATCH", "GET", "PATCH"]
    assert api_server.labels("worker-1")["nvidia.com/gpu.present"] == "true"


def test_real_resource_version_conflict(api_server: FakeApiServer) -> None:
    api_server.add_node("worker-1")
    ident = identity(api_server, None)
    calls = {"n": 0}
    real_read = ident.read

    def read_then_race() -> dict[str, Any]:
        node = real_read()
        calls["n"] += 1
        if calls["n"] == 1:  # someone writes after our first read: our patch's resourceVersion is stale
            api_server.update("worker-1", {"metadata": {"labels": {"team": "a"}}})
        return node

    ident.read = read_then_race  # type: ignore[method-assign]
    ident.apply(profile.load("h100"))
    assert len(api_server.patches()) == 2, "the stale patch is refused (409), the retry lands"
    labels = api_server.labels("worker-1")
    assert labels["team"] == "a" and labels["nvidia.com/gpu.present"] == "true"


def test_forbidden_is_a_clear_error(api_server: FakeApiServer) -> None:
    api_server.add_node("worker-1")
    api_server.fail_next.append(403)
    with pytest.raises(nodeinfo.NodeInfoError, match=r"worker-1.*forbidden.*get/patch"):
        identity(api_server, None).apply(profile.load("h100"))


def test_unknown_node(api_server: FakeApiServer) -> None:
    with pytest.raises(nodeinfo.NodeInfoError, match=r"node ghost: get failed: HTTP 404"):
        identity(api_server, None, node="ghost").apply(profile.load("h100"))
    with pytest.raises(nodeinfo.NodeInfoError, match="NODE_NAME"):
        identity(api_server, None, node="")


def test_foreign_annotation_is_refused(api_server: FakeApiServer) -> None:
    api_server.add_node("worker-1")
    api_server.update("worker-1", {"metadata": {"annotations": {nodeinfo.ANNOTATION: "not json"}}})
    with pytest.raises(nodeinfo.NodeInfoError, match="not Mokka's record"):
        identity(api_server, None).remove()


def test_cli_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert nodeinfo.main(["show", "--profile", "t4", "--gpus", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["labels"]["nvidia.com/gpu.count"] == "2"
    assert out["nfd"] == {"pci-0302_10de.present": "true", "pci-10de.present": "true"}


def test_cli_apply_and_remove_in_cluster(
    api_server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's commands, with the client configured as in a pod (service-account files)."""
    from kubernetes.config import incluster_config

    api_server.add_node("worker-7")
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("token")
    (sa / "ca.crt").write_text("unused: the fake serves plain HTTP")
    host, port = "127.0.0.1", api_server.httpd.server_address[1]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(host))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    monkeypatch.setenv("NODE_NAME", "worker-7")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(sa / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(sa / "ca.crt"))
    from kubernetes import client, config

    real_loader: Any = config.load_incluster_config

    def load_then_plain_http() -> None:  # the real loader reads the files; the fake serves plain HTTP
        real_loader()
        loaded = client.Configuration.get_default_copy()
        assert loaded.host == f"https://{host}:{port}"
        loaded.host, loaded.ssl_ca_cert = api_server.url, None
        loaded.refresh_api_key_hook = None  # it would put the https address back before each call
        client.Configuration.set_default(loaded)

    monkeypatch.setattr(config, "load_incluster_config", load_then_plain_http)
    nfd = tmp_path / "features.d"
    assert nodeinfo.main(["apply", "--profile", "l40s", "--nfd-dir", str(nfd)]) == 0
    assert api_server.labels("worker-7")["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    # The API server matches the scheme case-insensitively; this client sends "bearer".
    assert {(a or "").lower() for a in api_server.authorization} == {"bearer token"}, "every call carries the token"
    assert (nfd / "mokka").exists()
    assert nodeinfo.main(["remove", "--nfd-dir", str(nfd)]) == 0
    assert api_server.labels("worker-7") == {}
    assert not (nfd / "mokka").exists()
    assert nodeinfo.main(["apply", "--profile", "no-such-profile"]) == 1
