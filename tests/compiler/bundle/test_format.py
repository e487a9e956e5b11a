"""Round trip, determinism, layout and tampering tests for the `.cuvil` format."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib

import numpy as np
import pytest

from cuvil.compiler import print_graph
from cuvil.compiler import atomic_file
from cuvil.compiler.bundle import ALIGN, MAGIC, bundle_bytes, read_bundle, save_bundle
from cuvil.compiler.bundle.reader import read_bundle_parts
from cuvil.compiler.bundle.format import (Header, HEADER, MANIFEST_OFFSET, MAX_MANIFEST_BYTES, canonical_json, is_sha256_hex,
                                         load_manifest)
from cuvil.compiler.errors import BundleError

from .helpers import big_graph, new_key, resign, small_graph, split
from cuvil.compiler.bundle import frame


@pytest.fixture(scope="module")
def key():
    return new_key()


@pytest.fixture(scope="module")
def graph():
    return small_graph()


@pytest.fixture(scope="module")
def data(graph, key):
    return bundle_bytes(graph, key, name="small-model", version="1.2")


def refused(data: bytes, key, match: str | None = None) -> BundleError:
    with pytest.raises(BundleError, match=match) as info:
        read_bundle(data, [key.public_key()])
    message = str(info.value)
    assert message and "\n" not in message
    return info.value


def test_round_trip_is_bit_exact(graph, key, data):
    bundle = read_bundle(data, [key.public_key()])
    assert bundle.graph == graph
    assert print_graph(bundle.graph) == print_graph(graph)  # data section included: bytes identical
    for name, arr in graph.constants.items():
        got = bundle.graph.constants[name]
        assert got.dtype == arr.dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes()
        assert not got.flags.writeable
    m = bundle.manifest
    assert (m.name, m.version, m.producer) == ("small-model", "1.2", "cuvil")
    assert bundle.trusted and bundle.size == len(data)
    assert bundle.content_hash == hashlib.sha256(split(data)[0]).hexdigest()


def test_weights_are_zero_copy_views_of_the_buffer(key, data):
    buf = bytearray(data)
    bundle = read_bundle(memoryview(buf).toreadonly(), [key.public_key()])
    w = bundle.graph.constants["w"]
    buf[bundle.header.data_offset + bundle.manifest.weights[0].offset] ^= 0xFF  # visible through the view
    assert w.tobytes() != small_graph().constants["w"].tobytes()


def test_same_model_and_key_give_the_same_bytes(graph, key, data, tmp_path):
    assert bundle_bytes(small_graph(), key, name="small-model", version="1.2") == data
    paths = [tmp_path / "a.cuvil", tmp_path / "b.cuvil"]
    for p in paths:
        save_bundle(graph, p, key, name="small-model", version="1.2", producer="cuvil")
    assert paths[0].read_bytes() == paths[1].read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.cuvil", "b.cuvil"]  # no temp files left


def test_save_never_writes_through_a_planted_symlink(graph, key, data, tmp_path, monkeypatch):
    """The temporary file is new (O_EXCL, O_NOFOLLOW): a link planted at its name is not followed,
    even when the random name is guessed (forced here), and the bundle still lands where it should."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    names, real = iter(["guessed", "guessed", "fresh"]), atomic_file._token
    monkeypatch.setattr(atomic_file, "_token", lambda: next(names, None) or real())
    (out / ".m.cuvil.guessed.tmp").symlink_to(victim)
    save_bundle(graph, out / "m.cuvil", key, name="small-model", version="1.2", producer="cuvil")
    assert victim.read_bytes() == b"precious" and (out / "m.cuvil").read_bytes() == data
    assert (out / ".m.cuvil.guessed.tmp").is_symlink() and not (out / ".m.cuvil.fresh.tmp").exists()
    old_predictable = out / f".n.cuvil.{os.getpid()}.tmp"  # the name the writer used to pick
    old_predictable.symlink_to(victim)
    save_bundle(graph, out / "n.cuvil", key, name="small-model", version="1.2", producer="cuvil")
    assert victim.read_bytes() == b"precious" and (out / "n.cuvil").read_bytes() == data


def test_other_key_or_metadata_change_the_bytes(graph, key, data):
    assert bundle_bytes(graph, new_key(), name="small-model", version="1.2") != data
    assert bundle_bytes(graph, key, name="small-model", version="1.3") != data


