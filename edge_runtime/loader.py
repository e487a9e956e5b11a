"""Loading a bundle on a device: verify the signature against the trust store, then parse.

The file is memory-mapped read-only; weights are zero-copy views of the mapping. Keep bundles
where only the runtime writes: a file changed or truncated after loading changes (or faults) the
mapped weights, as with any memory-mapped model format.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..compiler.bundle.format import MANIFEST_OFFSET
from ..compiler.bundle.reader import Bundle, read_bundle
from ..compiler.errors import BundleError
from ..compiler.interpreter import run_reference
from ..compiler.ir.graph import Graph
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


def map_file(path: str | os.PathLike) -> mmap.mmap | bytes:
    """A read-only mapping of the whole file (``b""`` for an empty one, which mmap refuses)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < MANIFEST_OFFSET:
            return f.read(MANIFEST_OFFSET)
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def load(path: str | os.PathLike, trusted_keys: Trusted = None) -> Model:
    """Verify ``path`` against ``trusted_keys`` (default: the trust directory), then parse it.

    Raises BundleError for anything wrong with the bundle or its signature; there is no option to
    skip verification.
    """
    store = resolve_trust(trusted_keys)
    bundle = read_bundle(map_file(path), store.keys)
    return Model._from_bundle(bundle, Path(path))


def load_bytes(data: bytes, trusted_keys: Trusted = None) -> Model:
    """Like :func:`load` for a bundle already in memory (received over the network, say)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BundleError(f"expected bundle bytes, got {type(data).__name__}")
    store = resolve_trust(trusted_keys)
    return Model._from_bundle(read_bundle(bytes(data), store.keys), None)
