"""TLS for connections that cross hosts: a small certificate authority for a lab
(``plait admin certs``), and the verification settings every client of plait uses
(the CLI, agents, a follower forwarding to its leader, TaskController calls).

``plait admin certs --out DIR --host H ...`` writes ``ca.pem`` (the authority's
certificate, which clients are given with ``--ca-file``), ``ca-key.pem``, and
``server.pem`` / ``server-key.pem``: one certificate for every control-plane replica,
valid for each host given (DNS names or IP addresses). Keys are ECDSA P-256, written
mode 0600. A production deployment uses its own PKI: plait only needs a certificate
and key per replica, and the CA file its clients trust.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from pathlib import Path

from plait.errors import ValidationError


def verify(ca_file: str | Path | None, url: str | None = None) -> ssl.SSLContext | bool:
    """What an httpx client verifies servers with: the given CA file, else the system's
    authorities (only loaded for https URLs, when ``url`` is given: loading them costs
    a tenth of a second of CPU)."""
    if ca_file:
        path = Path(ca_file)
        if not path.is_file():
            raise ValidationError("ca_file", f"{path} is not a file (the CA certificate of "
                                             "the control plane: plait admin certs writes ca.pem)")
        return ssl.create_default_context(cafile=str(path))
    return url is None or url.startswith("https:")


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def make_lab_certs(out: Path, hosts: list[str], days: int = 365) -> dict[str, Path]:
    """A CA and one server certificate for ``hosts``, under ``out``. An existing CA
    there is reused (so certificates for new hosts are trusted by existing clients)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ValidationError("host", "give at least one host name or address the "
                                      "control plane is reached at")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"{k}.pem" for k in ("ca", "ca-key", "server", "server-key")}
    now = datetime.datetime.now(datetime.UTC)
    pem = serialization.Encoding.PEM
    if paths["ca"].exists() and paths["ca-key"].exists():
        ca_cert = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
        ca_key = serialization.load_pem_private_key(paths["ca-key"].read_bytes(), None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plait lab CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=10 * days))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                False, False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        _write(paths["ca-key"], ca_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), True)
        _write(paths["ca"], ca_cert.public_bytes(pem), False)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    _write(paths["server-key"], key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), True)
    _write(paths["server"], cert.public_bytes(pem), False)
    return paths
