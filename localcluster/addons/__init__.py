"""The pairings on top of the local cluster's real nodes, each an :class:`~.base.AddOn` brought up
with the cluster's :class:`~localcluster.context.Context`: Node Feature Discovery (:mod:`.nfd`),
NVIDIA's device plugin
(:mod:`.device_plugin`), Mokka's DRA driver (:mod:`.dra`), NVIDIA's DRA driver
(:mod:`.nvidia_dra`), GFD's labels (:mod:`.gfd`), dcgm-exporter (:mod:`.dcgm`), virtual pools on
KWOK (:mod:`.kwok`, :mod:`.virtual`, :mod:`.virtualpools`) and fake-gpu-operator (:mod:`.fgo`).

A new pairing is a new module here and one line in :meth:`localcluster.cluster.Options.addons`.
"""
