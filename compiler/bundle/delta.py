"""Signed updates: a delta that turns the exact bytes of one version's bundle into the next one's.

:func:`make_delta` (the coordinator, holding both versions) writes it, signed like a bundle;
:func:`read_delta` checks the signature against the trusted keys, the layout and the payloads'
SHA-256 before anything is inflated; :func:`apply_delta` then checks that it was given the exact
parent the delta names, rebuilds the target bundle into a buffer of the signed, bounded length,
and checks the result's SHA-256 against the signed one (the target's own signature and segment
hashes are checked again when it is loaded). Any failure is a :class:`DeltaError`; nothing is
returned half made. Layout: :mod:`.delta_format`; see docs/bundle-format.md.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..digest import sha256
from ..errors import BundleError, DeltaError, DeltaParentError
from .delta_format import DELTA_MAGIC, DeltaManifest, Payload, Piece
from .format import DEFLATE, HEADER, MANIFEST_OFFSET, Header, WeightEntry, store_manifest
from .reader import BundleHead, read_head, read_signed_head
from .signing import fingerprint
from .writer import frame

DEFAULT_MAX_BYTES = 2 << 30  # the largest delta, and the largest bundle one makes, a reader accepts by default
LEVEL = 6  # zlib level: 9 is 3-4x slower to make (fine-tuned mantissas) for under 1% smaller deltas


@dataclass(frozen=True)
class Delta:
    """A delta whose signature, layout and payload hashes were checked (only :func:`read_delta` makes one)."""

    manifest: DeltaManifest
    header: Header
    signer: str
    data: memoryview

    def payload(self, p: Payload) -> memoryview:
        start = self.header.data_offset + p.offset
        return self.data[start:start + p.length]


# making ---------------------------------------------------------------------------------------------
def make_delta(parent: bytes, target: bytes, key: Ed25519PrivateKey) -> bytes:
    """The signed delta from bundle ``parent`` to bundle ``target`` (both whole files, signatures valid)."""
    ph, th = read_head(parent, len(parent), ()), read_head(target, len(target), ())
    old = {w.name: w for w in ph.manifest.weights}
    same = {w.sha256: w for w in ph.manifest.weights}
    encoding, head = _encode_head(target, th, ph)
    payloads: list[bytes] = [head]
    pieces: list[tuple[str, str, str]] = []
    for w in th.manifest.weights:
        seg = _segment(target, th, w)
        if w.sha256 in same and same[w.sha256].length == w.length:
            pieces.append((w.name, "copy", same[w.sha256].name))
            payloads.append(b"")
            continue
        op, base, stored = "raw", "", zlib.compress(seg, LEVEL)
        b = old.get(w.name)
        if b is not None and b.length == w.length:
            xor = np.bitwise_xor(np.frombuffer(seg, np.uint8), np.frombuffer(_segment(parent, ph, b), np.uint8))
            diff = zlib.compress(_shuffle(xor, w.dtype.itemsize), LEVEL)
            if len(diff) < len(stored):
                op, base, stored = "xor", b.name, diff
        pieces.append((w.name, op, base))
        payloads.append(stored)
    offsets = np.cumsum([0, *map(len, payloads)]).tolist()
    listed = [Payload(int(offsets[i]), len(p)) for i, p in enumerate(payloads)]
    data = b"".join(payloads)
    manifest = DeltaManifest(th.manifest.name, th.manifest.version, ph.content_hash,
                             sha256(parent).hexdigest(), len(parent), th.content_hash,
                             sha256(target).hexdigest(), len(target), listed[0], encoding[1],
                             tuple(Piece(n, op, base, p) for (n, op, base), p in zip(pieces, listed[1:])),
                             sha256(data).hexdigest(), encoding[0])
    stored_manifest, flags = store_manifest(manifest.encode())
    out = frame(stored_manifest, manifest.data_length, key, flags, DELTA_MAGIC) + data
    read_delta(out, [key.public_key()])  # never write a delta a reader would refuse
    return out


# reading and applying -------------------------------------------------------------------------------
def read_delta(buf: Any, trusted_keys: Iterable[Ed25519PublicKey], max_bytes: int = DEFAULT_MAX_BYTES) -> Delta:
    """Verify a delta's signature against ``trusted_keys``, its layout and its payloads' hash."""
    view = memoryview(buf).cast("B")
    if view.nbytes > max_bytes:
        raise DeltaError(f"the delta is {view.nbytes} bytes, more than this device's {max_bytes}")
    try:
        header, manifest_bytes, _ = read_signed_head(view, view.nbytes, trusted_keys, True, DELTA_MAGIC, "delta")
        header.check_layout(view.nbytes)
        manifest = DeltaManifest.decode(manifest_bytes)
    except DeltaError:
        raise
    except BundleError as e:
        raise DeltaError(f"delta refused: {e}") from None
    if header.data_offset + manifest.data_length != header.file_length:
        raise DeltaError("the delta's payloads do not end where the file does")
    if any(view[MANIFEST_OFFSET + header.manifest_length:header.data_offset]):
        raise DeltaError("the delta's manifest padding is not zero")
    if sha256(view[header.data_offset:]).hexdigest() != manifest.data_sha256:
        raise DeltaError("the delta's payloads do not match their SHA-256: the delta was modified")
    return Delta(manifest, header, fingerprint(header.signer_key), view)


def apply_delta(delta: Delta, parent: Any, trusted_keys: Iterable[Ed25519PublicKey],
                max_target_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bundle ``delta`` makes from ``parent`` (the exact bytes it names), its SHA-256 checked."""
    m, trusted_keys = delta.manifest, list(trusted_keys)
    parent = memoryview(parent).cast("B")
    if parent.nbytes != m.parent_length or sha256(parent).hexdigest() != m.parent_sha256:
        raise DeltaParentError(f"the delta applies to version {m.parent[:12]}, not to the bundle given")
    if m.target_length > max_target_bytes:
        raise DeltaError(f"the delta makes a bundle of {m.target_length} bytes, more than this device's "
                         f"{max_target_bytes}")
    try:
        ph = read_head(parent, parent.nbytes, ())
        head = _decode_head(delta, ph)
        th = read_head(head, m.target_length, trusted_keys)
    except DeltaError:
        raise
    except BundleError as e:
        raise DeltaError(f"the delta's versions do not verify: {e}") from None
    if not th.trusted:
        raise DeltaError(f"the version the delta makes is signed by key {th.signer}, which is not trusted")
    if th.content_hash != m.target or ph.content_hash != m.parent:
        raise DeltaError("the delta's versions are not the ones its manifest names")
    if len(head) != MANIFEST_OFFSET + th.header.manifest_length or \
            th.header.data_offset + th.manifest.data_length != m.target_length:
        raise DeltaError("the delta's head does not describe a bundle of the length it names")
    if tuple(p.name for p in m.pieces) != tuple(w.name for w in th.manifest.weights):
        raise DeltaError("the delta's pieces do not list the target's weights, in order")
    old = {w.name: w for w in ph.manifest.weights}
    out = bytearray(m.target_length)
    out[:len(head)] = head
    for piece, w in zip(m.pieces, th.manifest.weights):
        start = th.header.data_offset + w.offset
        out[start:start + w.length] = _make_segment(delta, piece, w, old, parent, ph)
    if sha256(out).hexdigest() != m.target_sha256:
        raise DeltaError(f"the delta does not make version {m.target[:12]}: the result's SHA-256 differs")
    return bytes(out)


