"""Mokka's command line, the top layer: it wires the model, the node, the plugins, what is fetched and
built, containers and the local cluster together."""

__version__ = "0.1.0"