def test_layout(graph, key, data):
    magic, version, flags, mlen, data_offset, file_length, signer = HEADER.unpack_from(data, 0)
    assert magic == MAGIC and version == 1 and flags == 1  # DEFLATE: the manifest is zlib-compressed
    assert data_offset % ALIGN == 0 and data_offset >= MANIFEST_OFFSET + mlen and file_length == len(data)
    text = zlib.decompress(data[MANIFEST_OFFSET:MANIFEST_OFFSET + mlen])
    manifest = json.loads(text)
    assert canonical_json(manifest) == text
    assert [w["name"] for w in manifest["weights"]] == list(graph.constants)
    for w in manifest["weights"]:
        start = data_offset + w["offset"]
        assert start % ALIGN == 0
        assert hashlib.sha256(data[start:start + w["length"]]).hexdigest() == w["sha256"]
    assert manifest["inputs"] == [{"name": "x", "type": "f32[N,8]"}]


def test_every_single_byte_flip_is_refused(data, key):
    assert len(data) < 4096
    for i in range(len(data)):
        for mask in (0x01, 0xFF):
            bad = bytearray(data)
            bad[i] ^= mask
            with pytest.raises(BundleError):
                read_bundle(bytes(bad), [key.public_key()])


def test_every_truncation_and_extensions_are_refused(data, key):
    for n in range(len(data)):
        with pytest.raises(BundleError):
            read_bundle(data[:n], [key.public_key()])
    for tail in (b"\0", b"x", bytes(64), data):
        refused(data + tail, key, "trailing")


def test_wrong_key_is_refused(graph, data, key):
    other = new_key()
    err = refused(data, other, "not trusted")
    assert "trusted:" in str(err)
    # A bundle signed by another key, presented with the signer's key swapped in, fails the signature.
    forged = bytearray(bundle_bytes(graph, other))
    forged[40:72] = HEADER.unpack_from(data, 0)[6]
    refused(bytes(forged), key, "signature")


def test_untrusted_signer_can_be_read_for_inspection_only(data, key):
    bundle = read_bundle(data, [], require_trust=False)
    assert not bundle.trusted
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(BundleError):
        read_bundle(bytes(bad), [], require_trust=False)


def test_oversized_manifest_length_is_refused_before_reading_it(data, key):
    bad = bytearray(data)
    struct.pack_into("<Q", bad, 16, MAX_MANIFEST_BYTES + 1)
    refused(bytes(bad), key, "manifest length")


def test_nonzero_padding_is_refused(graph, key):
    for version in ("1", "1.2", "1.23"):  # one of them leaves manifest padding to flip
        data = bundle_bytes(graph, key, name="small-model", version=version)
        _, _, _, mlen, data_offset, _, _ = HEADER.unpack_from(data, 0)
        if data_offset > MANIFEST_OFFSET + mlen:
            break
    assert data_offset > MANIFEST_OFFSET + mlen
    bad = bytearray(data)
    bad[data_offset - 1] = 1
    refused(bytes(bad), key, "padding")


def test_bundle_size_is_close_to_the_raw_weight_bytes(key):
    graph = big_graph()
    size = len(bundle_bytes(graph, key))
    assert graph.weight_bytes < size <= graph.weight_bytes * 1.01 + 64 * 1024


def test_write_refuses_what_a_reader_would_refuse(key):
    from cuvil.compiler.errors import CuvilError

    with pytest.raises(CuvilError):
        bundle_bytes(small_graph(), key, name="bad\x1bname")


def test_big_bundle_round_trip(key):
    graph = big_graph(1 << 20, 7)
    assert read_bundle(bundle_bytes(graph, key), [key.public_key()]).graph == graph


def test_resign_helper_reproduces_the_writer(data, key):
    assert resign(*split(data), key) == data


def test_uncompressed_manifest_still_reads(graph, data, key):
    """Flag 0: the manifest's JSON as it is (bundles written before DEFLATE)."""
    manifest, weights = split(data)
    plain = frame(manifest, len(weights), key) + weights
    assert len(plain) > len(data) and read_bundle(plain, [key.public_key()]).graph == graph


@pytest.mark.parametrize("stored, reason", [
    (b"not zlib at all", "corrupt"),
    (zlib.compress(b"{}" * 100)[:-5], "truncated"),
    (zlib.compress(b"{}") + b"x", "trailing"),
])
def test_bad_compressed_manifest_is_refused(data, key, stored, reason):
    _, weights = split(data)
    refused(frame(stored, len(weights), key, 1) + weights, key, reason)


