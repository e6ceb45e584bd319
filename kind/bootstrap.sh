#!/usr/bin/env bash
# Create a kind cluster with NRI and CDI on, build and load Mokka's image, install the chart on
# the `integration` worker and check that a plain pod there runs `nvidia-smi -L`.
#
#   kind/bootstrap.sh [--containerd 1.7|2] [--name NAME] [--profile NAME] [--gpus N]
#                     [--image REPO:TAG] [--nvidia-smi 550|535] [--fgo] [--delete]
#
# Needs docker or podman, and kubectl, on PATH; kind and helm are taken from PATH, else from
# `.ci/setup --tests` (fetch.prepare), else built with `go install` at pinned versions
# (fetch.gotool). Without docker (or its daemon) kind runs on podman (KIND_EXPERIMENTAL_PROVIDER=
# podman), and the image is built by kind/dockerfile_image.py and loaded as archives, with
# debian:bookworm-slim (the smoke pod's image): tests/test_kind_cluster.py runs this script
# so in kind/provider.py's namespaces; tests/test_kind.py keeps it consistent with the chart.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"

CONTAINERD=2
NAME=mokka
PROFILE=h100
GPUS=""
IMAGE=mokka:dev
NVIDIA_SMI=550
FGO=false
DELETE=false
NAMESPACE=mokka
POOL_LABEL=run.ai/simulated-gpu-node-pool
HELM_VERSION=v3.18.6

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
say() { printf '\n== %s\n' "$*"; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --containerd) CONTAINERD="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --profile) PROFILE="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --image) IMAGE="$2"; shift 2 ;;
    --nvidia-smi) NVIDIA_SMI="$2"; shift 2 ;;
    --fgo) FGO=true; shift ;;
    --delete) DELETE=true; shift ;;
    -h|--help) usage 0 ;;
    *) printf 'unknown argument: %s\n' "$1" >&2; usage 2 ;;
  esac
done

case "$CONTAINERD" in
  1.7) CONFIG="$HERE/cluster-containerd-1.7.yaml"; KIND_VERSION=v0.26.0 ;;
  2) CONFIG="$HERE/cluster-containerd-2.yaml"; KIND_VERSION=v0.29.0 ;;
  *) die "--containerd must be 1.7 or 2, not $CONTAINERD" ;;
esac
[[ "$IMAGE" == *:* ]] || die "--image must be REPO:TAG, not $IMAGE"
[ -n "$NVIDIA_SMI" ] || die "--nvidia-smi must name a version: the check runs nvidia-smi in a plain pod"
CONTEXT="kind-$NAME"

# A Go-built tool at a pinned version, when PATH has none.
gotool() {
  (cd "$REPO" && python3 -c "import sys; from fetch import gotool; print(gotool.install(sys.argv[1]))" "$1")
}
# A tool `.ci/setup --tests` built (fetch.versions.KIND, .HELM), if it did.
prepared() {
  (cd "$REPO" && python3 -c "import sys; from fetch import prepare, versions; print(prepare.go_binary(getattr(versions, sys.argv[1])))" "$1" 2>/dev/null) || true
}

command -v docker >/dev/null || command -v podman >/dev/null \
  || die "docker or podman is needed (kind runs its nodes as containers)"
# podman when kind is told so, or when there is no docker that answers (a docker CLI without
# its daemon is common); docker otherwise
if [ "${KIND_EXPERIMENTAL_PROVIDER:-}" = podman ] \
  || { command -v podman >/dev/null && ! { command -v docker >/dev/null && docker info >/dev/null 2>&1; }; }; then
  ENGINE=podman
  export KIND_EXPERIMENTAL_PROVIDER=podman
else
  ENGINE=docker
fi
command -v kubectl >/dev/null || die "kubectl is needed"
KIND="$(command -v kind || true)"
[ -n "$KIND" ] || KIND="$(prepared KIND)"
[ -n "$KIND" ] || KIND="$(gotool "sigs.k8s.io/kind@$KIND_VERSION")"
HELM="$(command -v helm || true)"
[ -n "$HELM" ] || HELM="$(prepared HELM)"
[ -n "$HELM" ] || HELM="$(gotool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")"
"$KIND" version | grep -q "$KIND_VERSION" || printf 'note: %s was built for kind %s; this is %s\n' \
  "$(basename "$CONFIG")" "$KIND_VERSION" "$("$KIND" version)"

if $DELETE; then
  say "deleting cluster $NAME"
  exec "$KIND" delete cluster --name "$NAME"
fi

say "cluster $NAME (containerd $CONTAINERD, $(basename "$CONFIG"))"
if "$KIND" get clusters | grep -qx "$NAME"; then
  echo "exists: reusing it"
