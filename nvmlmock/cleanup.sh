#!/bin/sh
# The preStop of FGO's nvml-mock DaemonSet: undo what /scripts/entrypoint.sh did (the node labels,
# the CDI spec, the staged driver root and the /run/nvidia/driver link with it) and the
# toolkit-ready marker FGO's wrapper wrote.
set -u
. /scripts/common.sh

python3 -m k8snode.nodeinfo remove --no-nfd || true
rm -f "$CDI_DIR/nvidia.com-gpu.json"
bind_root
mokka host cleanup --root "$ROOT"
rm -f "$RUN_NVIDIA/validations/toolkit-ready"
rmdir "$RUN_NVIDIA/validations" 2>/dev/null || true