def test_inflating_stops_at_the_manifest_limit():
    bomb = zlib.compress(bytes(MAX_MANIFEST_BYTES + 1), 9)
    assert len(bomb) < 100_000
    with pytest.raises(BundleError, match="inflates to more than"):
        load_manifest(bomb, 1)


def test_sub_byte_weights_are_packed_and_come_back_the_same(key):
    """int4/uint2/float4 weights take half (a quarter) of a byte each in the bundle; bf16 and
    float8 keep their bytes; all come back equal, bit for bit."""
    import ml_dtypes
    import numpy as np

    from cuvil.compiler import DType, Graph, Node, TensorType

    consts = {"i4": np.arange(-8, 7, dtype=np.int8).astype(ml_dtypes.int4).reshape(3, 5),
              "u2": (np.arange(7) % 4).astype(ml_dtypes.uint2), "f4": np.array([-6, 0.5, 3], np.float32).astype(
                  ml_dtypes.float4_e2m1fn), "bf": np.array([1.5, -2], np.float32).astype(ml_dtypes.bfloat16),
              "f8": np.array([448, -0.25], np.float32).astype(ml_dtypes.float8_e4m3fn)}
    types = {k: TensorType(DType.from_numpy(v.dtype), v.shape) for k, v in consts.items()}
    nodes = [Node.make("Cast", [k], [f"{k}32"], to=DType.F32) for k in consts]
    types.update({f"{k}32": TensorType(DType.F32, v.shape) for k, v in consts.items()})
    graph = Graph("narrow_weights", (), tuple(f"{k}32" for k in consts), tuple(nodes), types, consts)
    bundle = read_bundle(bundle_bytes(graph, key), [key.public_key()])
    lengths = {w.name: w.length for w in bundle.manifest.weights}
    assert lengths == {"i4": 8, "u2": 2, "f4": 2, "bf": 4, "f8": 2}
    for name, arr in consts.items():
        got = bundle.graph.constants[name]
        assert got.dtype == arr.dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes()


def test_a_bundle_read_in_parts_is_the_bundle_and_owns_each_weight(data, key, graph):
    view = memoryview(data)
    head = view[:MANIFEST_OFFSET + Header.unpack(data, len(data)).manifest_length]  # what a file reader reads first
    parts = read_bundle_parts(head, len(data), lambda start, n: bytearray(view[start:start + n]), [key.public_key()])
    whole = read_bundle(data, [key.public_key()])
    assert parts.graph == whole.graph == graph and parts.content_hash == whole.content_hash
    bases = []
    for arr in parts.graph.constants.values():
        while isinstance(arr, np.ndarray) and arr.base is not None:
            arr = arr.base
        bases.append(arr.obj if isinstance(arr, memoryview) else arr)
    assert len({id(b) for b in bases if isinstance(b, bytearray)}) == sum(
        1 for w in whole.manifest.weights if w.length and w.dtype.bits >= 8)


def test_a_file_that_ends_early_while_read_in_parts_is_refused(data, key):
    view = memoryview(data)
    for short_at in (len(data) - 1, len(data) // 2):  # in the last weight; in the middle
        def segment(start, n, end=short_at):
            return bytearray(view[start:min(start + n, end)])
        with pytest.raises(BundleError, match="shrank while it was read"):
            read_bundle_parts(view, len(data), segment, [key.public_key()])


def test_a_damaged_weight_read_in_parts_is_refused(data, key):
    damaged = bytearray(data)
    damaged[-1] ^= 1
    view = memoryview(bytes(damaged))
    with pytest.raises(BundleError, match="SHA-256"):
        read_bundle_parts(view, len(view), lambda start, n: bytearray(view[start:start + n]), [key.public_key()])


def test_a_head_shorter_than_the_header_is_refused_whatever_size_is_claimed(data, key):
    with pytest.raises(BundleError, match="truncated inside its header"):
        read_bundle_parts(memoryview(data)[:20], len(data), lambda start, n: memoryview(data)[start:start + n],
                          [key.public_key()])


@pytest.mark.parametrize("value,ok", [
    ("ab" * 32, True), ("AB" * 32, False), ("ab" * 31, False), ("ab" * 33, False), ("g" + "a" * 63, False),
    (" " + "a" * 63, False), (b"a" * 64, False), (None, False), (["a"] * 64, False), ("a" * 63 + "\n", False),
])
def test_is_sha256_hex_takes_lower_case_hex_of_64_only(value, ok):
    assert is_sha256_hex(value) is ok
