"""The device's trust store: the public keys whose signatures it accepts.

Keys come from explicit files (``--trust FILE``) or, when none are given, from the trust
directory. This module is the one place that reads ``CUVIL_TRUST_DIR`` (and ``XDG_CONFIG_HOME``
for the default, ``~/.config/cuvil/trusted``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..compiler.bundle.signing import KeyFileError, fingerprint, load_public_key
from ..compiler.errors import BundleError

KEY_SUFFIXES = (".pub", ".pem")


def default_trust_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$CUVIL_TRUST_DIR``, else ``${XDG_CONFIG_HOME:-~/.config}/cuvil/trusted``."""
    env = os.environ if environ is None else environ
    if env.get("CUVIL_TRUST_DIR"):
        return Path(env["CUVIL_TRUST_DIR"]).expanduser()
    config = env.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(config) / "cuvil" / "trusted"


@dataclass(frozen=True)
class TrustStore:
    """Trusted Ed25519 public keys, each with where it came from (for messages)."""

    keys: tuple[Ed25519PublicKey, ...]
    sources: tuple[str, ...]

    @property
    def fingerprints(self) -> tuple[str, ...]:
        return tuple(fingerprint(k) for k in self.keys)

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike]) -> TrustStore:
        paths = [Path(p) for p in paths]
        return cls(tuple(load_public_key(p) for p in paths), tuple(str(p) for p in paths))

    @classmethod
    def from_dir(cls, directory: str | os.PathLike | None = None) -> TrustStore:
        """Every ``*.pub`` / ``*.pem`` file in the directory; a missing directory trusts nothing. Anything so
        named but a directory is read as a key, so a FIFO or device there is an error, not skipped."""
        directory = default_trust_dir() if directory is None else Path(directory)
        if not directory.is_dir():
            return cls((), ())
        return cls.from_files(sorted(p for p in directory.iterdir() if p.suffix in KEY_SUFFIXES and not p.is_dir()))


def resolve_trust(trusted: TrustStore | Iterable[str | os.PathLike | Ed25519PublicKey] | None = None) -> TrustStore:
    """Explicit keys or files replace the trust directory; ``None`` means the trust directory.

    An empty result is an error: there is no way to load a bundle without a key to verify it.
    """
    if trusted is None:
        store = TrustStore.from_dir()
    elif isinstance(trusted, TrustStore):
        store = trusted
    else:
        keys, sources = [], []
        for item in trusted:
            if isinstance(item, Ed25519PublicKey):
                keys.append(item)
                sources.append(f"key {fingerprint(item)}")
            else:
                keys.append(load_public_key(item))
                sources.append(str(item))
        store = TrustStore(tuple(keys), tuple(sources))
    if not store.keys:
        if trusted is None:
            raise BundleError(f"no trusted keys in {default_trust_dir()}: pass --trust FILE or add public keys "
                              "there ($CUVIL_TRUST_DIR names another directory)")
        raise BundleError("no trusted keys were given: pass at least one public key")
    return store


def check_trust_files(paths: Iterable[str | os.PathLike]) -> TrustStore:
    """The keys a device will trust, read as its trust store reads them, before any is copied to it: each a
    regular file, bounded, holding an Ed25519 public key (a private key, a bundle, a FIFO or ``/dev/zero``
    is refused here, not copied and met at the first round); each named as :meth:`TrustStore.from_dir` reads
    it; and no two different keys of one file name, since the device keeps each by its name and a second
    ``cuvil.pub`` would silently replace the first."""
    store = TrustStore.from_files(paths)
    by_name: dict[str, str] = {}
    for source, fp in zip(store.sources, store.fingerprints):
        name = Path(source).name
        if Path(name).suffix not in KEY_SUFFIXES:
            raise KeyFileError(f"{source}: a trusted key's file name must end in {' or '.join(KEY_SUFFIXES)} "
                               "(the device reads no other)")
        if by_name.setdefault(name, fp) != fp:
            raise KeyFileError(f"two different trusted keys are named {name}: rename one (the device keeps keys "
                               "by file name)")
    return store
