"""The one way Mokka compiles ``.proto`` files: grpcio-tools' protoc with betterproto's
plugin, writing grpclib stubs and dataclasses. Both are dependencies of the ``mokka`` package
(the CRI and kubelet bindings are generated on first use), so a missing one is a broken
install, and the error says so instead of failing deep inside protoc."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ProtocError", "compile_protos"]

REINSTALL = "it is a dependency of mokka: reinstall the package (pip install mokka, or .ci/setup in a checkout)"


class ProtocError(RuntimeError):
    """protoc or its plugin is missing, or protoc failed; the message says which."""


def _plugin() -> str:
    beside = Path(sys.executable).parent / "protoc-gen-python_betterproto"
    found = str(beside) if beside.is_file() else shutil.which("protoc-gen-python_betterproto")
    if not found:
        raise ProtocError(f"betterproto's protoc plugin (protoc-gen-python_betterproto) is not installed: {REINSTALL}")
    return found


def compile_protos(include: Path, protos: Sequence[str], out: Path) -> None:
    """Compile ``protos`` (paths relative to ``include``) into the Python packages under ``out``."""
    if importlib.util.find_spec("grpc_tools") is None:
        raise ProtocError(f"grpcio-tools (protoc) is not installed: {REINSTALL}")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-python_betterproto={_plugin()}",
        f"-I{include}",
        f"--python_betterproto_out={out}",
        *protos,
    ]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ProtocError(f"protoc: {exc}") from None
    if res.returncode != 0:
        raise ProtocError(f"protoc failed ({res.returncode}) on {', '.join(protos)}: {res.stderr.strip()[-2000:]}")