else
  "$KIND" create cluster --name "$NAME" --config "$CONFIG" --wait 180s
fi
kubectl --context "$CONTEXT" get nodes -L "$POOL_LABEL"

say "image $IMAGE (nvidia-smi $NVIDIA_SMI, $ENGINE)"
if [ "$ENGINE" = docker ]; then
  docker build -t "$IMAGE" --build-arg "NVIDIA_SMI=$NVIDIA_SMI" "$REPO"
  "$KIND" load docker-image "$IMAGE" --name "$NAME"
else
  # kind's podman provider loads archives; the nodes cannot pull debian:bookworm-slim either
  ARCHIVES="$(mktemp -d "${TMPDIR:-/tmp}/mokka-bootstrap.XXXXXX")"
  trap 'rm -rf "$ARCHIVES"' EXIT
  ARCHIVE="$ARCHIVES/image.tar"
  BASE_ARCHIVE="$ARCHIVES/debian-bookworm-slim.tar"
  (cd "$REPO" && python3 -m kind.dockerfile_image --out "$ARCHIVE" --base-out "$BASE_ARCHIVE" --tag "$IMAGE" \
    --nvidia-smi "$NVIDIA_SMI")
  KIND_EXPERIMENTAL_PROVIDER=podman "$KIND" load image-archive "$ARCHIVE" --name "$NAME"
  KIND_EXPERIMENTAL_PROVIDER=podman "$KIND" load image-archive "$BASE_ARCHIVE" --name "$NAME"
  rm -rf "$ARCHIVES"
fi

say "chart: Mokka on the integration pool"
set -- --set "image.repository=${IMAGE%:*}" --set-string "image.tag=${IMAGE##*:}" --set image.pullPolicy=Never \
  --set "gpu.profile=$PROFILE" --set-string "nodeSelector.run\.ai/simulated-gpu-node-pool=integration"
[ -z "$GPUS" ] || set -- "$@" --set "gpu.count=$GPUS"
if $FGO; then
  kubectl --context "$CONTEXT" create namespace gpu-operator --dry-run=client -o yaml | kubectl --context "$CONTEXT" apply -f -
  set -- "$@" --set integrations.fakeGpuOperator.enabled=true --set integrations.fakeGpuOperator.targetNamespace=gpu-operator
fi
"$HELM" upgrade --install mokka "$REPO/charts/mokka" --kube-context "$CONTEXT" \
  --namespace "$NAMESPACE" --create-namespace "$@" --wait --timeout 300s
# helm's --wait can pass a DaemonSet that has scheduled nothing yet: the smoke pod must not start
# before the NRI plugin runs
kubectl --context "$CONTEXT" -n "$NAMESPACE" rollout status daemonset -l app.kubernetes.io/instance=mokka --timeout=300s
kubectl --context "$CONTEXT" -n "$NAMESPACE" get pods -o wide

say "check: a plain pod on the integration worker runs nvidia-smi -L"
kubectl --context "$CONTEXT" delete pod mokka-smoke --ignore-not-found --wait
kubectl --context "$CONTEXT" run mokka-smoke --image=debian:bookworm-slim --restart=Never \
  --overrides='{"apiVersion":"v1","spec":{"nodeSelector":{"run.ai/simulated-gpu-node-pool":"integration"}}}' \
  -- nvidia-smi -L
kubectl --context "$CONTEXT" wait pod/mokka-smoke --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s || {
  kubectl --context "$CONTEXT" describe pod mokka-smoke
  kubectl --context "$CONTEXT" logs mokka-smoke || true
  die "the smoke pod did not succeed"
}
out="$(kubectl --context "$CONTEXT" logs mokka-smoke)"
printf '%s\n' "$out"
found="$(printf '%s\n' "$out" | grep -c '^GPU [0-9]*:' || true)"
expected="${GPUS:-$(cd "$REPO" && python3 -c "import sys; from gpumodel import profile; print(profile.load(sys.argv[1]).gpu_count)" "$PROFILE")}"
[ "$found" = "$expected" ] || die "nvidia-smi -L listed $found GPUs, expected $expected"
kubectl --context "$CONTEXT" delete pod mokka-smoke --wait=false

say "check: the integration node carries the GPU labels"
kubectl --context "$CONTEXT" get nodes -l "$POOL_LABEL=integration,nvidia.com/gpu.present=true" \
  -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory --no-headers | grep -q . \
  || die "no integration node is labelled nvidia.com/gpu.present=true"
if $FGO; then
  kubectl --context "$CONTEXT" -n gpu-operator get cm "gpu-profile-$PROFILE" -o name
fi

say "ok: $found mock GPUs in a plain pod on cluster $NAME (context $CONTEXT)"
