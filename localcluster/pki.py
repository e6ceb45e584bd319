"""The cluster's certificates and kubeconfigs, generated locally (ECDSA P-256: fast and accepted
by every component), written under ``DIR/pki`` and ``DIR/kubeconfig``."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

VALIDITY = datetime.timedelta(days=365)
SERVICE_IP = "10.96.0.1"  # the first address of the service range: the `kubernetes` Service
API_SERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Client:
    """A client certificate's identity: its user name and groups."""

    file: str
    user: str
    groups: tuple[str, ...] = ()


NODE_NAME = "localhost"  # the node of a cluster made without --node
CLIENTS = (
    Client("admin", "kubernetes-admin", ("system:masters",)),
    Client("controller-manager", "system:kube-controller-manager"),
    Client("scheduler", "system:kube-scheduler"),
    Client("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)),
    Client("kube-proxy", "system:kube-proxy"),  # bound to system:node-proxier by Kubernetes' own RBAC
)
KUBECONFIGS = ("admin", "controller-manager", "scheduler", "kube-proxy")


def kubelet_client(node: str) -> Client:
    """A node's kubelet identity (the Node authorizer and NodeRestriction key on it)."""
    return Client(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",))


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


class Pki:
    """A CA and the certificates signed by it, under ``base`` (``DIR/pki``)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def path(self, name: str) -> Path:
        return self.base / name

    @property
    def ca(self) -> Path:
        return self.path("ca.crt")

    def generate(self, nodes: Sequence[str] = (NODE_NAME,), addresses: Sequence[str] = ()) -> None:
        """The CA, the control plane's certificates, and each node's kubelet client and serving ones."""
        self.base.mkdir(parents=True, exist_ok=True, mode=0o700)
        ca_key = _key()
        ca_name = _name("mokka-cluster-ca")
        ca_cert = (
            _builder(ca_name, ca_name, ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        self._write("ca", ca_cert, ca_key)

        def leaf(name: str, subject: x509.Name, usage: ObjectIdentifier, sans: list[x509.GeneralName]) -> None:
            key = _key()
            builder = (
                _builder(subject, ca_name, key.public_key())
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            )
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            self._write(name, builder.sign(ca_key, hashes.SHA256()), key)

        loopback = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        leaf(
            "apiserver",
            _name("kube-apiserver"),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [
                *(x509.DNSName(n) for n in API_SERVER_NAMES),
                *loopback,
                *(x509.IPAddress(ipaddress.ip_address(a)) for a in (SERVICE_IP, *addresses)),
            ],
        )
        for node in nodes:
            serving = [x509.DNSName(node), *loopback]
            leaf(f"kubelet-serving-{node}", _name(node), ExtendedKeyUsageOID.SERVER_AUTH, serving)
        for client in (*CLIENTS, *(kubelet_client(node) for node in nodes)):
            leaf(client.file, _name(client.user, client.groups), ExtendedKeyUsageOID.CLIENT_AUTH, [])
        sa = _key()
        self.path("sa.key").write_bytes(_pem_key(sa))
        self.path("sa.pub").write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.path(f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path = self.path(f"{name}.key")
        key_path.write_bytes(_pem_key(key))
        key_path.chmod(0o600)

    def kubeconfig(self, name: str, server: str, out: Path) -> Path:
        """A kubeconfig for client certificate ``name`` talking to ``server`` (data embedded)."""

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "mokka", "cluster": {"server": server, "certificate-authority-data": b64(self.ca)}}],
            "users": [
                {
                    "name": name,
                    "user": {
                        "client-certificate-data": b64(self.path(f"{name}.crt")),
                        "client-key-data": b64(self.path(f"{name}.key")),
                    },
                }
            ],
            "contexts": [{"name": "mokka", "context": {"cluster": "mokka", "user": name}}],
            "current-context": "mokka",
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(config, sort_keys=False))
        out.chmod(0o600)
        return out


def token_kubeconfig(server: str, ca: Path, token: str, out: Path) -> Path:
    """A kubeconfig that authenticates with a bearer token (a service account's)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "mokka",
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()},
            }
        ],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "mokka", "context": {"cluster": "mokka", "user": "token"}}],
        "current-context": "mokka",
    }
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    out.chmod(0o600)
    return out
