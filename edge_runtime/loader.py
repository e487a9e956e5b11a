"""Loading a bundle on a device: verify the signature against the trust store, then parse.

The file is read once into private memory and everything (signature, hashes, graph, weights)
works on that copy: the weights are zero-copy views of it. A write to the file after it was
verified (or a truncation) cannot reach what was verified, hence not the compiler either. A
memory mapping would not do: a file's pages change under a mapping, private or shared.

``load(..., lazy=True)`` checks only the signed head (header and manifest, which names every
weight by its SHA-256) and reads the rest when ``Model.graph`` is first used, checked the same
way and refused unless its content hash is the one verified at load: a device whose compile
cache holds the model (keyed by that hash) then never reads, hashes or holds the weights. A device
loads the bundles it holds this way (``coordinator/device.py``); what it needs before compiling,
the inputs' types, comes from the signed manifest (:meth:`Model.input_types`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..compiler.bundle.format import MANIFEST_OFFSET, Header
from ..compiler.bundle.reader import Bundle, BundleHead, read_bundle, read_bundle_parts, read_head
from ..compiler.errors import BundleError, LimitError, ParseError
from ..compiler.ir.graph import Graph
from ..compiler.ir.types import TensorType
from ..compiler.regular_file import open_regular, read_at, read_exactly
from .trust import TrustStore, resolve_trust

Trusted = TrustStore | Iterable[str | os.PathLike | Ed25519PublicKey] | None


@dataclass(frozen=True, eq=False)
class Model:
    """A verified model: only :func:`load` makes one, so holding one means the signature held
    (of a lazily loaded one: over its head; its weights are checked when ``graph`` reads them)."""

    name: str
    version: str
    producer: str
    content_hash: str
    signer: str
    path: Path | None
    size: int
    inputs: tuple[tuple[str, str], ...] = ()  # (name, type text) as the signed manifest gives them
    _graph: Graph | None = field(default=None, repr=False)
    _keys: tuple[Ed25519PublicKey, ...] = field(default=(), repr=False)

    @functools.cached_property
    def graph(self) -> Graph:
        """The verified graph; a lazily loaded model reads and checks its file now (BundleError when
        the file no longer holds the bundle that was verified)."""
        return self.graph_once()

    def graph_once(self) -> Graph:
        """The graph for a caller that uses it once: a lazily loaded model that has not read it yet
        reads it without keeping it (a cold compile frees the weights before LLVM runs)."""
        if self._graph is not None or "graph" in vars(self):
            return self._graph or vars(self)["graph"]
        bundle = read_bundle_file(self.path, self._keys)
        if bundle.content_hash != self.content_hash:
            raise BundleError(f"{self.path.name} changed after it was loaded: it holds another bundle now")
        return bundle.graph

    def input_types(self) -> dict[str, TensorType]:
        """Each input's type, from the signed manifest: a lazily loaded model need not read its weights
        to say what it takes."""
        from ..compiler.ir.text import parse_type  # the op table: not imported for a warm start's head

        try:
            return {name: parse_type(text) for name, text in self.inputs}
        except (ParseError, LimitError) as e:  # a rank or dimension past the limits is a bad bundle too
            raise BundleError(f"bad input type in the manifest: {e}") from None

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run with the reference interpreter (the native session takes over in a later layer)."""
        from ..compiler.interpreter import run_reference

        return run_reference(self.graph, inputs)

    @classmethod
    def _from_bundle(cls, bundle: Bundle, path: Path | None) -> Model:
        m = bundle.manifest
        return cls(m.name, m.version, m.producer, bundle.content_hash, bundle.signer, path, bundle.size, m.inputs,
                   bundle.graph)


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
    return _head(path, keys, require_trust=False)


def _head(path: str | os.PathLike, keys: Iterable[Ed25519PublicKey], require_trust: bool) -> BundleHead:
    fd, st = open_regular(path)
    try:
        head = _head_bytes(fd, st.st_size)
    finally:
        os.close(fd)
    return read_head(head, st.st_size, keys, require_trust=require_trust)


def _head_bytes(fd: int, size: int) -> bytes:
    """The header and the manifest, as the header sizes it (``size``: the file's at open)."""
    first = read_exactly(fd, MANIFEST_OFFSET)
    if len(first) < min(size, MANIFEST_OFFSET):
        raise BundleError(f"bundle shrank while it was read ({len(first)} of {size} bytes)")
    return first + read_exactly(fd, Header.unpack(first, size).manifest_length)


def read_bundle_file(path: str | os.PathLike, keys: Iterable[Ed25519PublicKey]) -> Bundle:
    """The verified bundle at ``path``, each weight read into private memory of its own: no buffer of
    the whole file, so the lowering frees each weight once packed and nothing copies them again."""
    fd, st = open_regular(path)
    try:
        return read_bundle_parts(_head_bytes(fd, st.st_size), st.st_size, lambda start, n: read_at(fd, start, n), keys)
    except MemoryError:
        raise BundleError(f"a bundle of {st.st_size} bytes does not fit in memory") from None
    finally:
        os.close(fd)


def load(path: str | os.PathLike, trusted_keys: Trusted = None, lazy: bool = False) -> Model:
    """Verify ``path`` against ``trusted_keys`` (default: the trust directory), then parse it.

    Raises BundleError for anything wrong with the bundle or its signature; there is no option to
    skip verification. ``lazy=True``: verify the signed head now, the weights and graph when
    ``Model.graph`` is first used (then a damaged or replaced file raises BundleError there).
    """
    store = resolve_trust(trusted_keys)
    if not lazy:
        return Model._from_bundle(read_bundle_file(path, store.keys), Path(path))
    head = _head(path, store.keys, require_trust=True)
    m = head.manifest
    return Model(m.name, m.version, m.producer, head.content_hash, head.signer, Path(path), head.size, m.inputs,
                 _keys=tuple(store.keys))


def load_bytes(data: bytes, trusted_keys: Trusted = None) -> Model:
    """Like :func:`load` for a bundle already in memory (received over the network, say)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BundleError(f"expected bundle bytes, got {type(data).__name__}")
    store = resolve_trust(trusted_keys)
    return Model._from_bundle(read_bundle(bytes(data), store.keys), None)
