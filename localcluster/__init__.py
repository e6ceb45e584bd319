"""A real Kubernetes on this machine with mock GPU nodes — one, or a fleet of several boards in
NVLink racks — without Docker: one control plane (:mod:`.controlplane`), complete nodes
(:mod:`.node`), Services and DNS in a network namespace of the cluster's own, and the add-ons
the options ask for (:mod:`.addons`). ``mokka cluster`` is its command line; the Go programs it
runs are built by :mod:`fetch.kube` (``.ci/setup --tests``, or its first ``up``).

The files, from the bottom: ``layout`` (paths, names, ports), ``errors``, ``state`` (what
``cluster.json`` keeps), ``process`` (one process), ``processes`` (the cluster's recorded
processes), ``apiserver`` (its clients), ``config`` and ``pki`` (what each component is told),
``gpustack`` (a node's GPU stack), ``node``, ``context`` (what nodes and add-ons are given),
``controlplane``, ``addons/``, and ``cluster`` on top (``up``, ``down``, ``status``).
"""
