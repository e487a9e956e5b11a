"""GraphBuilder: bfloat16 is stored as such and computed in f32, one rounding per op."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime.compile import compile_graph


def test_bfloat16_ops_run_in_f32_and_round_once_each():
    gb = GraphBuilder("bf16")
    x = gb.input("x", TensorType(DType.BF16, (2, 3)))
    y = gb.input("y", TensorType(DType.BF16, (2, 3)))
    s = gb.add1("Add", [x, y], output_names=["sum"])
    r = gb.add1("Reshape", [s], shape=(3, 2))
    m = gb.add1("Mul", [r, r], output_names=["square"])
    graph = gb.build([m])
    assert [n.op for n in graph.nodes] == ["Cast", "Cast", "Add", "Cast", "Reshape", "Cast", "Mul", "Cast"]
    assert graph.types[graph.outputs[0]].dtype is DType.BF16 and graph.outputs == ("square",)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(2, 3)).astype(ml_dtypes.bfloat16), "y": rng.normal(size=(2, 3)).astype(ml_dtypes.bfloat16)}
    f32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    once = (f32["x"] + f32["y"]).astype(ml_dtypes.bfloat16).astype(np.float32).reshape(3, 2)
    want = (once * once).astype(ml_dtypes.bfloat16)
    for got in (run_reference(graph, feeds)["square"], compile_graph(graph, optimize=False).run(feeds)["square"]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_bfloat16_operands_keep_non_float_results_as_they_are():
    gb = GraphBuilder("bf16_cmp")
    x = gb.input("x", TensorType(DType.BF16, (4,)))
    less = gb.add1("Less", [x, gb.constant(np.zeros(4, ml_dtypes.bfloat16), "zero")], output_names=["neg"])
    graph = gb.build([less])
    assert graph.types["neg"].dtype is DType.BOOL and graph.nodes[-1].op == "Identity"
