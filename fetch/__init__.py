"""What Mokka fetches and builds into its cache, once: Debian packages (containerd, runc,
nvidia-smi, busybox, protos, the CDI schema) through a private apt state, Go programs from the
Go module proxy (Kubernetes, NVIDIA's device plugin and GFD, KWOK, helm), compiled protocol
bindings, and the third-party builds a user brings. Every version is pinned in :mod:`.versions`;
``python -m fetch.prepare`` fetches everything ahead (``.ci/setup``).

Above the node and the plugins, below everything that runs containers: a long-running plugin
never loads it."""
