"""The ``mokka`` command line.

The root group and its shared helpers are in ``root``; each command group lives in a module of
its own (``profiles``, ``node``, ``run``, ``dra``, ``fleet``, ``bench``, ``cluster``, ``fault`` and ``fault_ib``,
``gpu_operator``), and importing this package registers them all.
"""

from . import bench, cluster, dra, fault, fault_ib, fleet, gpu_operator, node, profiles, run  # noqa: F401 - register the command groups
from .root import main

__all__ = ["main"]
