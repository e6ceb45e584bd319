"""The mock node as Kubernetes sees it: node identity labels (and the kubelet-facing plugins)."""
