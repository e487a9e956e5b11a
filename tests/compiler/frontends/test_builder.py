"""GraphBuilder: bfloat16 is stored as such and computed in f32, one rounding per op; folding is bounded."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuvil.compiler import DType, TensorType, run_reference
from cuvil.compiler.errors import LimitError
from cuvil.compiler.frontends.builder import MAX_FOLDED_ELEMENTS, FoldBudget, GraphBuilder
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


def test_the_fold_budget_grows_with_the_weights_and_every_fold_charges_it():
    b = GraphBuilder("t", budget=FoldBudget(1000))
    w = b.weight(np.ones(100, np.float32), "w")  # 400 bytes: the budget grows by 4 x 400
    assert b.budget.limit == 1000 + 4 * 400
    x = b.add1("Concat", [w, w], axis=0)  # 800 bytes folded
    x = b.add1("Concat", [x, x], axis=0)  # 1,600
    assert x in b.constants and b.budget.used == 2400
    with pytest.raises(LimitError, match="exceed 2600 bytes"):
        b.add1("Concat", [x, x], axis=0)


def test_a_result_past_the_element_cap_stays_an_op():
    """Five copies of 2^24 bytes do not swell their inputs, yet are more than one folded constant may hold."""
    b = GraphBuilder("t")
    c = b.constant(np.zeros(1 << 24, np.uint8), "c")
    y = b.add1("Concat", [c] * 5, axis=0)
    assert 5 << 24 > MAX_FOLDED_ELEMENTS and y not in b.constants and [n.op for n in b.nodes] == ["Concat"]


def test_a_folded_output_that_later_nodes_read_is_computed_before_them():
    """A graph output folded to a constant (from initializers only) and read by a later node: its
    Identity was appended last, and the graph failed verification ('uses t before it is defined')."""
    gb = GraphBuilder("folded_output")
    x = gb.input("x", TensorType(DType.F32, (3,)))
    t = gb.add1("Neg", [gb.constant(np.array([0.5, -1.0, 2.0], np.float32), "c")], output_names=["t"])
    y = gb.add1("Add", [x, t], output_names=["y"])
    graph = gb.build([t, y])
    assert graph.outputs == ("t", "y")
    feeds = {"x": np.array([1.0, 2.0, 3.0], np.float32)}
    for got in (run_reference(graph, feeds), compile_graph(graph, use_cache=False).run(feeds)):
        np.testing.assert_array_equal(got["t"], [-0.5, 1.0, -2.0])
        np.testing.assert_array_equal(got["y"], [0.5, 3.0, 1.0])
