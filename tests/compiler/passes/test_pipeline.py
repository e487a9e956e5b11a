import numpy as np
import pytest

from cuvil.compiler import N, Node
from cuvil.compiler.errors import VerifyError
from cuvil.compiler.passes import (DEFAULT_PIPELINE, conv_transpose, crop_taps, dce, fold_batchnorm, fold_constants,
                                   fold_dequantized_weights, fuse, fuse_qdq, optimize, share_constants, simplify,
                                   split_groups)

from .graphs import assert_same, f32, graph, ops, weights


def test_default_pipeline_is_a_visible_tuple():
    assert DEFAULT_PIPELINE == (fold_constants, share_constants, simplify, fold_batchnorm, fuse_qdq, fold_dequantized_weights, conv_transpose,
                                crop_taps, split_groups, fuse, dce)


def test_conv_bn_relu6_with_computed_bn_parameters(rng):
    """fold_constants exposes BN parameters, BN folds into the conv, fuse takes the ReLU6, dce the rest."""
    var = np.abs(weights(rng, 4)) + 0.5
    g = graph({"x": f32(N, 3, 5, 5)}, {"w": weights(rng, 4, 3, 3, 3), "s": weights(rng, 4) + 1, "b": weights(rng, 4),
                                        "m": weights(rng, 4), "v2": var * 2, "half": np.full(4, 0.5, np.float32)}, [
        Node.make("Mul", ["v2", "half"], ["v"]),
        Node.make("Conv", ["x", "w"], ["c"], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1]),
        Node.make("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
        Node.make("Clip", ["n"], ["y"], min=0.0, max=6.0)], ["y"])
    out = optimize(g, verify_each=True)
    assert ops(out) == ["FusedConv"] and len(out.constants) == 2
    assert_same(g, out, rng)


def test_verify_each_names_the_pass_that_broke_the_graph(rng):
    g = graph({"x": f32(2)}, {}, [Node.make("Relu", ["x"], ["y"])], ["y"])

    def broken(graph):
        return graph.replace(outputs=("nowhere",))

    with pytest.raises(VerifyError, match="after pass broken"):
        optimize(g, passes=(dce, broken), verify_each=True)
    assert optimize(g, passes=()) is g


ZOO_EXPECT = {"mlp": {"FusedGemm": 2, "Gemm": 1}, "small_cnn": {"FusedConv": 2}, "resnet18": {"FusedConv": 17}}


@pytest.mark.parametrize("name", sorted(ZOO_EXPECT))
def test_zoo_models_keep_their_outputs(name):
    pytest.importorskip("torch")
    zoo = pytest.importorskip("tests.zoo")
    frontend = pytest.importorskip("cuvil.compiler.frontends.torch")
    model, example = zoo.ZOO[name]()
    g = frontend.import_torch(model, example)
    out = optimize(g, verify_each=True)
    counts = {op: ops(out).count(op) for op in ZOO_EXPECT[name]}
    assert counts == ZOO_EXPECT[name]
    assert "BatchNormalization" not in ops(out) and len(out.nodes) < len(g.nodes)
    assert_same(g, out, np.random.default_rng(0), tol=1e-5, trials=1)


def test_the_result_owns_constants_that_kept_a_mostly_unused_buffer_alive(rng):
    """A bundle's weights are views of the file's bytes: a constant no pass replaced must not keep the
    whole buffer alive, but views that cover most of it stay views (a copy would hold both)."""
    big = weights(rng, 1000)
    big.flags.writeable = False
    small = np.zeros(10, np.float32)
    small.flags.writeable = False
    g = graph({"x": f32(N, 8)}, {"a": big[:8], "b": big[8:16], "c": small[:8]}, [
        Node.make("Add", ["x", "a"], ["y"]), Node.make("Mul", ["y", "b"], ["z"]), Node.make("Add", ["z", "c"], ["o"])],
        ["o"])
    assert np.shares_memory(g.constants["a"], big) and np.shares_memory(g.constants["c"], small)
    out = optimize(g, passes=(dce,))
    assert not np.shares_memory(out.constants["a"], big) and not np.shares_memory(out.constants["b"], big)
    assert np.array_equal(out.constants["a"], big[:8]) and not out.constants["a"].flags.writeable
    assert np.shares_memory(out.constants["c"], small)  # 8 of its 10 floats: left a view
    assert_same(g, out, rng)


def test_views_of_one_buffer_through_memoryviews_count_together(rng):
    """numpy gives each ``frombuffer`` array a memoryview of its own: views of one buffer that cover most
    of it stay views (a bundle read from memory), one covering little of it is copied."""
    w = weights(rng, 64)
    view = memoryview(w.tobytes() + bytes(16))  # as a bundle reader holds the bytes it verified
    a = np.frombuffer(view, np.float32, count=32)
    b = np.frombuffer(view, np.float32, count=32, offset=128)
    assert a.base is not b.base
    g = graph({"x": f32(N, 32)}, {"a": a, "b": b}, [Node.make("Add", ["x", "a"], ["y"]), Node.make("Mul", ["y", "b"], ["o"])],
              ["o"])
    out = optimize(g, passes=(dce,))
    assert np.shares_memory(out.constants["a"], a) and np.shares_memory(out.constants["b"], b)
    lone = graph({"x": f32(N, 32)}, {"a": a}, [Node.make("Add", ["x", "a"], ["o"])], ["o"])
    alone = optimize(lone, passes=(dce,))
    assert not np.shares_memory(alone.constants["a"], a) and np.array_equal(alone.constants["a"], a)
