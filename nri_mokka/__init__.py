"""Mokka: make a CPU-only Linux node look like an NVIDIA GPU node."""

__version__ = "0.1.0"
