"""CRI (the Kubernetes Container Runtime Interface, runtime.v1) from Python, as kubelet speaks it.

The bindings in ``_pb/`` are compiled from Debian's CRI ``api.proto`` by :mod:`fetch.cri_bindings`
(generated, never committed); ``client`` drives a runtime's CRI socket over gRPC with grpclib;
``logfile`` reads the container log files CRI runtimes write.
"""
