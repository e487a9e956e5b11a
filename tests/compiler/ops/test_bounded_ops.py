"""NonMaxSuppression's and NonZero's references (ONNX's rules, by hand-worked cases) and their bounded result types."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, verify
from cuvil.compiler.errors import ParseError, VerifyError
from cuvil.compiler.ir.text import parse_graph, print_graph
from cuvil.compiler.ops import get_op

NMS = get_op("NonMaxSuppression")
F = np.float32
# y1, x1, y2, x2: box 1 overlaps box 0 (IoU 0.81), box 2 is apart, box 3 has no area
BOXES = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 5, 1, 6], [2, 2, 2, 3]]], F)


def nms(scores, limit=4, iou=0.5, score_threshold=None, boxes=BOXES, center=0):
    xs = [boxes, np.asarray(scores, F).reshape(1, -1, boxes.shape[1]), np.array([iou], F)]
    xs += [] if score_threshold is None else [np.array([score_threshold], F)]
    (out,) = NMS.reference(xs, {"center_point_box": center, "max_output_boxes_per_class": limit})
    assert out.dtype == np.int64 and out.shape[1:] == (3,)
    return out[:, 2].tolist()


def test_greedy_by_score_suppressing_overlaps():
    assert nms([0.9, 0.8, 0.7, 0.6]) == [0, 2, 3]  # 1 overlaps 0 (IoU 0.81 > 0.5)
    assert nms([0.8, 0.9, 0.7, 0.6]) == [1, 2, 3]
    assert nms([0.9, 0.8, 0.7, 0.6], iou=0.9) == [0, 1, 2, 3]  # IoU must exceed the threshold


def test_ties_take_the_lower_box_index_first_and_the_limit_cuts():
    assert nms([0.5, 0.7, 0.7, 0.7]) == [1, 2, 3]  # 0 comes last, and box 1 suppresses it
    assert nms([0.7, 0.7, 0.7, 0.7], limit=2) == [0, 2]
    assert nms([0.7, 0.7, 0.7, 0.7], limit=0) == []


def test_score_threshold_is_strict_and_nan_scores_never_count():
    assert nms([0.9, 0.8, 0.7, 0.6], score_threshold=0.7) == [0]
    assert nms([np.nan, 0.8, 0.7, 0.6]) == [1, 2, 3]


def test_center_point_boxes_and_per_class_rows():
    centers = np.array([[[0.5, 0.5, 1, 1], [0.6, 0.5, 1, 1], [5.5, 0.5, 1, 1]]], F)  # x, y, w, h
    assert nms([0.9, 0.8, 0.7], boxes=centers, center=1) == [0, 2]
    xs = [centers, np.array([[[0.9, 0.8, 0.7], [0.1, 0.2, 0.3]]], F), np.array([0.5], F)]
    (out,) = NMS.reference(xs, {"center_point_box": 1, "max_output_boxes_per_class": 1})
    assert out.tolist() == [[0, 0, 0], [0, 1, 2]]


def _graph(limit=2):
    types = {"boxes": TensorType(DType.F32, (1, 4, 4)), "scores": TensorType(DType.F32, (1, 2, 4))}
    consts = {"iou": np.array([0.5], F)}
    consts["iou"].flags.writeable = False
    node = Node.make("NonMaxSuppression", ["boxes", "scores", "iou"], ["sel"], max_output_boxes_per_class=limit)
    return verify(infer_graph_types("nms", types, consts, [node], ["sel"]))


def test_the_result_type_is_bounded_by_batches_classes_and_the_limit():
    g = _graph(limit=3)
    assert g.types["sel"] == TensorType(DType.I64, (6, 3), bounded_axis=0)
    assert str(g.types["sel"]) == "i64[<=6,3]"
    assert _graph(limit=99).types["sel"].shape == (8, 3)  # never more than the boxes per class
    t = g.types["sel"]
    assert t.count_offset() == 6 * 3 * 8 and t.nbytes() == 6 * 3 * 8 + 8


def test_bounded_type_round_trips_through_text_and_is_checked():
    g = _graph()
    text = print_graph(g)
    assert "i64[<=4,3]" in text and parse_graph(text) == g
    for bad, err in [(text.replace("i64[<=4,3]", "i64[4,3]"), VerifyError),  # the op's type is bounded
                     (text.replace("i64[<=4,3]", "i64[<=5,3]"), VerifyError),  # and its bound is 4
                     (text.replace("i64[<=4,3]", "i64[<=]"), ParseError),
                     (text.replace("f32[1,4,4]", "f32[<=1,4,4]"), VerifyError)]:  # an input is never bounded
        with pytest.raises(err):
            verify(parse_graph(bad))


def test_a_bounded_value_reaches_graph_outputs_only():
    g = _graph()
    node = Node.make("Identity", ["sel"], ["copy"])
    with pytest.raises(VerifyError, match="bounded"):
        verify(g.replace(nodes=g.nodes + (node,), outputs=("copy",),
                         types={**g.types, "copy": g.types["sel"]}))


def test_non_zero_coordinates_in_row_major_order_with_a_bounded_column_count():
    ref = get_op("NonZero").reference
    x = np.array([[1.0, 0.0, np.nan], [-0.0, 2.0, 0.0]], F)  # NaN is nonzero, -0.0 is not
    assert ref([x], {})[0].tolist() == [[0, 0, 1], [0, 2, 1]]
    assert ref([np.zeros(3, bool)], {})[0].shape == (1, 0)
    node = Node.make("NonZero", ["x"], ["nz"])
    g = verify(infer_graph_types("nz", {"x": TensorType(DType.F32, (2, 3))}, {}, [node], ["nz"]))
    assert str(g.types["nz"]) == "i64[2,<=6]" and parse_graph(print_graph(g)) == g
    with pytest.raises(ParseError):
        parse_graph(print_graph(g).replace("i64[2,<=6]", "i64[<=2,<=6]"))
