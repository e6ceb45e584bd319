"""The cluster's API server as its clients reach it: plain HTTPS with the admin's credentials for
the few calls the cluster makes itself, ``kubectl`` and the ``kubernetes`` client for the rest."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from fetch.kube import binaries

from .errors import ClusterError
from .pki import Pki

__all__ = ["ApiServer"]


class ApiServer:
    """The API server at ``server`` (``https://127.0.0.1:PORT``), trusted through the cluster's CA
    in ``pki``; ``kubeconfig`` is the admin's; ``cache`` holds kubectl."""

    def __init__(self, server: str, pki: Path, kubeconfig: Path, cache: Path | None) -> None:
        self.server = server
        self.pki = pki
        self.kubeconfig = kubeconfig
        self.cache = cache
        self._ssl_context: ssl.SSLContext | None = None

    def client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` with the admin's credentials."""
        from kubernetes import config as kconfig  # type: ignore[import-untyped, unused-ignore]

        return kconfig.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        kubectl = binaries.cached(self.cache)
        if kubectl is None:
            raise ClusterError("kubectl is not in the cache")
        argv = [str(kubectl["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args]
        res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
        return res

    def ssl_context(self) -> ssl.SSLContext:
        """TLS with the admin's credentials (made once)."""
        if self._ssl_context is None:
            pki = Pki(self.pki)
            self._ssl_context = ssl.create_default_context(cafile=str(pki.ca))
            self._ssl_context.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))
        return self._ssl_context

    def ready(self) -> bool:
        """``/readyz`` answers 200."""
        try:
            with urllib.request.urlopen(self.server + "/readyz", context=self.ssl_context(), timeout=2) as res:
                return bool(res.status == 200)
        except OSError:
            return False

    def get(self, path: str, timeout: float = 5) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.get_text(path, timeout))
            return data
        except ValueError as exc:
            raise ClusterError(f"GET {path}: {exc}") from None

    def established(self, crd: str) -> bool:
        """Whether CustomResourceDefinition ``crd`` is Established (the API server serves its kind)."""
        obj = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        conditions = obj.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    def get_text(self, path: str, timeout: float = 5) -> str:
        """The body at ``path`` as text (e.g. a pod's /metrics through the API server's proxy)."""
        try:
            with urllib.request.urlopen(self.server + path, context=self.ssl_context(), timeout=timeout) as res:
                return str(res.read().decode())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"GET {path}: {exc}") from None

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        """A JSON merge patch of the object at ``path``."""
        return self._send("PATCH", path, body, "application/merge-patch+json")

    def post(self, path: str, body: Any) -> dict[str, Any]:
        """Create ``body`` in the collection at ``path``."""
        return self._send("POST", path, body, "application/json")

    def delete(self, path: str) -> None:
        """Delete the object at ``path`` at once (no grace period); one already gone is fine."""
        try:
            self._send("DELETE", path, {"gracePeriodSeconds": 0}, "application/json")
        except ClusterError as exc:
            if "404" not in str(exc):
                raise

    def _send(self, method: str, path: str, body: Any, content_type: str) -> dict[str, Any]:
        req = urllib.request.Request(
            self.server + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as res:
                data: dict[str, Any] = json.loads(res.read())
                return data
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{method} {path}: {exc}") from None
