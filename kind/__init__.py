"""kind on this kind of machine, without Docker or a registry: developer tooling, never in the wheel.

One job per module, e.g. :mod:`kind.nodeimage` (kind's node image assembled from Debian's archive,
the Go module proxy and the project's own builds, cached by its inputs) and :mod:`kind.provider`
(``kind`` on a private podman inside private network and mount namespaces, and the proof that
nothing is left afterwards).
"""
