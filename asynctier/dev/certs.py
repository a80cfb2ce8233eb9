"""Certificates to try TLS with (``asynctier dev certs --out DIR``): a CA, a server and a
client certificate it signed, as PEM files. For development and tests, not production:
the CA's key is not kept, so nothing more can be signed with it.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the certificates are valid.
VALID_DAYS = 365
#: The names the server certificate is always valid for (loopback and this machine).
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CertFiles:
    """The files :func:`write_certs` wrote."""

    ca: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path


def write_certs(out: Path, hosts: Iterable[str] = (), name: str = "asynctier dev") -> CertFiles:
    """A new CA and a server and a client certificate under ``out`` (keys mode 0600).

    The server certificate is valid for ``hosts`` plus :data:`LOCAL_NAMES` and this
    machine's host name, for servers and clients both (a process that is both, a broker);
    the client certificate is a client's only."""
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{name} CA")
    ca = _builder(ca_name, ca_name, ca_key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=0), critical=True).add_extension(
        x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                      content_commitment=False, key_encipherment=False,
                      data_encipherment=False, key_agreement=False, encipher_only=False,
                      decipher_only=False), critical=True).sign(ca_key, hashes.SHA256())
    names = [*dict.fromkeys([*hosts, *LOCAL_NAMES, socket.gethostname()])]
    files = CertFiles(out / "ca.pem", out / "server.pem", out / "server-key.pem",
                      out / "client.pem", out / "client-key.pem")
    _write(files.ca, ca.public_bytes(serialization.Encoding.PEM))
    _leaf(files.server, files.server_key, f"{name} server", names,
          [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], ca, ca_key)
    _leaf(files.client, files.client_key, f"{name} client", [],
          [ExtendedKeyUsageOID.CLIENT_AUTH], ca, ca_key)
    return files


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(subject: x509.Name, issuer: x509.Name,
             public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def _leaf(cert_path: Path, key_path: Path, common: str, names: list[str],
          usages: list[x509.ObjectIdentifier], ca: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(_name(common), ca.subject, key.public_key()).add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True).add_extension(
        x509.ExtendedKeyUsage(usages), critical=False)
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    _write(key_path, key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), secret=True)


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write(path: Path, data: bytes, secret: bool = False) -> None:
    path.write_bytes(data)
    path.chmod(0o600 if secret else 0o644)
