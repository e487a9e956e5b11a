"""ONNX's DepthToSpace and SpaceToDepth (ESPCN's pixel shuffle, YOLO's reorg), against ONNX Runtime:
a symbolic batch, both modes, compiled and by the reference; shapes they cannot take are refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil.compiler import N, run_reference
from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import run_ort


def _model(op: str, shape, opset: int, **attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


CASES = [("DepthToSpace", 13, dict(blocksize=2)), ("DepthToSpace", 13, dict(blocksize=2, mode="CRD")),
         ("DepthToSpace", 11, dict(blocksize=3, mode="DCR")), ("DepthToSpace", 1, dict(blocksize=2)),
         ("SpaceToDepth", 13, dict(blocksize=2))]


@pytest.mark.parametrize("op, opset, attrs", CASES, ids=str)
def test_matches_onnx_runtime_at_any_batch(op, opset, attrs):
    b = attrs["blocksize"]
    shape = ["N", 2 * b * b, 3, 5] if op == "DepthToSpace" else ["N", 3, 2 * b, 3 * b]
    model = _model(op, shape, opset, **attrs)
    graph = import_onnx(model)
    assert graph.types["x"].shape[0] == N
    for batch in (1, 3):
        x = np.arange(batch * np.prod(shape[1:]), dtype=np.float32).reshape(batch, *shape[1:])
        want = run_ort(model, {"x": x})["y"]
        got = compile_graph(graph, batch=batch, use_cache=False).run({"x": x})[graph.outputs[0]]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(run_reference(graph, {"x": x})[graph.outputs[0]], want)


@pytest.mark.parametrize("op, shape, attrs, message", [
    ("DepthToSpace", [1, 6, 2, 2], dict(blocksize=2), "must divide C=6"),
    ("SpaceToDepth", [1, 3, 4, 5], dict(blocksize=2), "must divide H=4 and W=5"),
    ("DepthToSpace", [1, 4, 2], dict(blocksize=2), "rank-4 input"),
    ("DepthToSpace", [1, 4, 2, 2], dict(blocksize=2, mode="XYZ"), "DCR or CRD")])
def test_shapes_it_cannot_take_are_refused(op, shape, attrs, message):
    with pytest.raises(UnsupportedModelError, match=message):
        import_onnx(_model(op, shape, 13, **attrs))
