#!/bin/bash
# Mokka's start check for NVIDIA's DRA kubelet plugins (NVIDIA's chart runs it in the plugins' init
# container): wait until the driver root the chart was given (NVIDIA_DRIVER_ROOT, seen here through
# its parent at /driver-root-parent) holds the driver's nvidia-smi and libnvidia-ml.so.1, as a mock
# node's host setup (Mokka's chart) stages them. Says once what is missing, then every minute.
set -u
root=${NVIDIA_DRIVER_ROOT:-/}
if [ "$root" = / ]; then
  here=/driver-root-parent
else
  here=/driver-root-parent/$(basename "${root%/}")
fi
said=0
while true; do
  missing=()
  [ -x "$here/usr/bin/nvidia-smi" ] || missing+=("usr/bin/nvidia-smi")
  lib=""
  for dir in usr/lib64 usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib; do
    if [ -e "$here/$dir/libnvidia-ml.so.1" ]; then lib=$dir/libnvidia-ml.so.1; break; fi
  done
  [ -n "$lib" ] || missing+=("libnvidia-ml.so.1 (usr/lib64 or usr/lib/<arch>-linux-gnu)")
  if [ ${#missing[@]} -eq 0 ]; then
    echo "driver root $root: nvidia-smi and $lib found"
    exit 0
  fi
  if [ $((said % 30)) -eq 0 ]; then
    echo "driver root $root: waiting for ${missing[*]} (is the node's mock driver staged there?)"
  fi
  said=$((said + 1))
  sleep 2
done
