"""A real Kubernetes on this machine with mock GPU nodes (one or a fleet), without Docker: binaries, PKI,
configs, the control plane and the nodes, life cycle."""
