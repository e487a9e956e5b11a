"""Signed deltas: exact rebuilds, sizes, and every hostile delta refused with a typed error."""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np
import pytest

from cuvil.compiler.bundle import apply_delta, bundle_bytes, make_delta, read_delta
from cuvil.compiler.bundle.delta_format import DELTA_MAGIC, DeltaManifest
from cuvil.compiler.bundle.format import MANIFEST_OFFSET, Header, store_manifest
from cuvil.compiler.bundle.writer import frame
from cuvil.compiler.errors import DeltaError, DeltaParentError

from .helpers import big_graph, new_key, small_graph


@pytest.fixture(scope="module")
def versions():
    """v1, and v2 as fine-tuning makes it: half the weights moved by a small update, the rest as they were."""
    key = new_key()
    g = big_graph(1 << 20, 10)
    rng = np.random.default_rng(3)
    moved = {n: (w + rng.normal(0, 1e-3, w.shape)).astype(np.float32) if i % 2 else w
             for i, (n, w) in enumerate(g.constants.items())}
    return key, bundle_bytes(g, key, version="1"), bundle_bytes(g.replace(constants=moved), key, version="2")


def _apply(delta: bytes, parent: bytes, key, **kw) -> bytes:
    return apply_delta(read_delta(delta, [key.public_key()], **{k: v for k, v in kw.items() if k == "max_bytes"}),
                       parent, [key.public_key()], **{k: v for k, v in kw.items() if k == "max_target_bytes"})


def test_a_delta_rebuilds_the_next_version_byte_for_byte_at_under_two_thirds_of_its_size(versions):
    key, v1, v2 = versions
    delta = make_delta(v1, v2, key)
    assert _apply(delta, v1, key) == v2
    ops = [p.op for p in read_delta(delta, [key.public_key()]).manifest.pieces]
    assert ops == ["copy", "xor"] * 5  # unchanged weights cost nothing, moved ones are diffs
    assert len(delta) < 0.66 * len(v2) / 2 + 2000  # half the weights moved, each diff under 2/3 of its bytes


def test_new_weights_travel_raw_and_other_dtypes_rebuild_exactly():
    key = new_key()
    g = small_graph()
    consts = {**g.constants, "i32": np.array([[5, 6], [7, 8]], np.int32), "h": np.array([0.5, 9.0], np.float16)}
    v1, v2 = bundle_bytes(g, key), bundle_bytes(g.replace(constants=consts), key, version="2")
    assert _apply(make_delta(v1, v2, key), v1, key) == v2
    assert _apply(make_delta(v2, v1, key), v2, key) == v1


def _resign(delta: bytes, key, edit) -> bytes:
    """The delta re-signed by ``key`` after ``edit(manifest dict, payloads list)``; offsets and hashes follow
    the payloads, so the result passes the signature and hash checks and reaches the applier."""
    d = read_delta(delta, [key.public_key()])
    m = d.manifest.to_json()
    payloads = [bytes(d.payload(d.manifest.head)), *(bytes(d.payload(p.payload)) for p in d.manifest.pieces)]
    edit(m, payloads)
    end = 0
    for entry, data in zip([m["head"], *m["pieces"]], payloads):
        entry.update(offset=end, length=len(data))
        end += len(data)
    m["data_sha256"] = hashlib.sha256(b"".join(payloads)).hexdigest()
    body = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    stored, flags = store_manifest(body)
    return frame(stored, end, key, flags, DELTA_MAGIC) + b"".join(payloads)


def test_a_tampered_delta_is_refused(versions):
    key, v1, v2 = versions
    delta = bytearray(make_delta(v1, v2, key))
    for at in (len(delta) - 10, MANIFEST_OFFSET + 3, 20):  # a payload, the manifest, the header
        bad = bytearray(delta)
        bad[at] ^= 1
        with pytest.raises(DeltaError):
            _apply(bytes(bad), v1, key)


def test_a_delta_signed_by_another_key_is_refused(versions):
    key, v1, v2 = versions
    with pytest.raises(DeltaError, match="not trusted"):
        read_delta(make_delta(v1, v2, new_key()), [key.public_key()])


def test_a_delta_for_another_parent_is_refused(versions):
    key, v1, v2 = versions
    delta = make_delta(v1, v2, key)
    with pytest.raises(DeltaParentError):
        _apply(delta, v2, key)
    other = bundle_bytes(big_graph(1 << 20, 10), new_key(), version="1")  # same content, another signer's bytes
    with pytest.raises(DeltaParentError):
        _apply(delta, other, key)


