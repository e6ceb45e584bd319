"""Mokka: NRI plugin and helpers for mocked NVIDIA GPUs."""
