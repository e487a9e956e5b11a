"""A fine-tuned version's lineage in the signed manifest: round trip, absence, and hostile values."""

from __future__ import annotations

import json

import pytest

from cuvil.compiler.bundle import Lineage, bundle_bytes, read_bundle
from cuvil.compiler.bundle.format import canonical_json
from cuvil.compiler.errors import BundleError

from .helpers import new_key, resign, small_graph, split

PARENT = "ab" * 32


def test_lineage_round_trips_through_a_signed_bundle_and_changes_the_content_hash():
    key, graph = new_key(), small_graph()
    lineage = Lineage.of(PARENT, "1", rounds=3, devices=9, epsilon=2.1234567, delta=1e-6)
    plain = read_bundle(bundle_bytes(graph, key, version="2"), [key.public_key()])
    tuned = read_bundle(bundle_bytes(graph, key, version="2", lineage=lineage), [key.public_key()])
    assert plain.manifest.lineage is None and b"lineage" not in plain.manifest.encode()
    assert tuned.manifest.lineage == lineage
    assert tuned.manifest.lineage.epsilon == "2.123457"  # rounded up, never shown smaller than spent
    assert tuned.manifest.lineage.delta == "1e-06" and tuned.manifest.lineage.delta_value == 1e-6
    assert tuned.content_hash != plain.content_hash  # the lineage is part of what the hash names


def test_a_bundle_without_lineage_keeps_its_bytes():
    key, graph = new_key(), small_graph()
    assert bundle_bytes(graph, key, version="2") == bundle_bytes(graph, key, version="2", lineage=None)


@pytest.mark.parametrize("field,value", [
    ("parent", "not-a-hash"), ("parent", 7), ("rounds", -1), ("rounds", True), ("devices", "3"),
    ("epsilon", "nan"), ("epsilon", "-1"), ("epsilon", "1e400"), ("delta", ["1e-06"]), ("delta", 1), ("parent_version", "\x1b[31m"),
    ("method", ""),
])
def test_signed_lineage_with_a_bad_field_is_refused(field, value):
    key, graph = new_key(), small_graph()
    good = bundle_bytes(graph, key, version="2", lineage=Lineage.of(PARENT, "1", 1, 1, 0.5, 1e-6))
    manifest, data = split(good)
    obj = json.loads(manifest)
    obj["lineage"][field] = value
    with pytest.raises(BundleError, match="lineage"):
        read_bundle(resign(canonical_json(obj), data, key), [key.public_key()])


def test_signed_lineage_with_an_unknown_or_missing_field_is_refused():
    key, graph = new_key(), small_graph()
    manifest, data = split(bundle_bytes(graph, key, lineage=Lineage.of(PARENT, "1", 1, 1, 0.5, 1e-6)))
    for change in ({"extra": "x"}, None):
        obj = json.loads(manifest)
        if change is None:
            del obj["lineage"]["rounds"]
        else:
            obj["lineage"].update(change)
        with pytest.raises(BundleError, match="lineage"):
            read_bundle(resign(canonical_json(obj), data, key), [key.public_key()])
