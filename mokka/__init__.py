"""Mokka's command line, the top layer: it wires the model, the node, the plugins and the testbed together."""

__version__ = "0.1.0"
