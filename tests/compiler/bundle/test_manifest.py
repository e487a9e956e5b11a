"""Signed but malformed manifests: a trusted key can sign a buggy file; the parser still refuses it."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from cuvil.compiler.bundle import bundle_bytes, read_bundle
from cuvil.compiler.bundle.format import canonical_json
from cuvil.compiler.errors import BundleError

from .helpers import new_key, resign, small_graph, split

KEY = new_key()
GOOD = bundle_bytes(small_graph(), KEY)
MANIFEST, DATA = split(GOOD)


def _edit(fn) -> bytes:
    obj = json.loads(MANIFEST)
    fn(obj)
    return canonical_json(obj)


def _set(path, value):
    def fn(obj):
        *parents, last = path
        for p in parents:
            obj = obj[p]
        obj[last] = value
    return fn


def _w(field, value):
    return _set(["weights", 0, field], value)


CASES = {
    "not json": b"{not json",
    "not utf-8": b'{"name":"\xff"}',
    "not canonical (spaces)": MANIFEST.replace(b'","', b'", "', 1),
    "duplicate key": MANIFEST[:-1] + b',"name":"x"}',
    "a list": b"[1,2,3]",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "float": _edit(_w("offset", 0)).replace(b'"offset":0', b'"offset":0.0'),
    "nan": MANIFEST.replace(b'"offset":0', b'"offset":NaN', 1),
    "unknown field": _edit(_set(["extra"], 1)),
    "missing field": _edit(lambda o: o.pop("producer")),
    "name not a string": _edit(_set(["name"], 3)),
    "control chars in name": _edit(_set(["name"], "a\x1b[2Jb")),
    "weights not a list": _edit(_set(["weights"], {})),
    "weight not an object": _edit(_set(["weights", 0], "w")),
    "unknown dtype": _edit(_w("dtype", "f128")),
    "negative dim": _edit(_w("shape", [-8])),
    "bool dim": _edit(_w("shape", [True])),
    "string dim": _edit(_w("shape", ["8"])),
    "huge dims": _edit(_w("shape", [2**40, 2**40])),
    "huge dims with a zero": _edit(_w("shape", [0, 2**40, 2**40])),
    "rank 33": _edit(_w("shape", [1] * 33)),
    "shape does not match length": _edit(_w("shape", [9])),
    "length past the file": _edit(lambda o: (o["weights"][0].update(shape=[2**30], length=2**32))),
    "offset misaligned": _edit(_w("offset", 4)),
    "offset past the file": _edit(_w("offset", 2**40)),
    "negative offset": _edit(_w("offset", -64)),
    "bad sha": _edit(_w("sha256", "00")),
    "uppercase sha": _edit(lambda o: o["weights"][0].update(sha256=o["weights"][0]["sha256"].upper())),
    "wrong sha": _edit(_w("sha256", "0" * 64)),
    "duplicate weight": _edit(lambda o: o["weights"].insert(1, dict(o["weights"][0], offset=64))),
    "weight dropped": _edit(lambda o: o["weights"].pop()),
    "weights reordered": _edit(lambda o: o["weights"].reverse()),
    "graph garbage": _edit(_set(["graph"], "graph ((((")),
    "graph unknown op": _edit(lambda o: o.update(graph=o["graph"].replace("Sigmoid", "Launch"))),
    "graph not canonical": _edit(lambda o: o.update(graph=o["graph"].replace("  ", "   "))),
    "graph with data section": _edit(lambda o: o.update(graph=o["graph"] + 'data w "AAAA"\n')),
    "graph type lies": _edit(lambda o: o.update(graph=o["graph"].replace("const w: f32[8]", "const w: f32[2,4]"))),
    "graph huge type": _edit(lambda o: o.update(graph=o["graph"].replace("y: f32[N,8]", "y: f32[N,99999999999999999]"))),
    "inputs mismatch": _edit(_set(["inputs", 0, "type"], "f32[N,9]")),
    "outputs mismatch": _edit(lambda o: o["outputs"].reverse()),
    "empty object": b"{}",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_signed_malformed_manifest_is_refused(name):
    with pytest.raises(BundleError) as info:
        read_bundle(resign(CASES[name], DATA, KEY), [KEY.public_key()])
    assert str(info.value) and "\n" not in str(info.value)


def test_data_region_mismatch_is_refused():
    for data in (DATA[:-1], DATA + bytes(64), b""):
        with pytest.raises(BundleError):
            read_bundle(resign(MANIFEST, data, KEY), [KEY.public_key()])


def test_claims_of_huge_weights_allocate_nothing_like_them():
    bad = resign(CASES["length past the file"], DATA, KEY)
    tracemalloc.start()
    try:
        with pytest.raises(BundleError):
            read_bundle(bad, [KEY.public_key()])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 + 4 * len(bad)


def test_resigned_good_manifest_still_loads():
    assert read_bundle(resign(MANIFEST, DATA, KEY), [KEY.public_key()]).graph == small_graph()
