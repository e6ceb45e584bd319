"""The cluster's private mount namespace: kubelet and containerd write their fixed host paths
(``/var/lib/kubelet``, ``/run/containerd``, ``/var/log/pods``, CDI and NRI directories...) into
the cluster's directory, kubelet's host sysctls land in plain files, and NVIDIA's tools find the
mock node's sysfs entries at the real ``/sys`` paths — nothing of it visible outside.

The holder process (``python -m localcluster.namespace SPEC``, run under ``unshare --mount
--propagation private``) sets the mounts up and then waits for SIGTERM; every cluster process
joins its namespace (``nsenter --mount=/proc/<holder>/ns/mnt``). The namespace, and with it
every mount made in it, ends when the holder and the processes in it are gone.

The spec (JSON) is a view of :mod:`containers.mounts`: ``binds``, ``links`` and ``absent``, each
placed as that module describes (unions of their parents where they do not exist).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from containers.mounts import MountError, setup


def _stop(_signum: int, _frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: list[str]) -> int:
    """``SPEC READY``: set up the mounts from SPEC, write READY, wait for SIGTERM."""
    spec_path, ready = Path(argv[0]), Path(argv[1])
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    t0 = time.monotonic()
    try:
        spec = json.loads(spec_path.read_text())
        unions = setup(spec, ready.parent / "stash")
    except (OSError, MountError, ValueError) as exc:
        print(f"namespace: {exc}", file=sys.stderr, flush=True)
        return 1
    ready.write_text(json.dumps({"pid": os.getpid(), "unions": unions, "seconds": time.monotonic() - t0}))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
