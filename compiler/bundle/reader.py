"""Reading bundles safely: verify the signature first, then parse with every bound checked.

Only the fixed-size header is read before the signature check, and only to find the signed bytes
and the signer's key id. Everything after that runs on signed data, yet is still checked as if it
were hostile (a trusted key can sign a buggy file): every malformed input ends in a BundleError,
and a graph past the device's resource limits in a LimitError, raised while parsing, before the
work it asks for starts. Weights are read-only views of the bytes as read: of the caller's buffer
(zero-copy), or each of its own buffer where the file is read weight by weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..digest import sha256
from ..errors import BundleError, BundleLimitError, CuvilError, LimitError
from ..ir.graph import Graph
from ..ir.limits import DEFAULT_LIMITS, Limits, check_graph
from .format import HEADER, MAGIC, MANIFEST_OFFSET, SIGNATURE_OFFSET, Header, Manifest, WeightEntry, load_manifest
from .signing import SIGNATURE_SIZE, fingerprint, raw_public_bytes
from .subbyte import unpack

# What a hostile-but-signed graph text can make the IR parser and verifier raise.
_PARSE_ERRORS = (CuvilError, ValueError, KeyError, TypeError, IndexError, OverflowError, RecursionError)


@dataclass(frozen=True)
class Bundle:
    """A verified, parsed bundle. ``trusted`` is False only for :func:`read_bundle` with ``require_trust=False``."""

    graph: Graph
    manifest: Manifest
    header: Header
    content_hash: str  # SHA-256 of the manifest, which holds every segment's hash: names the content
    signer: str  # fingerprint of the signing key
    trusted: bool
    size: int


@dataclass(frozen=True)
class BundleHead:
    """What the signature covers, checked, without the weights or a parsed graph (``cuvil inspect``)."""

    manifest: Manifest
    header: Header
    content_hash: str
    signer: str
    trusted: bool
    size: int


def read_head(head: Any, size: int, trusted_keys: Iterable[Ed25519PublicKey], limits: Limits = DEFAULT_LIMITS,
              require_trust: bool = False) -> BundleHead:
    """Check the signature over ``head`` (the file's first bytes, header and manifest at least) and
    decode the manifest; any signer whose signature verifies is accepted, ``trusted`` says if it is
    (``require_trust=True``: a signer outside ``trusted_keys`` is a BundleError)."""
    view = memoryview(head).cast("B")
    header, manifest_bytes, trusted = read_signed_head(view, size, trusted_keys, require_trust=require_trust)
    # ---- everything below runs on signed bytes only ----
    header.check_layout(size)
    manifest = Manifest.decode(manifest_bytes, limits.max_nodes)
    if header.data_offset + manifest.data_length != header.file_length:
        raise BundleError("the weight table does not end where the file does")
    return BundleHead(manifest, header, manifest.content_hash, fingerprint(header.signer_key), trusted, size)


def read_bundle(buf: Any, trusted_keys: Iterable[Ed25519PublicKey], *, require_trust: bool = True,
                limits: Limits = DEFAULT_LIMITS) -> Bundle:
    """Verify and parse the bundle in ``buf`` (bytes, or any buffer that nobody writes meanwhile); its
    weights are zero-copy views of ``buf``.

    With ``require_trust=False`` a signer outside ``trusted_keys`` is accepted, but the signature
    must still verify under the key the bundle names.
    """
    view = memoryview(buf).cast("B")
    return read_bundle_parts(view, view.nbytes, lambda start, length: view[start:start + length], trusted_keys,
                             require_trust=require_trust, limits=limits)


def read_bundle_parts(head: Any, size: int, segment: Callable[[int, int], Any],
                      trusted_keys: Iterable[Ed25519PublicKey], *, require_trust: bool = True,
                      limits: Limits = DEFAULT_LIMITS) -> Bundle:
    """:func:`read_bundle` of a file of ``size`` bytes given its ``head`` (header and manifest at least)
    and ``segment(start, length)``: those bytes of the file, in memory nobody writes meanwhile, or
    fewer where the file ends early. A file reader returns each weight in a buffer of its own, so each
    can be freed on its own (the lowering drops a weight once packed) and none is copied again."""
    h = read_head(head, size, trusted_keys, limits, require_trust)
    header, manifest = h.header, h.manifest
    pad = MANIFEST_OFFSET + header.manifest_length
    _check_zero(_exactly(segment, pad, header.data_offset - pad), pad, "manifest padding")
    arrays = _segments(segment, header.data_offset, manifest.weights)
    graph = _graph(manifest, arrays, limits)
    return Bundle(graph, manifest, header, h.content_hash, h.signer, h.trusted, size)


def read_signed_head(view: Any, size: int, trusted_keys: Iterable[Ed25519PublicKey],
                     require_trust: bool = True, magic: bytes = MAGIC,
                     what: str = "bundle") -> tuple[Header, bytes, bool]:
    """Header, manifest bytes (inflated, once the signature holds) and whether the signer is trusted:
    what the signature covers, checked.

    ``view`` needs to hold only the header and manifest (``cuvil inspect`` reads no more of an
    untrusted bundle); ``size`` is the whole file's.
    """
    header = Header.unpack(view, size, magic, what)
    if MANIFEST_OFFSET + header.manifest_length > len(view):
        raise BundleError(f"{what} is truncated inside its manifest")
    manifest_bytes = bytes(view[MANIFEST_OFFSET:MANIFEST_OFFSET + header.manifest_length])
    trusted = _verify_signature(view, header, manifest_bytes, trusted_keys, require_trust)
    return header, load_manifest(manifest_bytes, header.flags), trusted


def _verify_signature(view: memoryview, header: Header, manifest_bytes: bytes,
                      trusted_keys: Iterable[Ed25519PublicKey], require_trust: bool) -> bool:
    by_raw = {raw_public_bytes(k): k for k in trusted_keys}
    key = by_raw.get(header.signer_key)
    if key is None:
        if require_trust:
            known = ", ".join(fingerprint(raw) for raw in by_raw) or "none"
            raise BundleError(f"bundle is signed by key {fingerprint(header.signer_key)}, which is not trusted "
                              f"(trusted: {known})")
        try:
            key = Ed25519PublicKey.from_public_bytes(header.signer_key)
        except ValueError:
            raise BundleError("bundle names an invalid signing key") from None
    signature = bytes(view[SIGNATURE_OFFSET:SIGNATURE_OFFSET + SIGNATURE_SIZE])
    try:
        key.verify(signature, bytes(view[:HEADER.size]) + manifest_bytes)
    except InvalidSignature:
        raise BundleError("signature does not verify: the bundle was modified after signing") from None
    return header.signer_key in by_raw


def _exactly(segment: Callable[[int, int], Any], start: int, length: int) -> memoryview:
    got = memoryview(segment(start, length)).cast("B")
    if got.nbytes != length:
        raise BundleError(f"bundle shrank while it was read (bytes {start}..{start + length})")
    return got


def _check_zero(part: memoryview, start: int, what: str) -> None:
    if any(part):
        raise BundleError(f"{what} at bytes {start}..{start + part.nbytes} is not zero")


def _segments(segment: Callable[[int, int], Any], data_offset: int,
              weights: tuple[WeightEntry, ...]) -> dict[str, np.ndarray]:
    """Hash-check every segment and padding; return read-only arrays over the segments as read."""
    arrays: dict[str, np.ndarray] = {}
    pos = data_offset
    for w in weights:
        start = data_offset + w.offset
        if start > pos:
            _check_zero(_exactly(segment, pos, start - pos), pos, f"padding before weight {w.name!r}")
        part = _exactly(segment, start, w.length)
        if sha256(part).hexdigest() != w.sha256:
            raise BundleError(f"weight {w.name!r} does not match its SHA-256: the bundle was modified")
        dtype = w.dtype.numpy.newbyteorder("<")
        if w.length == 0:
            arr = np.empty(w.shape, dtype=w.dtype.numpy)
        elif w.dtype.bits < 8:  # packed: the one other case that copies
            arr = unpack(np.frombuffer(part, np.uint8), w.dtype, w.shape)
        else:
            arr = np.frombuffer(part, dtype=dtype, count=math.prod(w.shape)).reshape(w.shape)
            if not dtype.isnative:  # big-endian host: the one case that copies
                arr = arr.astype(w.dtype.numpy)
        arr.flags.writeable = False
        arrays[w.name] = arr
        pos = start + w.length
    return arrays


def _graph(manifest: Manifest, arrays: dict[str, np.ndarray], limits: Limits) -> Graph:
    from ..ir.text import parse_graph, print_graph  # the op table: imported when a graph is parsed, not for a head
    from ..ir.verify import verify

    try:
        graph = check_graph(verify(parse_graph(manifest.graph, constants=arrays, limits=limits)), 1, limits)
        canonical = print_graph(graph, data=False)
    except LimitError as e:
        raise BundleLimitError(str(e)) from None
    except MemoryError:
        raise BundleError(f"the graph ({len(manifest.graph)} characters) does not fit in this device's memory") from None
    except _PARSE_ERRORS as e:
        raise BundleError(f"bad graph in manifest: {_first_line(e)}") from None
    if canonical != manifest.graph:
        raise BundleError("graph text is not in canonical form")
    if list(graph.constants) != list(arrays):
        raise BundleError("the weight table does not list exactly the graph's constants, in order")
    for what, names, listed in (("inputs", graph.inputs, manifest.inputs), ("outputs", graph.outputs, manifest.outputs)):
        if tuple((n, str(graph.types[n])) for n in names) != listed:
            raise BundleError(f"manifest {what} do not match the graph")
    return graph


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0][:300] if text else type(e).__name__)