def _encode_head(target: Any, th: BundleHead, ph: BundleHead) -> tuple[tuple[str, int], bytes]:
    """((encoding, inflated size), payload) of the target's head, the smaller of: its manifest deflated
    against the parent's (only where storing it as the writer does gives back the signed bytes), the
    head as it is, deflated."""
    stored = bytes(target[MANIFEST_OFFSET:MANIFEST_OFFSET + th.header.manifest_length])
    head = bytes(target[:MANIFEST_OFFSET]) + stored
    best = (("zlib", len(head)), zlib.compress(head, LEVEL))
    manifest = th.manifest.encode()
    if _stored(manifest, th.header.flags) == stored:
        body = bytes(target[:MANIFEST_OFFSET]) + manifest
        c = zlib.compressobj(LEVEL, zdict=ph.manifest.encode())
        diff = c.compress(body) + c.flush()
        if len(diff) < len(best[1]):
            best = (("manifest", len(body)), diff)
    return best


def _decode_head(delta: Delta, ph: BundleHead) -> bytes:
    m = delta.manifest
    if m.head_encoding == "zlib":
        return _inflate(delta.payload(m.head), m.head_size, "head")
    body = _inflate(delta.payload(m.head), m.head_size, "head", zdict=ph.manifest.encode())
    flags = HEADER.unpack_from(body)[2] if len(body) >= MANIFEST_OFFSET else 0  # checked with the signature next
    return body[:MANIFEST_OFFSET] + _stored(body[MANIFEST_OFFSET:], flags)


def _stored(manifest: bytes, flags: int) -> bytes:
    return store_manifest(manifest)[0] if flags & DEFLATE else manifest


def _make_segment(delta: Delta, piece: Piece, w: WeightEntry, old: dict[str, WeightEntry], parent: memoryview,
                  ph: BundleHead) -> Any:
    if piece.op == "raw":
        return _inflate(delta.payload(piece.payload), w.length, f"weight {w.name!r}")
    base = old.get(piece.base)
    if base is None or base.length != w.length:
        raise DeltaError(f"the delta's weight {w.name!r} reads parent weight {piece.base[:80]!r}, which the parent "
                         "does not hold at that size")
    seg = _segment(parent, ph, base)
    if piece.op == "copy":
        return seg
    diff = _inflate(delta.payload(piece.payload), w.length, f"weight {w.name!r}")
    return np.bitwise_xor(_unshuffle(diff, w.dtype.itemsize), np.frombuffer(seg, np.uint8)).tobytes()


def _segment(bundle: Any, head: BundleHead, w: WeightEntry) -> memoryview:
    start = head.header.data_offset + w.offset
    return memoryview(bundle).cast("B")[start:start + w.length]


def _shuffle(raw: np.ndarray, itemsize: int) -> bytes:
    """Byte-planes: every element's first byte, then every second byte, ... (compresses like columns)."""
    return raw.reshape(-1, itemsize).T.tobytes()


def _unshuffle(data: bytes, itemsize: int) -> np.ndarray:
    return np.frombuffer(data, np.uint8).reshape(itemsize, -1).T.reshape(-1)


def _inflate(stored: memoryview, size: int, what: str, zdict: bytes = b"") -> bytes:
    """Exactly ``size`` bytes from a zlib stream; inflating stops there (a bomb costs no more)."""
    inflate = zlib.decompressobj(zdict=zdict) if zdict else zlib.decompressobj()
    try:
        out = inflate.decompress(stored, size or 1)  # max_length 0 would mean no limit
        if len(out) == size and not inflate.eof:  # stopped at the limit: the stream must end right there
            out += inflate.decompress(inflate.unconsumed_tail, 1)
    except zlib.error:
        raise DeltaError(f"the delta's {what} is corrupt") from None
    if len(out) != size or inflate.unconsumed_tail or not inflate.eof or inflate.unused_data:
        raise DeltaError(f"the delta's {what} does not inflate to its {size} bytes")
    return out
