"""What a secured fleet needs before it starts: TLS certificates for the SuperLink, SuperNode keys.

- :func:`make_certificates`: a certificate authority and a SuperLink certificate signed by it, valid for
  the names and addresses the user lists (every name devices and the operator use to reach the
  SuperLink must be one of its SANs, or TLS refuses the connection).
- :func:`make_node_key`: a SuperNode's authentication key pair, EC P-384 in OpenSSH format, as Flower's
  node authentication expects; the public half is registered with ``flwr supernode register``.

Private keys are written with mode 0600 and never overwritten unless asked; the files of one set are
written together or not at all (``atomic_file.write_all``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..compiler.atomic_file import write_all
from ..compiler.errors import CuvilError
from .identity import fingerprint

_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
MAX_DAYS = 3650
PRIVATE, PUBLIC = 0o600, 0o644  # private keys are never readable by others, not even for a moment


class CredentialsError(CuvilError):
    """A SAN is not a host name or IP address, a validity is out of range, or a file would be overwritten."""


@dataclass(frozen=True)
class Certificates:
    ca_cert: Path  # give to every SuperNode (--root-certificates) and the operator's flwr config
    ca_key: Path  # keep offline: it signs new SuperLink certificates
    cert: Path  # the SuperLink's --ssl-certfile
    key: Path  # the SuperLink's --ssl-keyfile
    sans: tuple[str, ...]


def parse_san(text: str) -> x509.GeneralName:
    """An IP address, or a DNS name (letters, digits, hyphens; a leading ``*.`` wildcard allowed)."""
    text = text.strip()
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    labels = text[2:].split(".") if text.startswith("*.") else text.split(".")
    numeric = labels[-1].isdigit()  # an all-numeric last label is a mistyped address (999.1.1.1), not a name
    if not text or len(text) > 253 or numeric or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise CredentialsError(f"SAN {text[:80]!r} is neither an IP address nor a DNS name")
    return x509.DNSName(text)


def make_certificates(out_dir: str | os.PathLike, sans: Sequence[str], days: int = 365,
                      force: bool = False) -> Certificates:
    """Write ``ca.crt``/``ca.key`` and ``superlink.pem``/``superlink.key`` (SANs ``sans``) into ``out_dir``."""
    if not sans:
        raise CredentialsError("name at least one SAN: the host name or IP address the SuperLink is reached at")
    if not 1 <= days <= MAX_DAYS:
        raise CredentialsError(f"validity must be 1..{MAX_DAYS} days, got {days}")
    names = [parse_san(s) for s in sans]
    out = Path(out_dir)
    files = Certificates(out / "ca.crt", out / "ca.key", out / "superlink.pem", out / "superlink.key",
                         tuple(s.strip() for s in sans))
    _refuse_overwrite([files.ca_cert, files.ca_key, files.cert, files.key], force)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Cuvil fleet CA")])
    ca = (_builder(ca_name, ca_name, ca_key.public_key(), now, days)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, files.sans[0][:64])])
    cert = (_builder(subject, ca_name, key.public_key(), now, days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA384()))
    out.mkdir(parents=True, exist_ok=True)
    write_all([(files.ca_cert, ca.public_bytes(serialization.Encoding.PEM), PUBLIC),
               (files.cert, cert.public_bytes(serialization.Encoding.PEM), PUBLIC),
               (files.ca_key, _pkcs8(ca_key), PRIVATE), (files.key, _pkcs8(key), PRIVATE)])
    return files


def node_key_fingerprint(pub: str | os.PathLike) -> str:
    """The fingerprint in the identity the coordinator records for a device with this public key."""
    key = serialization.load_ssh_public_key(Path(pub).read_bytes())
    return fingerprint(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def make_node_key(path: str | os.PathLike, force: bool = False) -> tuple[Path, Path]:
    """Write a SuperNode key pair: ``path`` (private, OpenSSH) and ``path.pub``; return both paths."""
    priv = Path(path)
    pub = priv.with_name(priv.name + ".pub")
    _refuse_overwrite([priv, pub], force)
    key = ec.generate_private_key(ec.SECP384R1())
    priv.parent.mkdir(parents=True, exist_ok=True)
    write_all([(priv, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption()), PRIVATE),
               (pub, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
                + b"\n", PUBLIC)])
    return priv, pub


def _builder(subject: x509.Name, issuer: x509.Name, public_key, now: dt.datetime, days: int) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days)))


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _refuse_overwrite(paths: Sequence[Path], force: bool) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise CredentialsError(f"{', '.join(existing)} exist(s); pass --force to replace")
