"""A real single-node Kubernetes on this machine, without Docker: binaries, PKI, configs, life cycle."""
