"""The local cluster's Go builds (Kubernetes, NVIDIA's device plugin and GFD, CoreDNS) and the
versions they are pinned at: what `.ci/setup --tests` builds once into the cache for
:mod:`localcluster`."""
