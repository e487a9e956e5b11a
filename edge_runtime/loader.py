"""Loading a bundle on a device: verify the signature against the trust store, then parse.

The file is read once into private memory and everything (signature, hashes, graph, weights)
works on that copy: the weights are zero-copy views of it. A write to the file after it was
verified (or a truncation) cannot reach what was verified, hence not the compiler either. A
memory mapping would not do: a file's pages change under a mapping, private or shared.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..compiler.bundle.format import MANIFEST_OFFSET, Header
from ..compiler.bundle.reader import Bundle, BundleHead, read_bundle, read_head
from ..compiler.errors import BundleError
from ..compiler.interpreter import run_reference
from ..compiler.ir.graph import Graph
from .private import open_regular, read_exactly
from .trust import TrustStore, resolve_trust

Trusted = TrustStore | Iterable[str | os.PathLike | Ed25519PublicKey] | None


@dataclass(frozen=True, eq=False)
class Model:
    """A verified model: only :func:`load` makes one, so holding one means the signature held."""

    graph: Graph
    name: str
    version: str
    producer: str
    content_hash: str
    signer: str
    path: Path | None
    size: int

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run with the reference interpreter (the native session takes over in a later layer)."""
        return run_reference(self.graph, inputs)

    @classmethod
    def _from_bundle(cls, bundle: Bundle, path: Path | None) -> Model:
        m = bundle.manifest
        return cls(bundle.graph, m.name, m.version, m.producer, bundle.content_hash, bundle.signer, path, bundle.size)


def read_file(path: str | os.PathLike) -> bytes:
    """The whole file in private memory; refuses (OSError) anything but a regular file, never blocks."""
    fd, st = open_regular(path)
    try:
        try:
            data = read_exactly(fd, st.st_size)
        except MemoryError:
            raise BundleError(f"a bundle of {st.st_size} bytes does not fit in memory") from None
    finally:
        os.close(fd)
    if len(data) != st.st_size:
        raise BundleError(f"bundle shrank while it was read ({len(data)} of {st.st_size} bytes)")
    return data


def read_file_head(path: str | os.PathLike, trusted_keys: Trusted = None) -> BundleHead:
    """The signed head of the bundle at ``path``, reading only its header and manifest (never the
    weights, never the graph parsed): for showing a bundle from any signer. ``head.trusted`` says
    whether its signer is one of ``trusted_keys``; an empty trust store trusts nobody."""
    try:
        keys = resolve_trust(trusted_keys).keys
    except BundleError:
        keys = ()
    fd, st = open_regular(path)
    try:
        first = read_exactly(fd, MANIFEST_OFFSET)
        header = Header.unpack(first, st.st_size)
        head = first + read_exactly(fd, header.manifest_length)
    finally:
        os.close(fd)
    return read_head(head, st.st_size, keys)


def load(path: str | os.PathLike, trusted_keys: Trusted = None) -> Model:
    """Verify ``path`` against ``trusted_keys`` (default: the trust directory), then parse it.

    Raises BundleError for anything wrong with the bundle or its signature; there is no option to
    skip verification.
    """
    store = resolve_trust(trusted_keys)
    bundle = read_bundle(read_file(path), store.keys)
    return Model._from_bundle(bundle, Path(path))


def load_bytes(data: bytes, trusted_keys: Trusted = None) -> Model:
    """Like :func:`load` for a bundle already in memory (received over the network, say)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BundleError(f"expected bundle bytes, got {type(data).__name__}")
    store = resolve_trust(trusted_keys)
    return Model._from_bundle(read_bundle(bytes(data), store.keys), None)
