"""The conformance harness itself: scope, ONNX's comparison rule, merged builds and their fallback."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tests.conformance import onnx_cases as cases  # noqa: E402
from tests.conformance import onnx_suite as suite  # noqa: E402


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _case(name, model, ins, outs) -> cases.Case:
    return cases._case(name, "node", model, [(ins, outs)], 1e-3, 1e-7)


F = TensorProto.FLOAT


def test_scope_names_each_excluded_kind():
    loss = _model([helper.make_node("SoftmaxCrossEntropyLoss", ["x", "y"], ["z"])],
                  {"x": (F, [2, 3]), "y": (TensorProto.INT64, [2])}, {"z": (F, [])})
    text = _model([helper.make_node("Identity", ["x"], ["z"])], {"x": (TensorProto.STRING, [2])},
                  {"z": (TensorProto.STRING, [2])})
    seq = _model([helper.make_node("SequenceEmpty", [], ["z"])], {}, {})
    plain = _model([helper.make_node("Relu", ["x"], ["z"])], {"x": (F, [2])}, {"z": (F, [2])})
    assert [cases.scope_of(m) for m in (loss, text, seq, plain)] == ["training", "string", "sequence", None]
    assert set(cases.OUT_OF_SCOPE) >= {"training", "string", "sequence", "optional", "map", "image decoding"}


@pytest.mark.parametrize("got, want, ok", [
    (np.float32([1, 2]), np.float32([1, 2.001]), True),
    (np.float32([1, 2]), np.float32([1, 2.01]), False),
    (np.float64([1, 2]), np.float32([1, 2]), False),  # ONNX wants the same dtype
    (np.float32([1, 2]), np.float32([[1, 2]]), False),
    (np.float32([np.nan]), np.float32([np.nan]), True),
])
def test_close_enough_is_onnx_rule(got, want, ok):
    assert (suite.close_enough(got, want, 1e-3, 1e-7) == "") is ok


def _relu_case(name, x):
    model = _model([helper.make_node("Relu", ["x"], ["z"])], {"x": (F, list(x.shape))}, {"z": (F, list(x.shape))})
    return _case(name, model, [x], [np.maximum(x, 0)])


def test_a_chunk_is_built_as_one_merged_graph():
    cases = [_relu_case(f"c{i}", np.linspace(-1, 1, 4 + i, dtype=np.float32)) for i in range(3)]
    built = []

    def native(graph, feed_sets):
        built.append(graph)
        return suite.run_native(graph, feed_sets)

    results = suite.run_chunk(cases, native=native)
    assert [r.outcome for r in results] == ["pass"] * 3
    assert len(built) == 1 and len(built[0].outputs) == 3


def test_a_failing_merged_build_is_retried_case_by_case():
    cases = [_relu_case(f"c{i}", np.linspace(-1, 1, 4 + i, dtype=np.float32)) for i in range(3)]

    def native(graph, feed_sets):
        if len(graph.outputs) > 1 or graph.types[graph.inputs[0]].shape == (5,):
            raise RuntimeError("boom")  # the merged build, and case c1 on its own
        return suite.run_native(graph, feed_sets)

    results = suite.run_chunk(cases, native=native)
    assert [r.outcome for r in results] == ["pass", "untyped error", "pass"]
    assert "boom" in results[1].detail


def test_a_wrong_native_result_is_a_mismatch():
    case = _relu_case("c", np.float32([-1, 2]))
    results = suite.run_chunk([case], native=lambda g, fs: [{g.outputs[0]: np.float32([0, 3])}])
    assert results[0].outcome == "native mismatch"
