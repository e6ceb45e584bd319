# Mokka's node image: the `mokka` CLI (host setup, NRI plugin, CDI generator, node identity)
# with the native mock libraries, on Debian slim. Build from the repository root:
#
#   docker build -t mokka:dev .                           # with Debian's nvidia-smi 550 (non-free)
#   docker build -t mokka:dev --build-arg NVIDIA_SMI= .   # without nvidia-smi
#   docker build -t mokka:dev --build-arg NVIDIA_SMI=535 .
#   docker build -t mokka:dev --build-arg FLEET= .        # without NVIDIA's GFD and KWOK (no fleet)
#
# The image runs as an unprivileged user by default; the Helm chart runs host setup (mknod,
# the node's driver root) and the NRI plugin (the node's root-owned NRI socket) as root.
ARG DEBIAN_IMAGE=debian:bookworm-slim

# The build stages' tools, installed once for both: compilers for the native libraries and for cgo
# (GFD), Python to build the package and run fetch/, gpgv and the archive keyring that verify .debs.
FROM ${DEBIAN_IMAGE} AS toolchain
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential python3 python3-dev python3-venv ca-certificates debian-archive-keyring gpgv \
    && rm -rf /var/lib/apt/lists/*

FROM toolchain AS build
WORKDIR /src
# The dependencies and the build requirements first, read from pyproject.toml alone: a layer that a
# change to the sources (or the README) reuses, so only the project itself is built again below.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN python3 -m venv /opt/mokka/venv \
    && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(p['project']['dependencies'] + p['build-system']['requires']))" > /tmp/requirements.txt \
    && /opt/mokka/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY setup.py README.md ./
COPY native/ native/
COPY gpumodel/ gpumodel/
COPY cdi/ cdi/
COPY hostsetup/ hostsetup/
COPY nri_mokka/ nri_mokka/
COPY k8snode/ k8snode/
COPY virtualfleet/ virtualfleet/
COPY fetch/ fetch/
COPY containers/ containers/
COPY localcluster/ localcluster/
COPY bench/ bench/
COPY mokka/ mokka/
# `pip install .` compiles native/ (nvml.h from PyPI's nvidia-nvml-dev, a build requirement
# installed above) and ships the libraries inside the package; kubernetes is the node-identity client.
# Then the kubelet's plugin API bindings `mokka dra-plugin` speaks (dra.enabled in the chart), compiled
# into the installed package (python -P: not the sources' copy in the working directory) from the
# k8s.io/kubelet protos on the Go module proxy (fetched over HTTPS, checked against their go.sum
# hashes; no Go toolchain), as a pod could not do at run time.
# hadolint ignore=DL3013
RUN /opt/mokka/venv/bin/pip install --no-cache-dir --no-build-isolation --no-deps . \
    && /opt/mokka/venv/bin/mokka --version \
    && cert="$(python3 -c 'import configparser, os; c = configparser.ConfigParser(); c.read(os.path.expanduser("~/.config/pip/pip.conf")); print(c.get("global", "cert", fallback=""))')" \
    && if [ -n "${cert}" ]; then export SSL_CERT_FILE="${cert}"; fi \
    && MOKKA_CACHE=/tmp/mokka-cache /opt/mokka/venv/bin/python -P -m fetch.kubelet_api \
    && rm -rf /tmp/mokka-cache \
    && /opt/mokka/venv/bin/python -P -c "import k8snode.dra.api"

# nvidia-smi from Debian's non-free archive (550: trixie, 535: bookworm), verified and
# unpacked by fetch.nvidia_smi; empty NVIDIA_SMI builds an image without it.
ARG NVIDIA_SMI=550
RUN mkdir -p /out/usr/local/lib/mokka \
    && if [ -n "${NVIDIA_SMI}" ]; then \
        smi="$(/opt/mokka/venv/bin/python -c "from fetch import nvidia_smi; print(nvidia_smi.fetch('${NVIDIA_SMI}'))")" \
        && install -m 0755 "${smi}" /out/usr/local/lib/mokka/nvidia-smi; \
    fi

# The fleet's Go programs, built from the Go module proxy with Debian's golang as fetch/ builds
# them for the local cluster: NVIDIA's GPU Feature Discovery (the fleet controller runs it once per
# pool) and KWOK with its module's stages (the chart's KWOK keeps virtual nodes Ready). A stage of
# its own, so its layer is reused until fetch/ changes; empty FLEET builds an image without them.
# Behind a TLS-intercepting proxy Go trusts the CA bundle pip is configured with (pip.conf's cert).
FROM toolchain AS fleet
WORKDIR /src
COPY fetch/ fetch/
ARG FLEET=yes
RUN mkdir -p /out/usr/local/bin /out/usr/local/share/mokka/kwok \
    && if [ -n "${FLEET}" ]; then \
        cert="$(python3 -c 'import configparser, os; c = configparser.ConfigParser(); c.read(os.path.expanduser("~/.config/pip/pip.conf")); print(c.get("global", "cert", fallback=""))')" \
        && if [ -n "${cert}" ]; then export SSL_CERT_FILE="${cert}"; fi \
        && gfd="$(python3 -c "from fetch.kube import binaries, gobuild; print(gobuild.build(binaries.DEVICE_PLUGIN))")" \
        && kwok="$(python3 -c "from fetch.kube import binaries, gobuild; print(gobuild.build(binaries.KWOK))")" \
        && install -m 0755 "${gfd}/gpu-feature-discovery" "${kwok}/kwok" /out/usr/local/bin/ \
        && install -m 0644 "${kwok}"/*.yaml /out/usr/local/share/mokka/kwok/ \
        && rm -rf /root/.cache; \
    fi

FROM ${DEBIAN_IMAGE}
# python3 for the CLI; util-linux (nsenter) is part of the base image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin mokka
COPY --from=build /opt/mokka/venv /opt/mokka/venv
COPY --from=build /out/ /
COPY --from=fleet /out/ /
# run:ai fake-gpu-operator's mock backend runs this image as its nvml-mock DaemonSet: /scripts/entrypoint.sh
# stages the node with `mokka host setup`, /scripts/cleanup.sh undoes it (localcluster/nodeimage.py copies
# the same directory). That DaemonSet sets no user: build its image with --build-arg MOKKA_USER=0:0.
COPY nvmlmock/ /scripts/
ENV PATH=/opt/mokka/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="mokka" \
      org.opencontainers.image.description="Mock NVIDIA GPU node: host setup, NRI plugin, CDI, node identity" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG MOKKA_USER=10001:10001
USER ${MOKKA_USER}
CMD ["mokka", "--help"]
