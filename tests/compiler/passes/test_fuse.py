import math

import pytest

from cuvil.compiler import N, Node
from cuvil.compiler.ops.fused import ACTIVATIONS, parse_program
from cuvil.compiler.passes import fuse

from .graphs import assert_same, f32, graph, ops, weights

CONV = dict(strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])


def test_conv_bias_residual_activation_become_one_fused_conv(rng):
    g = graph({"x": f32(N, 4, 5, 5)}, {"w": weights(rng, 4, 4, 3, 3), "b": weights(rng, 1, 4, 1, 1)}, [
        Node.make("Conv", ["x", "w"], ["c"], **CONV),
        Node.make("Add", ["c", "b"], ["cb"]),
        Node.make("Add", ["x", "cb"], ["r"]),  # residual on the left, as torch writes x + f(x)
        Node.make("Relu", ["r"], ["y"])], ["y"])
    out = fuse(g)
    assert ops(out) == ["FusedConv"]
    node = out.nodes[0]
    assert node.outputs == ("y",) and node.inputs[0:2] == ("x", "w") and node.inputs[3] == "x"
    assert out.constants[node.inputs[2]].shape == (4,)
    a = node.attr
    assert (a["has_bias"], a["has_residual"], a["activation"], a["strides"]) == (1, 1, "Relu", (1, 1))
    assert_same(g, out, rng)


def test_existing_bias_and_relu6(rng):
    g = graph({"x": f32(1, 3, 6, 6)}, {"w": weights(rng, 6, 1, 3, 3), "b": weights(rng, 6)}, [
        Node.make("Conv", ["x", "w", "b"], ["c"], group=3, **CONV),
        Node.make("Clip", ["c"], ["y"], min=0.0, max=6.0)], ["y"])
    out = fuse(g)
    a = out.nodes[0].attr
    assert ops(out) == ["FusedConv"] and out.nodes[0].inputs == ("x", "w", "b")
    assert (a["activation"], a["act_alpha"], a["act_beta"], a["group"]) == ("Clip", 0.0, 6.0, 3)
    assert_same(g, out, rng)


def test_residual_without_bias_is_input_2(rng):
    g = graph({"x": f32(1, 2, 4, 4)}, {"w": weights(rng, 2, 2, 3, 3)}, [
        Node.make("Conv", ["x", "w"], ["c"], **CONV), Node.make("Add", ["c", "x"], ["y"])], ["y"])
    out = fuse(g)
    a = out.nodes[0].attr
    assert out.nodes[0].inputs == ("x", "w", "x") and (a["has_bias"], a["has_residual"], a["activation"]) == (0, 1, "none")
    assert_same(g, out, rng)


ACT_NODES = {
    "Relu": {}, "Clip": {"min": -1.0, "max": 2.0}, "LeakyRelu": {"alpha": 0.1}, "Sigmoid": {}, "Tanh": {},
    "SiLU": {}, "HardSwish": {}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "Gelu": {"approximate": "none"},
    "GeluTanh": {"approximate": "tanh"},
}


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_gemm_with_every_activation(rng, act):
    op = ACTIVATIONS[act].op
    g = graph({"x": f32(N, 5)}, {"w": weights(rng, 3, 5), "c": weights(rng, 3), "bias": weights(rng, 1, 3)}, [
        Node.make("Gemm", ["x", "w", "c"], ["m"], transB=1, beta=0.5),
        Node.make("Add", ["m", "bias"], ["mb"]),
        Node.make(op, ["mb"], ["y"], **ACT_NODES[act])], ["y"])
    out = fuse(g)
    assert ops(out) == ["FusedGemm"]
    a = out.nodes[0].attr
    assert a["activation"] == act and a["beta"] == 1.0 and a["has_bias"] == 1 and a["transB"] == 1
    assert_same(g, out, rng)


