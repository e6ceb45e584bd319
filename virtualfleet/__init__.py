"""Virtual GPU nodes: pools of Node objects without a kubelet (KWOK keeps them Ready) that carry
what a real Mokka node of their profile shows the API.

- :mod:`.pool`: a pool and what each of its nodes carries (labels, resources, racks, faults).
- :mod:`.template`: a pool's facts computed once from its profile by the programs a real node
  runs (NVIDIA's GFD on the profile staged as a mock node; NVML as the DRA plugin reads it).
- :mod:`.faults`: the fault ConfigMap's entries as the device plugin shows them on a virtual node.
- :mod:`.crd`: the VirtualGPUPool API's definition (the chart's is generated from it).
- :mod:`.controller`: the fleet controller, reconciling the VirtualGPUPool API into nodes.
- :mod:`.lease`: the Lease its replicas elect a leader with.

The local cluster's ``--virtual`` pools and the chart's controller share these.
"""
