"""The kubelet's plugin APIs, generated at build time into ``_pb/`` (see ``fetch/kubelet_api.py``).

Importing this module fails with :class:`BindingsMissing` (one clear line) when the bindings were
never generated, instead of an ImportError from deep inside.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DRA_SERVICES", "BindingsMissing", "dra_v1", "dra_v1beta1", "registration"]


class BindingsMissing(ImportError):
    """The generated kubelet API bindings are not there."""


try:
    from ._pb import pluginregistration as _registration
    from ._pb.k8s.io.kubelet.pkg.apis.dra import v1 as _dra_v1
    from ._pb.k8s.io.kubelet.pkg.apis.dra import v1beta1 as _dra_v1beta1
except ImportError as exc:
    raise BindingsMissing(
        f"the kubelet API bindings (k8snode/dra/_pb) are missing ({exc}): run `python -m fetch.kubelet_api` "
        "(or .ci/setup --tests)"
    ) from None

registration: Any = _registration
dra_v1: Any = _dra_v1
dra_v1beta1: Any = _dra_v1beta1

# The versions a plugin lists in its PluginInfo, newest first (``DRAPluginService`` of each
# k8s.io/kubelet/pkg/apis/dra/<version> package), with the generated module serving each.
DRA_SERVICES: tuple[tuple[str, Any], ...] = (("v1.DRAPlugin", dra_v1), ("v1beta1.DRAPlugin", dra_v1beta1))
