import numpy as np
import pytest

from cuvil.compiler import N, Node
from cuvil.compiler.passes import fold_batchnorm

from .graphs import assert_same, f32, graph, ops, weights


def bn_params(rng, c: int, prefix: str = "bn") -> dict[str, np.ndarray]:
    return {f"{prefix}.scale": weights(rng, c) + 1, f"{prefix}.b": weights(rng, c),
            f"{prefix}.mean": weights(rng, c), f"{prefix}.var": np.abs(weights(rng, c)) + 0.5}


def bn(x: str, y: str, prefix: str = "bn", eps: float = 1e-3) -> Node:
    return Node.make("BatchNormalization", [x] + [f"{prefix}.{k}" for k in ("scale", "b", "mean", "var")], [y],
                     epsilon=eps)


CONV = dict(strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])


@pytest.mark.parametrize("group,bias", [(1, False), (1, True), (4, True)])
def test_bn_after_conv_folds_into_weights_and_bias(rng, group, bias):
    consts = {"w": weights(rng, 8, 4 // group, 3, 3), **bn_params(rng, 8)}
    if bias:
        consts["b"] = weights(rng, 8)
    g = graph({"x": f32(N, 4, 6, 6)}, consts, [
        Node.make("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], group=group, **CONV),
        bn("c", "y"), Node.make("Relu", ["y"], ["z"])], ["z"])
    out = fold_batchnorm(g)
    assert ops(out) == ["Conv", "Relu"]
    conv = out.nodes[0]
    assert conv.outputs == ("y",) and len(conv.inputs) == 3 and conv.attr["group"] == group
    assert all(i in out.constants for i in conv.inputs[1:])
    assert_same(g, out, rng)


@pytest.mark.parametrize("trans_b,with_c,beta", [(1, True, 1.0), (0, False, 1.0), (0, True, 0.5)])
def test_bn_after_gemm_folds(rng, trans_b, with_c, beta):
    w = weights(rng, 6, 5) if trans_b else weights(rng, 5, 6)
    consts = {"w": w, **bn_params(rng, 6)}
    if with_c:
        consts["c"] = weights(rng, 1, 6)
    g = graph({"x": f32(N, 5)}, consts, [
        Node.make("Gemm", ["x", "w"] + (["c"] if with_c else []), ["m"], transB=trans_b, beta=beta, alpha=0.7),
        bn("m", "y")], ["y"])
    out = fold_batchnorm(g)
    assert ops(out) == ["Gemm"] and out.nodes[0].attr["beta"] == 1.0 and out.nodes[0].outputs == ("y",)
    assert_same(g, out, rng)


def test_lone_bn_becomes_mul_add(rng):
    g = graph({"x": f32(N, 3, 4, 4)}, bn_params(rng, 3), [bn("x", "y")], ["y"])
    out = fold_batchnorm(g)
    assert ops(out) == ["Mul", "Add"] and out.nodes[-1].outputs == ("y",)
    assert out.types[out.nodes[0].inputs[1]].shape == (3, 1, 1)
    assert_same(g, out, rng)


def test_bn_on_rank_2(rng):
    g = graph({"x": f32(N, 7)}, bn_params(rng, 7), [Node.make("Relu", ["x"], ["r"]), bn("r", "y")], ["y"])
    out = fold_batchnorm(g)
    assert ops(out) == ["Relu", "Mul", "Add"]
    assert_same(g, out, rng)


def test_conv_read_twice_keeps_its_result_and_bn_becomes_mul_add(rng):
    g = graph({"x": f32(1, 2, 5, 5)}, {"w": weights(rng, 3, 2, 3, 3), **bn_params(rng, 3)}, [
        Node.make("Conv", ["x", "w"], ["c"], **CONV), bn("c", "y"), Node.make("Add", ["y", "c"], ["z"])], ["z"])
    out = fold_batchnorm(g)
    assert ops(out) == ["Conv", "Mul", "Add", "Add"] and out.nodes[0] == g.nodes[0]
    assert_same(g, out, rng)


def test_conv_output_that_is_a_graph_output_is_not_folded(rng):
    g = graph({"x": f32(1, 2, 5, 5)}, {"w": weights(rng, 3, 2, 3, 3), **bn_params(rng, 3)}, [
        Node.make("Conv", ["x", "w"], ["c"], **CONV), bn("c", "y")], ["y", "c"])
    out = fold_batchnorm(g)
    assert ops(out) == ["Conv", "Mul", "Add"]
    assert_same(g, out, rng)


def test_bn_with_runtime_parameters_is_left_alone(rng):
    params = bn_params(rng, 3)
    scale = params.pop("bn.scale")
    g = graph({"x": f32(2, 3), "bn.scale": f32(3)}, params, [bn("x", "y")], ["y"])
    assert fold_batchnorm(g) is g
    assert scale.shape == (3,)
