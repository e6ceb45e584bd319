"""A DRA kubelet plugin for the mock GPUs, under the names of NVIDIA's GPU DRA driver.

``gpus`` reads the node's GPUs through its (mock) NVML; ``resources`` renders them as the
ResourceSlice and DeviceClass NVIDIA's driver publishes; ``cluster`` talks to the API server;
``claims`` turns allocated ResourceClaims into CDI device IDs and checkpoints them; ``service``
serves kubelet's Registration and DRAPlugin gRPC APIs (grpclib, with betterproto bindings
compiled at build time from k8s.io/kubelet's protos into ``_pb/``: see ``api``); ``plugin`` runs
it all. ``mokka dra-plugin`` is the command.
"""
