"""CRI from Python: bindings generated from Debian's api.proto, the client's errors, log files.

The client against a real containerd is exercised by every end-to-end test (test_e2e_cdi,
test_e2e_nri, test_demo); here what needs no containerd.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from containers.cri import logfile
from containers.cri.client import CriClient, CriError
from fetch import cri_bindings as bindings
from fetch import versions


def test_bindings_come_from_the_pinned_cri_api() -> None:
    api = bindings.load()
    assert bindings.ready()
    source = (bindings.OUT / "SOURCE").read_text()
    assert source.startswith(f"{versions.CRI_API.package}_{versions.CRI_API.upstream}")
    for stub, methods in {
        api.RuntimeServiceStub: (
            "version",
            "status",
            "run_pod_sandbox",
            "stop_pod_sandbox",
            "remove_pod_sandbox",
            "list_pod_sandbox",
            "create_container",
            "start_container",
            "stop_container",
            "remove_container",
            "container_status",
        ),
        api.ImageServiceStub: ("list_images",),
    }.items():
        for method in methods:
            assert callable(getattr(stub, method)), method
    assert "cdi_devices" in api.ContainerConfig.__dataclass_fields__  # CRI's CDI_devices (1.28+)
    assert api.NamespaceMode.NODE == 2


def test_generated_code_is_not_committed() -> None:
    repo = Path(bindings.__file__).resolve().parents[1]
    assert "/containers/cri/_pb/" in (repo / ".gitignore").read_text().splitlines()


def test_gogoproto_options_are_dropped() -> None:
    proto = (
        'syntax = "proto3";\n\npackage runtime.v1;\noption go_package = "k8s.io/cri-api/pkg/apis/runtime/v1";\n\n'
        'import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n\n'
        "option (gogoproto.goproto_stringer_all) = false;\noption (gogoproto.stringer_all) =  true;\n"
        "message VersionRequest { string version = 1; }\n"
    )
    stripped = bindings.strip_gogo(proto)
    assert "gogo" not in stripped
    assert 'option go_package = "k8s.io/cri-api/pkg/apis/runtime/v1";' in stripped
    assert "message VersionRequest { string version = 1; }" in stripped


def test_unreachable_runtime_is_a_clear_error(tmp_path: Path) -> None:
    with CriClient(tmp_path / "absent.sock", timeout=5) as client:
        with pytest.raises(CriError, match=r"Version: .*absent\.sock") as exc:
            client.version()
        assert exc.value.unreachable
        assert client.ready(timeout=1) is False


def test_a_socket_that_is_not_grpc(tmp_path: Path) -> None:
    path = tmp_path / "not-grpc.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        with CriClient(path, timeout=0.5) as client, pytest.raises(CriError) as exc:
            client.list_images()
        assert "ListImages" in str(exc.value)


def test_log_file_lines() -> None:
    text = (
        "2025-01-01T00:00:00.000000001Z stdout F first line\n"
        "2025-01-01T00:00:00.000000002Z stderr F oops\n"
        "2025-01-01T00:00:00.000000003Z stdout P partial \n"
        "2025-01-01T00:00:00.000000004Z stdout F and the rest\n"
        "2025-01-01T00:00:00.000000005Z stdout F \n"
        "garbage\n"
    )
    assert logfile.parse(text) == "first line\noops\npartial and the rest\n\n"
    assert logfile.parse(text, ("stderr",)) == "oops\n"


def test_log_file_absent_is_empty(tmp_path: Path) -> None:
    assert logfile.read(tmp_path / "none.log") == ""
