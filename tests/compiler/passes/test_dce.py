import numpy as np

from cuvil.compiler import N, Node
from cuvil.compiler.passes import dce

from .graphs import assert_same, f32, graph, ops, weights


def test_dead_nodes_and_their_constants_go(rng):
    g = graph({"x": f32(N, 4), "unused": f32(2)}, {"w": weights(rng, 4), "dead_w": weights(rng, 4)}, [
        Node.make("Mul", ["x", "w"], ["y"]),
        Node.make("Add", ["x", "dead_w"], ["d1"]),
        Node.make("Relu", ["d1"], ["d2"])], ["y"])
    out = dce(g)
    assert ops(out) == ["Mul"] and set(out.constants) == {"w"}
    assert out.inputs == ("x", "unused")  # the interface stays
    assert "d1" not in out.types and "dead_w" not in out.types
    assert_same(g, out, rng)


def test_a_node_with_one_live_output_stays(rng):
    g = graph({"x": f32(6, 2)}, {}, [
        Node.make("Split", ["x"], ["a", "b"], axis=0, split=[2, 4]), Node.make("Neg", ["a"], ["y"])], ["y"])
    out = dce(g)
    assert out is g


def test_unused_constants_alone():
    g = graph({"x": f32(2)}, {"k": np.ones(2, np.float32)}, [Node.make("Relu", ["x"], ["y"])], ["y"])
    out = dce(g)
    assert ops(out) == ["Relu"] and not out.constants
