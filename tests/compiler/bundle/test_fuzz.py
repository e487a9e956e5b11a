"""Property tests: random and mutated bytes never crash the loader, only BundleError comes out."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil.compiler.bundle import MAGIC, bundle_bytes, read_bundle
from cuvil.compiler.bundle.format import canonical_json
from cuvil.compiler.errors import BundleError

from .helpers import new_key, resign, small_graph, split

KEY = new_key()
TRUSTED = [KEY.public_key()]
GOOD = bundle_bytes(small_graph(), KEY)
MANIFEST, DATA = split(GOOD)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_or_refuse(data: bytes):
    """The only acceptable outcomes: a verified bundle, or one BundleError with a one-line reason."""
    try:
        return read_bundle(data, TRUSTED)
    except BundleError as e:
        assert str(e) and "\n" not in str(e)
        return None


@FAST
@given(st.binary(max_size=4096))
def test_random_bytes_are_refused(data):
    assert load_or_refuse(data) is None


@FAST
@given(st.binary(min_size=0, max_size=600))
def test_random_bytes_behind_valid_magic_are_refused(tail):
    assert load_or_refuse(MAGIC + b"\x01\0\0\0" + tail) is None


@st.composite
def mutations(draw):
    data = bytearray(GOOD)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "splice"]))
        pos = draw(st.integers(0, len(data)))
        if kind == "set" and pos < len(data):
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=80))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 80))]
        else:
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[pos:pos + len(chunk)] = chunk
    return bytes(data)


@FAST
@given(mutations())
def test_mutated_bundles_are_refused(data):
    result = load_or_refuse(data)
    assert (result is None) == (data != GOOD)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(json.loads(MANIFEST)) if p]


@FAST
@given(st.sampled_from(PATHS), json_values)
def test_signed_manifests_with_a_random_field_load_or_are_refused(path, value):
    obj = json.loads(MANIFEST)
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    load_or_refuse(resign(canonical_json(obj), DATA, KEY))


@FAST
@given(st.integers(0, len(MANIFEST) - 1), st.binary(min_size=1, max_size=8))
def test_signed_manifests_with_random_bytes_load_or_are_refused(pos, chunk):
    manifest = MANIFEST[:pos] + chunk + MANIFEST[pos + len(chunk):]
    load_or_refuse(resign(manifest, DATA, KEY))


@FAST
@given(st.integers(0, 10**6), st.text(max_size=30))
def test_signed_graph_text_edits_load_or_are_refused(pos, text):
    obj = json.loads(MANIFEST)
    graph = obj["graph"]
    pos %= len(graph) + 1
    obj["graph"] = graph[:pos] + text + graph[pos:]
    load_or_refuse(resign(canonical_json(obj), DATA, KEY))
