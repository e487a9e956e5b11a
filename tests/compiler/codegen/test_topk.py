"""TopKIndices natively (the insertion body of ``codegen/topk.py``) against values written out and the
reference: ties in index order, NaN above every number, integer extremes, k of 0 and of the whole
line, a middle axis; and a line of 8,400 (YOLO's anchors) in a few KiB of arena, not n * n."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, run_reference, verify
from cuvil.edge_runtime.compile import compile_graph


def _run(x: np.ndarray, **attrs):
    graph = verify(infer_graph_types("topk", {"x": TensorType(DType.from_numpy(x.dtype), x.shape)}, {},
                                     [Node.make("TopKIndices", ["x"], ["i"], **attrs)], ["i"]))
    session = compile_graph(graph, use_cache=False)
    got = session.run({"x": x})["i"]
    np.testing.assert_array_equal(got, run_reference(graph, {"x": x})["i"])
    return got, session


def test_ties_keep_index_order_and_nan_ranks_above_every_number():
    x = np.array([[2.0, np.nan, 5.0, 2.0, -np.inf, np.nan, 5.0, np.inf]], np.float32)
    assert _run(x, axis=1, k=8, largest=1)[0].tolist() == [[1, 5, 7, 2, 6, 0, 3, 4]]
    assert _run(x, axis=1, k=8, largest=0)[0].tolist() == [[4, 0, 3, 2, 6, 7, 1, 5]]
    assert _run(x, axis=1, k=3, largest=1)[0].tolist() == [[1, 5, 7]]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_integers_at_their_extremes(dtype):
    info = np.iinfo(dtype)
    x = np.array([[1, info.max, info.min, 7, info.max, info.min]], dtype)
    assert _run(x, axis=-1, k=4, largest=1)[0].tolist() == [[1, 4, 3, 0]]
    assert _run(x, axis=-1, k=4, largest=0)[0].tolist() == [[2, 5, 0, 3]]


@pytest.mark.parametrize("k", [0, 1, 5, 9])
@pytest.mark.parametrize("largest", [0, 1])
def test_a_middle_axis_and_every_k(k, largest):
    x = np.random.default_rng(k).integers(-3, 4, (2, 9, 3)).astype(np.float32)  # many ties
    got, _ = _run(x, axis=1, k=k, largest=largest)
    assert got.shape == (2, k, 3)


def test_a_long_line_needs_no_square_of_its_length():
    """TopK was n * n comparisons in tensors (8,400 anchors: 0.6 GB of arena); now the output is all."""
    x = np.random.default_rng(0).standard_normal((1, 8400)).astype(np.float32)
    got, session = _run(x, axis=1, k=100, largest=1)
    assert got[0].tolist() == np.argsort(-x[0], kind="stable")[:100].tolist()
    assert session.lowered.arena_bytes < 64 << 10
