"""ONNX NonMaxSuppression and NonZero: bounded results against ONNX Runtime (reference and native,
one compiled model), the limit as a constant input or the typed error naming it, a known X folded."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil.compiler import run_reference
from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.compiler.frontends.onnx_node import OnnxImportError
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import make_model, run_ort

F = TensorProto.FLOAT


def _model(limit_is_input: bool = False):
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"], ["sel"],
                              center_point_box=1),
             helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("NonZero", ["known"], ["nz_known"])]
    inputs = {"boxes": (F, [2, 6, 4]), "scores": (F, [2, 2, 6]), "iou": (F, [1]), "x": (F, [3, 4])}
    inits = {"score": np.array([0.2], np.float32), "known": np.array([0, 3, 0, 1], np.int64)}
    if limit_is_input:
        inputs["limit"] = (TensorProto.INT64, [1])
    else:
        inits["limit"] = np.array([2], np.int64)
    return make_model(nodes, inputs, ["sel", "nz", "nz_known"], inits, opset=13)


def test_bounded_results_match_onnx_runtime(rng):
    model = _model()
    xy = rng.uniform(0, 3, (2, 6, 2)).astype(np.float32)
    feeds = {"boxes": np.concatenate([xy, rng.uniform(0.5, 2, (2, 6, 2)).astype(np.float32)], axis=-1),
             "scores": rng.uniform(0, 1, (2, 2, 6)).astype(np.float32), "iou": np.array([0.3], np.float32),
             "x": np.where(rng.uniform(size=(3, 4)) > 0.5, 1.0, 0.0).astype(np.float32)}
    want = run_ort(model, feeds)
    graph = import_onnx(model)
    assert str(graph.types["sel"]) == "i64[<=8,3]" and str(graph.types["nz"]) == "i64[2,<=12]"
    assert [n.op for n in graph.nodes].count("NonZero") == 1  # the known X folded at import
    session = compile_graph(graph, use_cache=False)
    for got in (run_reference(graph, feeds), session.run(feeds)):
        for name, onnx_name in zip(graph.outputs, ("sel", "nz", "nz_known")):
            np.testing.assert_array_equal(got[name], want[onnx_name], err_msg=onnx_name)


def test_a_limit_that_is_not_a_constant_is_unsupported_naming_it():
    with pytest.raises(UnsupportedModelError) as info:
        import_onnx(_model(limit_is_input=True))
    assert info.value.constant_inputs == ("limit",)
    fixed = import_onnx(_model(limit_is_input=True), constant_inputs={"limit": np.array([1], np.int64)})
    assert str(fixed.types["sel"]) == "i64[<=4,3]"


def test_a_node_that_reads_a_bounded_result_is_unsupported_naming_it():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Cast", ["nz"], ["y"], to=F)]
    with pytest.raises(UnsupportedModelError, match="length is known only at run time") as info:
        import_onnx(make_model(nodes, {"x": (F, [3, 4])}, ["y"], {}, opset=13))
    assert "Cast" in str(info.value)


@pytest.mark.parametrize("iou", [1.5, -0.5, float("nan")])
def test_a_constant_iou_threshold_outside_zero_one_is_refused(iou):
    """ONNX gives the IoU threshold the range [0, 1], and ONNX Runtime fails the run outside it; a
    constant one is refused at import rather than compiled into a model that selects differently."""
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["sel"])]
    inits = {"limit": np.array([2], np.int64), "iou": np.array([iou], np.float32)}
    with pytest.raises(OnnxImportError, match=r"iou_threshold must be one value in \[0, 1\]"):
        import_onnx(make_model(nodes, {"boxes": (F, [1, 3, 4]), "scores": (F, [1, 1, 3])}, ["sel"], inits, opset=13))
