"""A bounded result (NonMaxSuppression's rows) through a signed bundle, and signed bundles that lie
about its bound: each is refused with a BundleError before anything compiles."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, verify
from cuvil.compiler.bundle import bundle_bytes, read_bundle
from cuvil.compiler.errors import BundleError

from .helpers import new_key, resign, split


@pytest.fixture(scope="module")
def key():
    return new_key()


@pytest.fixture(scope="module")
def graph():
    types = {"boxes": TensorType(DType.F32, (1, 4, 4)), "scores": TensorType(DType.F32, (1, 2, 4))}
    iou = np.array([0.5], np.float32)
    iou.flags.writeable = False
    node = Node.make("NonMaxSuppression", ["boxes", "scores", "iou"], ["sel"], max_output_boxes_per_class=2)
    return verify(infer_graph_types("nms", types, {"iou": iou}, [node], ["sel"]))


def test_bounded_output_round_trips(graph, key):
    back = read_bundle(bundle_bytes(graph, key), [key.public_key()]).graph
    assert back == graph and back.types["sel"] == TensorType(DType.I64, (4, 3), bounded_axis=0)


@pytest.mark.parametrize("old, new", [
    (b"i64[<=4,3]", b"i64[<=9,3]"),  # a larger bound than the op's: a kernel would leave rows unwritten
    (b"i64[<=4,3]", b"i64[<=1,3]"),  # a smaller one: the arena would be too small for the rows
    (b"i64[<=4,3]", b"i64[4,3]"),  # no count at all
    (b"boxes: f32[1,4,4]", b"boxes: f32[<=1,4,4]"),  # a bounded graph input
])
def test_a_signed_bundle_lying_about_a_bound_is_refused(graph, key, old, new):
    manifest, weights = split(bundle_bytes(graph, key))
    assert old in manifest
    with pytest.raises(BundleError):
        read_bundle(resign(manifest.replace(old, new), weights, key), [key.public_key()])
