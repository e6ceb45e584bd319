"""Containers without Docker: a private containerd (1.7 or 2.x) driven through CRI from Python,
OCI images built without a registry, private mount namespaces, leak-free teardown of processes,
mounts and cgroups, podman runs, and the NRI plugin as a process beside a containerd.

Used by ``mokka demo``, the local cluster and the tests; built on what :mod:`fetch` brings."""
