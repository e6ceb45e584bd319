"""CRI (the Kubernetes Container Runtime Interface, runtime.v1) from Python, as kubelet speaks it.

``bindings`` compiles Debian's CRI ``api.proto`` with betterproto into ``_pb/`` (generated,
never committed); ``client`` drives a runtime's CRI socket over gRPC with grpclib; ``logfile``
reads the container log files CRI runtimes write.
"""
