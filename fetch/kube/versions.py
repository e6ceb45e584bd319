"""Every version the local cluster uses, pinned in one place."""

from __future__ import annotations

from pathlib import Path

from fetch.debprogram import DebianProgram

KUBERNETES = "v1.34.4"
# k8s.io/kubernetes' staging modules are published as v0.<minor>.<patch>.
KUBERNETES_STAGING = "v0." + KUBERNETES.removeprefix("v1.")
# Served by the Go module proxy (v0.17.0 and v0.20.0 are not); built through a wrapper module.
DEVICE_PLUGIN = "v0.18.0"
# Bookworm's etcd 3.4 is too old for Kubernetes 1.34; trixie's 3.5 runs on bookworm.
ETCD_SUITE = "trixie"
ETCD_PACKAGE = "etcd-server"
CONTAINERD = "2.1"
# The cluster's DNS; 1.12 is the newest whose go.mod asks no more than Debian's Go fallback (1.24).
COREDNS = "v1.12.4"
# bridge, host-local, loopback for the pod network
CNI_SUITE = "bookworm"
CNI_PACKAGE = "containernetworking-plugins"
# Virtual nodes (Node objects kept alive against the API server); its go.mod asks for Go 1.26.
KWOK = "v0.8.0"
# Node Feature Discovery: the release the GPU Operator v25.3 chart deploys (its subchart); as a main
# module it fails on its ``replace ./api/nfd``, through a wrapper module its api/nfd is served.
NFD = "v0.17.3"
# NVIDIA's GPU Operator: the v25.3.4 release branch as the Go module proxy serves it (no tag is
# served); its module holds the operator, the validator, their assets and the Helm chart.
GPU_OPERATOR = "v0.0.0-20250917190837-d73a0086a6ba"
GPU_OPERATOR_RELEASE = "v25.3.4"
# NVIDIA's device plugin and GFD as that chart deploys them (now served; older than DEVICE_PLUGIN).
GPU_OPERATOR_DEVICE_PLUGIN = "v0.17.4"
# NVIDIA's container toolkit as that chart deploys it (the toolkit operand's installer, nvidia-ctk,
# its runtimes and CDI hook). Newer ones (1.18+) write a drop-in the v25.3 operator does not mount.
CONTAINER_TOOLKIT = "v1.17.8"
# Karpenter's KWOK provider (virtual pools' autoscaler, ``--karpenter``); its go.mod asks for Go
# 1.26.9, newer than Debian's 1.26.8: built with the toolchain the Go module proxy serves.
KARPENTER = "v1.15.0"
KARPENTER_GOTOOLCHAIN = "go1.27.3"
# A plain OCI registry (CNCF distribution's, Debian's package), run beside the local cluster so that an
# image a chart pulls with imagePullPolicy Always (FGO's nvml-mock DaemonSets) comes from somewhere real.
REGISTRY = DebianProgram("bookworm", "docker-registry", Path("usr/bin/docker-registry"))
# Prometheus for the tests' image of the chart's integrations.prometheus (Debian's package).
PROMETHEUS = DebianProgram("bookworm", "prometheus", Path("usr/bin/prometheus"))
