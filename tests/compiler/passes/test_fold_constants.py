import numpy as np

from cuvil.compiler import N, Node, TensorType
from cuvil.compiler.ir.dtypes import DType
from cuvil.compiler.passes import fold_constants, fold_dequantized_weights

from .graphs import assert_same, f32, graph, ops, weights


def test_constant_subgraphs_fold_into_one_constant(rng):
    g = graph({"x": f32(N, 3, 4)}, {"a": weights(rng, 4, 3), "c": weights(rng, 3, 1)}, [
        Node.make("Transpose", ["a"], ["at"], perm=[1, 0]),
        Node.make("Add", ["at", "c"], ["s"]),
        Node.make("Relu", ["s"], ["k"]),
        Node.make("Mul", ["x", "k"], ["y"]),
    ], ["y"])
    out = fold_constants(g)
    assert ops(out) == ["Mul"]
    assert out.nodes[0].inputs == ("x", "k") and "k" in out.constants
    assert not out.constants["k"].flags.writeable
    np.testing.assert_array_equal(out.constants["k"], np.maximum(g.constants["a"].T + g.constants["c"], 0))
    assert_same(g, out, rng)


def test_a_node_computing_a_graph_output_stays():
    g = graph({"x": f32(2)}, {"a": np.ones(2, np.float32)}, [
        Node.make("Neg", ["a"], ["y"]), Node.make("Add", ["x", "a"], ["z"])], ["y", "z"])
    assert fold_constants(g) is g


def test_nothing_to_fold_returns_the_same_graph(rng):
    g = graph({"x": f32(N, 4)}, {"w": weights(rng, 4)}, [Node.make("Mul", ["x", "w"], ["y"])], ["y"])
    assert fold_constants(g) is g


def test_folded_values_keep_their_dtype(rng):
    g = graph({"x": f32(3)}, {"i": np.array([1, 2, 3], np.int64)}, [
        Node.make("Cast", ["i"], ["fi"], to="f32"), Node.make("Add", ["x", "fi"], ["y"])], ["y"])
    out = fold_constants(g)
    assert out.constants["fi"].dtype == np.float32 and ops(out) == ["Add"]
    assert_same(g, out, np.random.default_rng(1))


def test_a_result_much_bigger_than_its_inputs_stays_computed(rng):
    """An Expand of a scalar to 4 MiB would swell the weights 4 MiB; a 4 KiB one folds."""
    big, small = (1, 64, 128, 128), (1, 16, 8, 8)
    g = graph({"x": f32(*big), "z": f32(*small)}, {"s": np.array([0.5], np.float32)}, [
        Node.make("Expand", ["s"], ["e"], shape=list(big)), Node.make("Add", ["x", "e"], ["y"]),
        Node.make("Expand", ["s"], ["f"], shape=list(small)), Node.make("Add", ["z", "f"], ["w"]),
    ], ["y", "w"])
    out = fold_constants(g)
    assert ops(out) == ["Expand", "Add", "Add"]
    assert "f" in out.constants and "e" not in out.constants
    assert sum(v.nbytes for v in out.constants.values()) < 8192
    assert_same(g, out, rng)


def _dequantized(rng):
    """A weight DequantizeLinear'd per channel (axis 0) and an activation DequantizeLinear'd per tensor."""
    q = rng.integers(-127, 128, (3, 4)).astype(np.int8)
    return graph({"x": f32(N, 4), "xq": TensorType(DType.U8, (N, 4))}, {"wq": q}, [
        Node.make("DequantizeLinear", ["wq"], ["w"], scale=[0.5, 0.25, 0.125], zero_point=[0, 0, 0], axis=0),
        Node.make("DequantizeLinear", ["xq"], ["xd"], scale=[0.1], zero_point=[128]),
        Node.make("Add", ["x", "xd"], ["s"]),
        Node.make("Transpose", ["w"], ["wt"], perm=[1, 0]),
        Node.make("MatMul", ["s", "wt"], ["y"]),
    ], ["y"])


def test_fold_constants_leaves_a_weights_dequantize_for_fuse_qdq(rng):
    g = _dequantized(rng)
    assert "DequantizeLinear" in ops(fold_constants(g))


def test_fold_dequantized_weights_folds_the_weights_and_what_they_make_constant(rng):
    g = _dequantized(rng)
    out = fold_dequantized_weights(g)
    assert ops(out) == ["DequantizeLinear", "Add", "MatMul"]  # the activation's stays; the Transpose folds too
    want = g.constants["wq"].astype(np.float32) * np.array([[0.5], [0.25], [0.125]], np.float32)
    np.testing.assert_array_equal(out.constants["wt"], want.T)
    assert out.constants["wt"].dtype == np.float32
    assert_same(g, out, rng)
