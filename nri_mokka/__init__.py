"""The containerd NRI plugin: the decision, its rendering as adjustments, and the NRI transport."""
