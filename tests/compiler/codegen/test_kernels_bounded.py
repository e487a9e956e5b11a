"""Native NonMaxSuppression and NonZero against the reference: one compiled model of several
variants (limits, thresholds, both box formats, ties, NaN scores; NonZero of floats with NaN and
-0.0, of ints and of bools); the session hands out the valid part only."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, verify
from cuvil.compiler.errors import BoundedCountError
from cuvil.compiler.interpreter import run_reference
from cuvil.edge_runtime.compile import compile_graph

VARIANTS = [  # limit, center_point_box, score threshold or None
    (3, 0, None), (10, 0, 0.3), (2, 1, None), (0, 0, None), (10, 1, 0.5),
]


def _model():
    rng = np.random.default_rng(7)
    boxes = rng.uniform(0, 2, (2, 12, 4)).astype(np.float32)  # crowded: many overlaps
    boxes[..., 2:] = boxes[..., :2] + rng.uniform(-1.5, 1.5, (2, 12, 2)).astype(np.float32)  # some flipped
    scores = rng.choice(np.float32([0.1, 0.4, 0.6, 0.9]), (2, 3, 12))  # many ties
    scores[0, 1, 3] = np.nan
    consts, nodes, types = {"iou": np.array([0.3], np.float32)}, [], {}
    for k, (limit, center, threshold) in enumerate(VARIANTS):
        ins = ["boxes", "scores", "iou"]
        if threshold is not None:
            consts[f"t{k}"] = np.array([threshold], np.float32)
            ins.append(f"t{k}")
        nodes.append(Node.make("NonMaxSuppression", ins, [f"sel{k}"], max_output_boxes_per_class=limit,
                               center_point_box=center))
    for c in consts.values():
        c.flags.writeable = False
    x = np.array([[1.0, 0.0, np.nan], [-0.0, 2.0, 0.0]], np.float32)
    feed = {"boxes": boxes, "scores": scores, "x": x, "k": (rng.integers(0, 3, (3, 2, 2)) - 1).astype(np.int32),
            "m": rng.integers(0, 2, 5).astype(bool)}
    nodes += [Node.make("NonZero", [v], [f"nz_{v}"]) for v in ("x", "k", "m", "scores")]
    types = {k: TensorType(DType.from_numpy(v.dtype), v.shape) for k, v in feed.items()}
    graph = verify(infer_graph_types("nms", types, consts, nodes, [n.outputs[0] for n in nodes]))
    return graph, feed


@pytest.fixture(scope="module")
def compiled():
    graph, feed = _model()
    return graph, feed, compile_graph(graph, use_cache=False, guard_pages=True)


def test_native_rows_equal_the_reference(compiled):
    graph, feed, session = compiled
    want, got = run_reference(graph, feed), session.run(feed)
    for name in graph.outputs:
        assert got[name].dtype == np.int64 and got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert len(got["sel1"]) < 2 * 3 * 10 and len(got["sel3"]) == 0  # fewer rows than the bound
    assert got["nz_x"].tolist() == [[0, 0, 1], [0, 2, 1]]
    again = session.run({**feed, "scores": np.zeros_like(feed["scores"]) - 1, "m": np.zeros(5, bool)})
    np.testing.assert_array_equal(again["sel1"], np.zeros((0, 3), np.int64))  # nothing above 0.3
    np.testing.assert_array_equal(again["nz_m"], np.zeros((1, 0), np.int64))


def test_a_count_past_the_bound_is_a_typed_error(compiled):
    _, _, session = compiled
    spec = session.lowered.outputs[-1]  # NonZero: its second axis is bounded
    assert spec.bounded_axis == 1
    span = np.zeros(spec.nbytes, np.uint8)
    span[spec.type.count_offset():].view(np.int64)[0] = 2
    assert spec.take(span).shape == (3, 2)
    span[spec.type.count_offset():].view(np.int64)[0] = spec.shape[1] + 1
    with pytest.raises(BoundedCountError):
        spec.take(span)
    span[spec.type.count_offset():].view(np.int64)[0] = -1
    with pytest.raises(BoundedCountError):
        spec.take(span)
