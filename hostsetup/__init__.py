"""Host setup: driver-root staging, containerd configuration, cleanup."""
