"""A real Kubernetes on this machine with mock GPU nodes — one, or a fleet of several boards in
NVLink racks — without Docker: one control plane, complete nodes (:mod:`.node`), Services and DNS
in a network namespace of the cluster's own. ``mokka cluster`` is its command line; the Go
programs it runs are built by :mod:`fetch.kube` (``.ci/setup --tests``, or its first ``up``).
"""
