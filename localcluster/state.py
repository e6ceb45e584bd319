"""What a cluster's processes, ports and nodes are, kept in ``DIR/cluster.json`` so that ``down``,
``status`` and the tests of another process find them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ClusterError

__all__ = ["State"]


@dataclass
class State:
    """What ``down``/``status`` of another process need: written to ``DIR/cluster.json``."""

    options: dict[str, Any]
    ports: dict[str, int]
    namespace_inode: int = 0  # the control plane's mount namespace
    procs: list[dict[str, Any]] = field(default_factory=list)
    cgroup_prefix: str = ""
    bridge: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)  # node.new_record()s, in order
    timings: dict[str, float] = field(default_factory=dict)
    nri_external: bool = False
    host_sysctls: dict[str, str] = field(default_factory=dict)  # the host's values when the cluster came up
    virtual: list[dict[str, Any]] = field(default_factory=list)  # virtualfleet.pool.Pool.to_json()s
    fgo: list[str] = field(default_factory=list)  # the FgoSpecs, as given

    @classmethod
    def read(cls, path: Path) -> State:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise ClusterError(f"no cluster there ({path.name} missing)") from None
        except (ValueError, TypeError) as exc:
            raise ClusterError(f"{path.name} is not a cluster state file ({exc})") from None
        except OSError as exc:
            raise ClusterError(f"cannot read {path.name}: {exc.strerror}") from None

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)