def test_truncated_extended_and_oversized_deltas_are_refused(versions):
    key, v1, v2 = versions
    delta = make_delta(v1, v2, key)
    for bad in (delta[:-1], delta[:100], delta[:MANIFEST_OFFSET - 1], delta + b"\0", b""):
        with pytest.raises(DeltaError):
            _apply(bad, v1, key)
    with pytest.raises(DeltaError, match="more than"):
        _apply(delta, v1, key, max_bytes=len(delta) - 1)
    with pytest.raises(DeltaError, match="more than"):
        _apply(delta, v1, key, max_target_bytes=len(v2) - 1)


def test_a_signed_delta_that_does_not_make_what_it_claims_is_refused(versions):
    key, v1, v2 = versions
    delta = make_delta(v1, v2, key)
    claims = _resign(delta, key, lambda m, p: m.update(target_sha256="0" * 64))
    with pytest.raises(DeltaError, match="SHA-256 differs"):
        _apply(claims, v1, key)

    def bomb(m, payloads):  # a raw piece that inflates far past its weight's size
        m["pieces"][1].update(op="raw", base="")
        payloads[2] = zlib.compress(bytes(64 << 20))
    with pytest.raises(DeltaError, match="inflate"):
        _apply(_resign(delta, key, bomb), v1, key)

    def swapped(m, payloads):  # the pieces of two weights exchanged
        m["pieces"][0], m["pieces"][2] = m["pieces"][2], m["pieces"][0]
        payloads[1], payloads[3] = payloads[3], payloads[1]
    with pytest.raises(DeltaError, match="in order"):
        _apply(_resign(delta, key, swapped), v1, key)


def test_a_malformed_delta_manifest_is_a_delta_error(versions):
    key, v1, v2 = versions
    delta = make_delta(v1, v2, key)
    for edit in (lambda m, p: m.update(parent="xyz"), lambda m, p: m["pieces"][0].update(op="patch"),
                 lambda m, p: m.update(extra=1), lambda m, p: m["pieces"][1].update(base="")):
        with pytest.raises(DeltaError):
            read_delta(_resign(delta, key, edit), [key.public_key()])


def test_a_bundle_is_not_a_delta_nor_a_delta_a_bundle(versions):
    key, v1, v2 = versions
    with pytest.raises(DeltaError, match="not a Cuvil delta"):
        read_delta(v1, [key.public_key()])
    from cuvil.compiler.bundle import read_bundle
    from cuvil.compiler.errors import BundleError
    with pytest.raises(BundleError, match="not a Cuvil bundle"):
        read_bundle(make_delta(v1, v2, key), [key.public_key()])
    assert Header.unpack(make_delta(v1, v2, key), 10**6, DELTA_MAGIC, "delta").magic == DELTA_MAGIC
    assert isinstance(read_delta(make_delta(v1, v2, key), [key.public_key()]).manifest, DeltaManifest)


def test_the_head_travels_as_a_manifest_diff_or_whole_and_rebuilds_either_way(versions):
    from .helpers import split

    key, v1, v2 = versions
    assert read_delta(make_delta(v1, v2, key), [key.public_key()]).manifest.head_encoding == "manifest"
    manifest, data = split(v2)
    plain = frame(manifest, len(data), key) + data  # a bundle whose manifest is stored uncompressed (flag 0)
    odd = frame(zlib.compress(manifest, 1), len(data), key, 1) + data  # stored otherwise than this writer stores
    other = bundle_bytes(small_graph(), key)  # nothing in common with v1
    for parent, target in ((v1, plain), (v1, odd), (other, v2), (v2, other)):
        assert _apply(make_delta(parent, target, key), parent, key) == target
    assert read_delta(make_delta(v1, odd, key), [key.public_key()]).manifest.head_encoding == "zlib"


def test_a_parent_whose_signed_weight_table_runs_past_its_file_is_refused(versions):
    """A validly signed head whose weights end 112 bytes after the file: a BundleError when its head is
    read (make_delta XORed the short slices and raised NumPy's ValueError)."""
    from cuvil.compiler.bundle.format import canonical_json
    from cuvil.compiler.errors import BundleError

    from .helpers import resign, split

    key, v1, v2 = versions
    manifest, _ = split(v1)
    obj = json.loads(manifest)
    obj["weights"][0]["sha256"] = "0" * 64  # not a copy of a target weight: its bytes are diffed
    short = resign(canonical_json(obj), b"", key)
    with pytest.raises(BundleError, match="does not end where the file does"):
        make_delta(short, v2, key)
