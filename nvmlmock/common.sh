# Shared by entrypoint.sh and cleanup.sh (sourced). FGO mounts the node's /var/lib/nvml-mock at
# /host/var/lib/nvml-mock; Mokka's host setup writes absolute paths (the /run/nvidia/driver link,
# the CDI spec's host paths), so the root is bound at its node path inside the container too.
ROOT=/var/lib/nvml-mock
RUN_NVIDIA=/host/run/nvidia
CDI_DIR=/host/var/run/cdi
NVIDIA_SMI=/usr/local/lib/mokka/nvidia-smi

bind_root() {
    if ! grep -q " $ROOT " /proc/self/mountinfo; then
        mkdir -p "$ROOT"
        mount --bind /host$ROOT "$ROOT"
    fi
}
