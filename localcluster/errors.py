"""The local cluster's one error: what could not be brought up, reached or torn down, in one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["ClusterError", "api_errors"]


class ClusterError(RuntimeError):
    """The cluster could not be brought up, reached or torn down; the message says what."""


@contextlib.contextmanager
def api_errors(what: str) -> Iterator[None]:
    """The ``kubernetes`` client's errors (a refused call, a lost connection) as one ClusterError line."""
    from k8snode.dra.cluster import api_reason

    try:
        yield
    except ClusterError:
        raise
    except Exception as exc:
        raise ClusterError(f"{what}: {api_reason(exc)}") from None
