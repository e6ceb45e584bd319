"""The one error of the containerd configuration package."""

from __future__ import annotations


class ConfigError(Exception):
    """A containerd config that cannot be read, merged, written or restored; nothing was changed."""