def test_no_fusion_across_a_shared_or_exported_value(rng):
    consts = {"w": weights(rng, 3, 4)}
    shared = graph({"x": f32(2, 4)}, consts, [
        Node.make("Gemm", ["x", "w"], ["m"], transB=1), Node.make("Relu", ["m"], ["r"]),
        Node.make("Add", ["m", "r"], ["y"])], ["y"])
    assert ops(fuse(shared)) == ["Gemm", "FusedElementwise"]
    exported = graph({"x": f32(2, 4)}, consts, [
        Node.make("Gemm", ["x", "w"], ["m"], transB=1), Node.make("Relu", ["m"], ["y"])], ["y", "m"])
    assert fuse(exported) is exported


def test_resnet_downsample_block(rng):
    """Add(conv2, downsample): one conv takes the other's result as its residual; order stays valid."""
    g = graph({"x": f32(1, 4, 6, 6)}, {"w1": weights(rng, 8, 4, 3, 3), "w2": weights(rng, 8, 8, 3, 3),
                                        "wd": weights(rng, 8, 4, 1, 1), "b": weights(rng, 8)}, [
        Node.make("Conv", ["x", "w1", "b"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1]),
        Node.make("Relu", ["c1"], ["r1"]),
        Node.make("Conv", ["r1", "w2", "b"], ["c2"], **CONV),
        Node.make("Conv", ["x", "wd"], ["d"], strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1]),
        Node.make("Add", ["c2", "d"], ["s"]),
        Node.make("Relu", ["s"], ["y"])], ["y"])
    out = fuse(g)
    assert ops(out) == ["FusedConv", "Conv", "FusedConv"]
    assert out.nodes[2].attr["has_residual"] == 1 and out.nodes[2].attr["activation"] == "Relu"
    assert_same(g, out, rng)


def test_elementwise_chain_becomes_one_program(rng):
    g = graph({"x": f32(N, 4), "s": f32(4)}, {"b": weights(rng, 4)}, [
        Node.make("Mul", ["x", "s"], ["m"]),
        Node.make("Add", ["m", "b"], ["a"]),
        Node.make("Sigmoid", ["a"], ["g"]),
        Node.make("Mul", ["x", "g"], ["y"])], ["y"])
    out = fuse(g)
    assert ops(out) == ["FusedElementwise"] and out.nodes[0].inputs == ("x", "s", "b")
    assert out.nodes[0].attr["program"] == "Mul(0,1);Add(3,2);Sigmoid(4);Mul(0,5)"
    assert_same(g, out, rng)


def test_trees_join_and_branches_stop(rng):
    g = graph({"a": f32(3, 4), "b": f32(3, 4)}, {}, [
        Node.make("Relu", ["a"], ["ra"]),
        Node.make("Exp", ["b"], ["eb"]),
        Node.make("Clip", ["eb"], ["cb"], max=3.0),
        Node.make("Add", ["ra", "cb"], ["s"]),  # s is read twice: the group ends here
        Node.make("Neg", ["s"], ["n"]),
        Node.make("Mul", ["s", "n"], ["y"])], ["y"])
    out = fuse(g)
    assert ops(out) == ["FusedElementwise", "FusedElementwise"]
    assert out.nodes[0].attr["program"] == "Relu(0);Exp(1);Clip{max=3.0,min=-inf}(3);Add(2,4)"
    assert out.nodes[1].attr["program"] == "Neg(0);Mul(0,1)"
    assert_same(g, out, rng)


def test_fuse_is_idempotent_and_inlines_fused_programs(rng):
    g = graph({"x": f32(2, 3)}, {}, [
        Node.make("FusedElementwise", ["x"], ["t"], program="Tanh(0);Abs(1)"),
        Node.make("Sqrt", ["t"], ["y"])], ["y"])
    once = fuse(g)
    assert ops(once) == ["FusedElementwise"] and once.nodes[0].attr["program"] == "Tanh(0);Abs(1);Sqrt(2)"
    assert fuse(once) is once
    assert_same(g, once, rng)


def test_fused_program_is_parseable_back():
    steps = parse_program("Mul(0,1);Add(3,2);Clip{max=6.0,min=0.0}(4)")
    assert [s.op for s in steps] == ["Mul", "Add", "Clip"] and steps[2].attrs == (("max", 6.0), ("min", 0.0))
    assert math.isinf(parse_program("Clip{max=1.0}(0)")[0].attrs[1][1])
