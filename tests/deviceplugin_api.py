"""The kubelet's device-plugin API (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1) for the tests
that talk to NVIDIA's device plugin: compiled at test time with betterproto into a temporary
directory through fetch.kubelet_api's mechanism (the same pinned modules from the Go module
proxy, the same gogo.proto placement and compiler); nothing generated is kept."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

from fetch import kubelet_api, protoc

PROTO = "pkg/apis/deviceplugin/v1beta1/api.proto"


def generate(out: Path) -> ModuleType:
    """Compile the API into ``out`` and import it (the ``v1beta1`` package)."""
    kubelet = kubelet_api.download(*kubelet_api.KUBELET_MODULE)
    gogo = kubelet_api.download(*kubelet_api.GOGO_MODULE)
    include = out / "include"
    (include / kubelet_api.GOGO_IMPORT).parent.mkdir(parents=True)
    shutil.copyfile(gogo / kubelet_api.GOGO_PROTO, include / kubelet_api.GOGO_IMPORT)
    (include / PROTO).parent.mkdir(parents=True)
    shutil.copyfile(kubelet / PROTO, include / PROTO)
    gen = out / "gen"
    gen.mkdir()
    protoc.compile_protos(include, [PROTO], gen)
    for directory in [gen, *(p for p in gen.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    sys.path.insert(0, str(gen))
    return importlib.import_module("v1beta1")
