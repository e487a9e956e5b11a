"""Writing bundles: the same graph, metadata and key always give the same bytes.

Determinism comes from the canonical manifest (no timestamps, sorted keys), segments in the
graph's constant order at canonical offsets, zero padding, and Ed25519 (deterministic by design).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..atomic_file import atomic_write
from ..digest import sha256
from ..errors import BundleError
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.limits import check_graph
from ..ir.text import print_graph
from ..ir.verify import verify
from .format import MAGIC, MANIFEST_OFFSET, Header, Manifest, WeightEntry, align, MAX_MANIFEST_BYTES, store_manifest
from .lineage import Lineage
from .signing import raw_public_bytes
from .subbyte import pack


def _le_bytes(arr: np.ndarray) -> np.ndarray:
    """The array's little-endian bytes as a flat uint8 view (no copy on little-endian hosts)."""
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return arr.reshape(-1).view(np.uint8)


def build_manifest(graph: Graph, name: str, version: str, producer: str,
                   lineage: Lineage | None = None) -> tuple[Manifest, list[np.ndarray]]:
    """The manifest for ``graph`` and its segments' bytes, in file order. The graph must pass the checks a
    reader applies (verifier, limits at batch 1), so nothing is signed that every device would refuse."""
    check_graph(verify(graph))
    weights, segments, end = [], [], 0
    for cname, arr in graph.constants.items():
        dtype = DType.from_numpy(arr.dtype)
        raw = pack(arr, dtype) if dtype.bits < 8 else _le_bytes(arr)
        offset = align(end)
        weights.append(WeightEntry(cname, dtype, tuple(int(d) for d in arr.shape),
                                   offset, int(raw.size), sha256(raw).hexdigest()))
        segments.append(raw)
        end = offset + int(raw.size)
    manifest = Manifest(
        name=name, version=version, producer=producer, graph=print_graph(graph, data=False),
        inputs=tuple((n, str(graph.types[n])) for n in graph.inputs),
        outputs=tuple((n, str(graph.types[n])) for n in graph.outputs),
        weights=tuple(weights), lineage=lineage,
    )
    Manifest.decode(manifest.encode())  # never write a manifest a reader would refuse
    return manifest, segments


def frame(manifest: bytes, data_length: int, key: Ed25519PrivateKey, flags: int = 0, magic: bytes = MAGIC) -> bytes:
    """Header, signature and the manifest's stored bytes (as ``flags`` say), padded up to the data
    region (signs header || stored manifest); ``magic``: a delta's, for a signed delta."""
    if len(manifest) > MAX_MANIFEST_BYTES:
        raise BundleError(f"manifest is {len(manifest)} bytes, more than the {MAX_MANIFEST_BYTES} a reader accepts")
    data_offset = align(MANIFEST_OFFSET + len(manifest))
    header = Header(len(manifest), data_offset, data_offset + data_length, raw_public_bytes(key.public_key()),
                    flags=flags, magic=magic).pack()
    signature = key.sign(header + manifest)
    head = header + signature + manifest
    return head + bytes(data_offset - len(head))


def _chunks(manifest: Manifest, segments: list[np.ndarray], key: Ed25519PrivateKey) -> Iterator[bytes | np.ndarray]:
    encoded = manifest.encode()
    if len(encoded) > MAX_MANIFEST_BYTES:
        raise BundleError(f"manifest is {len(encoded)} bytes, more than the {MAX_MANIFEST_BYTES} a reader accepts")
    stored, flags = store_manifest(encoded)
    yield frame(stored, manifest.data_length, key, flags)
    pos = 0
    for entry, raw in zip(manifest.weights, segments):
        yield bytes(entry.offset - pos)
        yield raw
        pos = entry.offset + entry.length


def write_bundle(graph: Graph, out: BinaryIO, key: Ed25519PrivateKey, *, name: str, version: str,
                 producer: str, lineage: Lineage | None = None) -> Manifest:
    """Stream the bundle for ``graph`` into ``out``; return its manifest."""
    manifest, segments = build_manifest(graph, name, version, producer, lineage)
    for chunk in _chunks(manifest, segments, key):
        out.write(memoryview(chunk))
    return manifest


def bundle_bytes(graph: Graph, key: Ed25519PrivateKey, *, name: str | None = None, version: str = "0",
                 producer: str = "cuvil", lineage: Lineage | None = None) -> bytes:
    buf = io.BytesIO()
    write_bundle(graph, buf, key, name=name or graph.name, version=version, producer=producer, lineage=lineage)
    return buf.getvalue()


def save_bundle(graph: Graph, path: str | os.PathLike, key: Ed25519PrivateKey, *, name: str, version: str,
                producer: str, lineage: Lineage | None = None) -> Manifest:
    """Write atomically through a fresh ``O_EXCL`` temporary file beside ``path`` (see :mod:`..atomic_file`)."""
    with atomic_write(path) as f:
        return write_bundle(graph, f, key, name=name, version=version, producer=producer, lineage=lineage)
