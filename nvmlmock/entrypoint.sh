#!/bin/sh
# run:ai fake-gpu-operator's mock backend runs this image as its per-pool `nvml-mock-<pool>`
# DaemonSet: `/bin/sh -c '/scripts/entrypoint.sh & ...'`, waiting for /host/run/nvidia/driver to
# become a symlink, with env GPU_COUNT, DRIVER_VERSION, NODE_NAME and hostPaths /var/lib/nvml-mock
# (at /host/var/lib/nvml-mock), /var/run/cdi (/host/var/run/cdi), /run/nvidia (/host/run/nvidia)
# and the pool's merged profile at /etc/nvml-mock/config.yaml. This stages the node with Mokka's
# own host setup (the driver root at /var/lib/nvml-mock/driver, /run/nvidia/driver linked to it),
# writes the CDI spec, labels the node as GPU Feature Discovery would, then stays up;
# /scripts/cleanup.sh (the DaemonSet's preStop) undoes all of it.
set -eu
. /scripts/common.sh

: "${GPU_COUNT:?GPU_COUNT is not set}" "${NODE_NAME:?NODE_NAME is not set}"
if [ "$(id -u)" != 0 ]; then
    echo "nvml-mock: host setup needs root (this image runs as uid $(id -u)); build it with --build-arg MOKKA_USER=0:0" >&2
    exit 1
fi
bind_root
profile=$(python3 /scripts/profile.py /etc/nvml-mock/config.yaml)
if [ -n "${DRIVER_VERSION:-}" ]; then echo "nvml-mock: profile $profile, $GPU_COUNT GPU(s), driver $DRIVER_VERSION asked"; fi
set -- --profile "$profile" --gpus "$GPU_COUNT" --root "$ROOT" --run-nvidia "$RUN_NVIDIA"
if [ -x "$NVIDIA_SMI" ]; then set -- "$@" --nvidia-smi "$NVIDIA_SMI"; else set -- "$@" --no-nvidia-smi; fi
mokka host setup "$@"
mokka cdi generate --root "$ROOT" --output "$CDI_DIR" --no-validate
python3 -m k8snode.nodeinfo apply --profile "$profile" --gpus "$GPU_COUNT" --no-nfd \
    || echo "nvml-mock: the node's GPU labels were not set (no API access?)" >&2
echo "nvml-mock: node $NODE_NAME staged at $ROOT, $RUN_NVIDIA/driver -> $ROOT/driver"
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $! || true; done
