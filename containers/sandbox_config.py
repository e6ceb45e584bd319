"""The configuration of a private containerd: every path under one BASE directory, CRI with CDI
on, NRI on or off, runc handlers; in the schema of each version (2 for 1.7, 3 for 2.x).

Keys that matter on a host like this one: ``restrict_oom_score_adj`` (root lacks
CAP_SYS_RESOURCE: without it every RunPodSandbox fails with "can't get final child's PID from
pipe: EOF"), runc's ``Root`` (else its state escapes to /run/containerd/runc), host-network
pods without CNI. :func:`verify` checks with ``containerd config dump`` that the binary took
every key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from containers.command import SandboxError, run
from containers.images import PAUSE_IMAGE

__all__ = ["SandboxConfig", "verify"]


@dataclass(frozen=True)
class SandboxConfig:
    version: str  # "1.7" or "2.1"
    base: Path
    address: Path
    nri: bool
    nri_socket: Path
    cdi_dirs: Sequence[Path]
    handlers: Mapping[str, Path]  # CRI runtime handler -> runc-compatible binary; the first is the default

    def render(self) -> dict[str, Any]:
        b = self.base
        runtimes = {
            name: {
                "runtime_type": "io.containerd.runc.v2",
                "options": {"BinaryName": str(binary), "Root": str(b / "runtimes" / name)},
            }
            for name, binary in self.handlers.items()
        }
        runtime = {
            "enable_cdi": True,
            "cdi_spec_dirs": [str(d) for d in self.cdi_dirs],
            "netns_mounts_under_state_dir": True,
            "disable_apparmor": True,
            "restrict_oom_score_adj": True,
        }
        containerd = {"default_runtime_name": next(iter(self.handlers)), "runtimes": runtimes}
        nri = {
            "disable": not self.nri,
            "socket_path": str(self.nri_socket),
            "plugin_path": str(b / "nri" / "plugins"),
            "plugin_config_path": str(b / "nri" / "conf.d"),
            "plugin_registration_timeout": "5s",
            "plugin_request_timeout": "2s",
        }
        streaming = {"disable_tcp_service": True, "stream_server_address": "127.0.0.1", "stream_server_port": "0"}
        plugins: dict[str, Any]
        if self.version == "1.7":
            cri = {
                **runtime,
                **streaming,
                "sandbox_image": PAUSE_IMAGE,
                "containerd": {"snapshotter": "overlayfs", **containerd},
                "cni": {"bin_dir": str(b / "cni" / "bin"), "conf_dir": str(b / "cni" / "conf")},
            }
            plugins = {"io.containerd.grpc.v1.cri": cri}
            schema = 2
        else:
            plugins = {
                "io.containerd.cri.v1.images": {"snapshotter": "overlayfs", "pinned_images": {"sandbox": PAUSE_IMAGE}},
                "io.containerd.cri.v1.runtime": {
                    **runtime,
                    "containerd": containerd,
                    "cni": {"bin_dirs": [str(b / "cni" / "bin")], "conf_dir": str(b / "cni" / "conf")},
                },
                "io.containerd.grpc.v1.cri": streaming,
                "io.containerd.image-verifier.v1.bindir": {"bin_dir": str(b / "image-verifier")},
            }
            schema = 3
        plugins["io.containerd.internal.v1.opt"] = {"path": str(b / "opt")}
        plugins["io.containerd.nri.v1.nri"] = nri
        return {
            "version": schema,
            "root": str(b / "root"),
            "state": str(b / "state"),
            "temp": str(b / "tmp"),
            "grpc": {"address": str(self.address)},
            "ttrpc": {"address": str(self.address) + ".ttrpc"},
            "plugins": plugins,
        }


def verify(containerd: Path, config_path: Path, wanted: Mapping[str, Any], version: str) -> None:
    """Check with ``containerd config dump`` that the binary took every key of ``wanted``."""
    res = run([containerd, "--config", config_path, "config", "dump"], timeout=20)
    dumped = tomllib.loads(res.stdout)
    ignored = [f"{key} = {want!r} (dump: {got!r})" for key, want, got in _compare(wanted, dumped)]
    if ignored:
        raise SandboxError(f"containerd {version} ignored config keys: " + "; ".join(ignored))


def _compare(want: Mapping[str, Any], got: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(key, wanted, found) for every leaf of ``want`` that ``got`` lacks or holds differently."""
    for key, value in want.items():
        path = f"{prefix}.{key}" if prefix else key
        found = got.get(key) if isinstance(got, Mapping) else None
        if isinstance(value, Mapping):
            yield from _compare(value, found, path)
        elif found != value:
            yield path, value, found
