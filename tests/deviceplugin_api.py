"""The kubelet's device-plugin API (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1), compiled at
test time with betterproto into a temporary directory: the .proto comes from the Go module
proxy (``go mod download`` into the private cache), with the gogo.proto it imports. The same
mechanism as the DRA plugin's bindings; nothing generated is kept in the repository."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from testbed import debcache, gotool

KUBELET = ("k8s.io/kubelet", "v0.34.4")
GOGO = ("github.com/gogo/protobuf", "v1.3.2")
PROTO = "pkg/apis/deviceplugin/v1beta1/api.proto"
GOGO_IMPORT = "github.com/gogo/protobuf/gogoproto/gogo.proto"


def _download(module: str, version: str) -> Path:
    cache = debcache.default_cache()
    env = dict(os.environ, GOPATH=str(cache / "gopath"), GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    env.pop("GOROOT", None)
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(
            [str(gotool.find(cache)), "mod", "download", "-json", f"{module}@{version}"],
            cwd=tmp, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    import json

    info = json.loads(res.stdout or "{}")
    if res.returncode != 0 or not info.get("Dir"):
        raise RuntimeError(f"go mod download {module}@{version}: {info.get('Error') or res.stderr.strip()}")
    return Path(info["Dir"])


def generate(out: Path) -> ModuleType:
    """Compile the API into ``out`` and import it (the ``v1beta1`` package)."""
    kubelet, gogo = _download(*KUBELET), _download(*GOGO)
    include = out / "include"
    (include / GOGO_IMPORT).parent.mkdir(parents=True)
    shutil.copyfile(gogo / "gogoproto" / "gogo.proto", include / GOGO_IMPORT)
    (include / PROTO).parent.mkdir(parents=True)
    shutil.copyfile(kubelet / PROTO, include / PROTO)
    gen = out / "gen"
    gen.mkdir()
    plugin = Path(sys.executable).parent / "protoc-gen-python_betterproto"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"--plugin=protoc-gen-python_betterproto={plugin}",
         f"-I{include}", f"--python_betterproto_out={gen}", PROTO],
        check=True, capture_output=True,
    )  # fmt: skip
    for directory in [gen, *(p for p in gen.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    sys.path.insert(0, str(gen))
    return importlib.import_module("v1beta1")
