"""Ed25519 keys for signing bundles: generation, PEM files, fingerprints.

Keys are plain PEM files (PKCS#8 private, SubjectPublicKeyInfo public) so standard tools read
them. The private key is written with mode 0600 and never overwritten by accident.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..atomic_file import write_all
from ..digest import sha256
from ..errors import CuvilError
from ..regular_file import read_regular

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
MAX_KEY_FILE_BYTES = 64 * 1024  # a PEM key is a few hundred bytes


class KeyFileError(CuvilError):
    """A key file is missing, unreadable, or not an Ed25519 key of the expected kind."""


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_path: Path
    fingerprint: str


def raw_public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_pem(key: Ed25519PublicKey) -> bytes:
    """The form a ``.pub`` file holds (what ``load_public_key`` reads)."""
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey | bytes) -> str:
    """A short, stable key id: the first 16 bytes of SHA-256 over the raw 32-byte public key, in hex."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    raw = key if isinstance(key, bytes) else raw_public_bytes(key)
    return sha256(raw).hexdigest()[:32]


_KEY_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")  # a file name on every system, one line to print


def generate_keypair(out_dir: str | os.PathLike, name: str = "cuvil", force: bool = False) -> KeyPair:
    """Write ``NAME.key`` (PEM, 0600) and ``NAME.pub`` into ``out_dir``; refuse to overwrite unless ``force``."""
    if not _KEY_NAME.fullmatch(name):
        raise KeyFileError(f"bad key name {name[:80]!r}: letters, digits, '.', '_' and '-', not starting with '.'")
    out = Path(out_dir)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub = public_pem(key.public_key())
    priv_path, pub_path = out / f"{name}.key", out / f"{name}.pub"
    if not force:
        for p in (priv_path, pub_path):
            if p.exists():
                raise KeyFileError(f"{p} already exists (use --force to replace it)")
    write_all([(priv_path, priv, 0o600), (pub_path, pub, 0o644)])
    return KeyPair(priv_path, pub_path, fingerprint(key))


def _read(path: str | os.PathLike, what: str) -> bytes:
    """The key file's bytes, read no further than a key can be long: a FIFO, ``/dev/zero`` or a huge
    file named as a key is an error at once, never a block or an endless read."""
    try:
        data = read_regular(path, limit=MAX_KEY_FILE_BYTES)
    except OSError as e:
        raise KeyFileError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{path} is too large to be a {what}")
    return data


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    data = _read(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    data = _read(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyFileError(f"{path} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key")
    return key
