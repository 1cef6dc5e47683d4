"""Credentials of a deployment: a CA, the SuperLink's TLS certificate, and one key pair per SuperNode.

Layout of the credentials folder (private keys are written with mode 0600)::

    ca.crt, ca.key              the certificate authority every SuperNode and the flwr CLI trust
    server.crt, server.key      the SuperLink's TLS certificate (SANs: the given hosts), signed by the CA
    nodes/<name>.key            a SuperNode's authentication key, OpenSSH private key (EC P-384)
    nodes/<name>.pub            its public key (OpenSSH), registered on the SuperLink

A data owner can also make its own key pair (:func:`write_node_key`) and hand over only the ``.pub``
file. Everything is generated with the ``cryptography`` package; no openssl binary is needed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import TrustformerError

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


class CredentialsError(TrustformerError, ValueError):
    """A credentials folder is missing a file, or a file cannot be used."""


@dataclass(frozen=True)
class Credentials:
    """Paths of a deployment's credentials folder."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"

    def node_key(self, name: str) -> Path:
        return self.nodes_dir / f"{name}.key"

    def node_public_key(self, name: str) -> Path:
        return self.nodes_dir / f"{name}.pub"

    def public_keys(self) -> list[Path]:
        """Every node public key of the folder, by name."""
        return sorted(self.nodes_dir.glob("*.pub")) if self.nodes_dir.is_dir() else []

    def require_server(self) -> Credentials:
        """Raise CredentialsError unless the CA and the server certificate are there."""
        for path in (self.ca_cert, self.server_cert, self.server_key):
            if not path.is_file():
                raise CredentialsError(
                    f"{path} does not exist (create the credentials with `trustformer deploy certs --out {self.root}`)"
                )
        return self


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Trustformer federation"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(days: int = 365) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate (EC P-384) for one federation."""
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Trustformer federation CA"))
        .issuer_name(_name("Trustformer federation CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    return cert, key


def make_server_certificate(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    days: int = 365,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A TLS server certificate for ``hosts`` (IP addresses or DNS names), signed by the CA."""
    if not hosts:
        raise CredentialsError("the server certificate needs at least one host name or IP address")
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return cert, key


def write_node_key(directory: str | Path, name: str) -> tuple[Path, Path]:
    """A SuperNode authentication key pair (EC P-384, OpenSSH format): ``<name>.key`` and ``<name>.pub``."""
    if not name or "/" in name or name.startswith("."):
        raise CredentialsError(f"node key name {name!r}: use a plain file name such as client-0")
    directory = Path(directory)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    key_path, pub_path = directory / f"{name}.key", directory / f"{name}.pub"
    _write_private(key_path, private)
    pub_path.write_bytes(public + f" {name}\n".encode())
    return key_path, pub_path


def write_credentials(
    out: str | Path,
    *,
    clients: int = 3,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    days: int = 365,
    node_names: list[str] | None = None,
    overwrite: bool = False,
) -> Credentials:
    """Write a CA, the SuperLink certificate for ``hosts`` and ``client-0`` … ``client-<N-1>`` node keys."""
    creds = Credentials(Path(out))
    if creds.ca_cert.exists() and not overwrite:
        raise CredentialsError(f"{creds.ca_cert} already exists (use another folder, or --force to replace it)")
    if clients < 0:
        raise CredentialsError(f"--clients {clients} must be >= 0")
    ca_cert, ca_key = make_ca(days)
    server_cert, server_key = make_server_certificate(ca_cert, ca_key, tuple(hosts), days)
    creds.root.mkdir(parents=True, exist_ok=True)
    creds.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        creds.ca_key,
        ca_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    creds.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        creds.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    for name in node_names if node_names is not None else [f"client-{i}" for i in range(clients)]:
        write_node_key(creds.nodes_dir, name)
    return creds


def local_runtime_tls(directory: str | Path, days: int = 365) -> Credentials:
    """TLS for a SuperNode's own Runtime API on 127.0.0.1 (its link to the ClientApp processes it
    starts): a CA and a certificate of this machine's own, made once in ``directory`` and reused."""
    creds = Credentials(Path(directory))
    if not (creds.ca_cert.is_file() and creds.server_cert.is_file() and creds.server_key.is_file()):
        write_credentials(directory, clients=0, hosts=DEFAULT_HOSTS, days=days, overwrite=True)
    return creds


def check_public_key(path: str | Path) -> Path:
    """A node public key file the SuperLink accepts (OpenSSH, NIST EC curve), else CredentialsError."""
    path = Path(path)
    try:
        key = serialization.load_ssh_public_key(path.read_bytes())
    except FileNotFoundError:
        raise CredentialsError(f"node public key {path} does not exist") from None
    except (ValueError, TypeError) as exc:
        raise CredentialsError(f"node public key {path} is not an OpenSSH public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise CredentialsError(f"node public key {path} must be an EC key (NIST curve), not {type(key).__name__}")
    return path


__all__ = [
    "Credentials",
    "CredentialsError",
    "write_credentials",
    "write_node_key",
    "check_public_key",
    "local_runtime_tls",
    "make_ca",
    "make_server_certificate",
    "DEFAULT_HOSTS",
]
