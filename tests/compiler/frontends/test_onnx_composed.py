"""ONNX import of Hardmax, OneHot, LpNormalization, Instance/GroupNormalization and integer Clip (composed of op-table ops), run by
the reference interpreter against ONNX Runtime."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper

from cuvil.compiler.errors import UnsupportedModelError
from cuvil.compiler.frontends.onnx import OnnxImportError, import_onnx
from cuvil.edge_runtime.compile import compile_graph

from .test_onnx_frontend import check as check_against_ort
from .test_onnx_frontend import make_model, run_ort

F = TensorProto.FLOAT
check = functools.partial(check_against_ort, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opset, axis", [(11, 0), (11, 1), (11, 2), (13, 0), (13, -1), (13, 1)])
def test_hardmax_picks_the_first_largest(opset, axis):
    x = np.array([[[1, 3, 3], [2, 2, 0]], [[5, 5, 5], [0, -1, 7]]], np.float32)  # ties: the first wins
    node = helper.make_node("Hardmax", ["x"], ["y"], axis=axis)
    check(make_model([node], {"x": (F, [2, 2, 3])}, ["y"], opset=opset), {"x": x})


@pytest.mark.parametrize("axis", [1, 2])
def test_hardmax_of_an_empty_tensor_is_empty(axis):
    """An empty axis (or another empty one): ArgMax refused it and the model did not import."""
    node = helper.make_node("Hardmax", ["x"], ["y"], axis=axis)
    model = make_model([node], {"x": (F, [2, 0, 3])}, ["y"], opset=13)
    graph = check(model, {"x": np.zeros((2, 0, 3), np.float32)})
    assert compile_graph(graph, use_cache=False).run({"x": np.zeros((2, 0, 3), np.float32)})[graph.outputs[0]].shape == (2, 0, 3)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("itype, idx", [(TensorProto.INT64, [[0, -1, 2], [-3, 1, 5]]),
                                        (F, [[0.0, 1.7, 2.0], [1.0, -1.0, 3.0]])])
def test_one_hot_wraps_negative_indices_and_drops_outside_ones(opset, axis, itype, idx):
    kind = np.int64 if itype == TensorProto.INT64 else np.float32  # type pairs ONNX Runtime implements
    idx = np.array(idx, kind)
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis)
    inits = {"depth": np.array(3, kind), "values": np.array([-2, 9], np.float32)}
    check(make_model([node], {"i": (itype, [2, 3])}, ["y"], inits, opset=opset), {"i": idx})


def test_one_hot_refuses_a_non_positive_depth():
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"])
    inits = {"depth": np.array(0, np.int64), "values": np.array([0, 1], np.float32)}
    with pytest.raises(OnnxImportError, match="depth"):
        import_onnx(make_model([node], {"i": (TensorProto.INT64, [2])}, ["y"], inits, opset=11))


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization_keeps_zero_lines_zero(rng, p, axis):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[1, :] = 0
    x[:, 2] = 0
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)
    check(make_model([node], {"x": (F, [3, 4])}, ["y"], opset=17), {"x": x})


@pytest.mark.parametrize("bounds", [("lo", "hi"), ("lo", ""), ("", "hi")])
def test_clip_of_integers(bounds):
    x = np.array([-128, -5, 0, 3, 127], np.int8)
    node = helper.make_node("Clip", ["x", *bounds], ["y"])
    inits = {k: np.array(v, np.int8) for k, v in (("lo", -4), ("hi", 2)) if k in bounds}
    check(make_model([node], {"x": (TensorProto.INT8, [5])}, ["y"], inits, opset=13), {"x": x})


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 7)])
def test_instance_normalization(rng, shape):
    c = shape[1]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)
    inits = {"s": rng.standard_normal(c).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32)}
    check(make_model([node], {"x": (F, list(shape))}, ["y"], inits, opset=17),
          {"x": rng.standard_normal(shape).astype(np.float32)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_per_group_then_per_channel_scale(rng, opset):
    n, c, groups = 2, 6, 3
    width = groups if opset < 21 else c  # version 18 scales per group, version 21 per channel
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-4)
    inits = {"s": rng.standard_normal(width).astype(np.float32), "b": rng.standard_normal(width).astype(np.float32)}
    check(make_model([node], {"x": (F, [n, c, 4, 3])}, ["y"], inits, opset=opset),
          {"x": rng.standard_normal((n, c, 4, 3)).astype(np.float32)}, rtol=1e-4, atol=1e-5)


def test_group_normalization_refuses_uneven_groups():
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=4)
    inits = {"s": np.ones(6, np.float32), "b": np.zeros(6, np.float32)}
    with pytest.raises(OnnxImportError, match="groups"):
        import_onnx(make_model([node], {"x": (F, [1, 6, 2])}, ["y"], inits, opset=21))


@pytest.mark.parametrize("equation, shapes", [
    ("ij->ji", [(3, 4)]), ("ij->i", [(3, 4)]), ("i,i", [(5,), (5,)]), ("bij, bjk -> bik", [(5, 2, 3), (5, 3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]), ("...ij,...jk->...ik", [(2, 1, 2, 3), (2, 4, 3, 2)]), ("i,j->ij", [(2,), (3,)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)])])
def test_einsum(rng, equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    check(make_model([node], {n: (F, list(s)) for n, s in zip(names, shapes)}, ["y"], opset=17),
          {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation, shapes", [("ii->i", [(3, 3)]), ("ii", [(4, 4)]), ("bii->bi", [(2, 3, 3)]),
                                              ("iii->i", [(3, 3, 3)]), ("iij,jk->ik", [(2, 2, 3), (3, 4)])])
def test_einsum_diagonals(rng, equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    feeds["x0"].reshape(-1)[1] = np.inf  # off the diagonal: it must not reach the sum
    check(make_model([node], {n: (F, list(s)) for n, s in zip(names, shapes)}, ["y"], opset=17), feeds,
          rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation", ["i0,i", "ij->j->i", "i,i->k", "ij,jk"])
def test_einsum_refuses_malformed_equations(equation):
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)
    with pytest.raises(OnnxImportError, match="Einsum"):
        import_onnx(make_model([node], {"a": (F, [2]), "b": (F, [2])}, ["y"], opset=17))


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis, k", [(-1, 3), (0, 2), (1, 3), (-1, 0)])
@pytest.mark.parametrize("dtype", [F, TensorProto.INT64])
def test_top_k_keeps_tied_elements_in_index_order(largest, axis, k, dtype):
    x = np.array([[[3, 1, 3, 2], [0, 0, 5, 5], [2, 2, 2, 2]], [[1, 3, 3, 1], [4, 4, 0, 4], [7, 1, 7, 1]]])
    x = x.astype(np.float32 if dtype == F else np.int64)
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    model = make_model([node], {"x": (dtype, [2, 3, 4])}, ["values", "indices"], {"k": np.array([k], np.int64)}, opset=11)
    check(model, {"x": x})
    graph = import_onnx(model)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})
    for name, want in zip(graph.outputs, run_ort(model, {"x": x}).values()):
        np.testing.assert_array_equal(native[name], want)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [2, 5])
def test_top_k_ranks_nan_above_every_number(largest, k):
    """NaN beat nothing and tied nothing, so ranks repeated and values vanished ([1, nan, 2, 0.5] lost
    its 2 and gave index 0 twice); as ONNX Runtime (and NumPy's sort) orders them, NaN is the largest."""
    nan = np.nan
    x = np.array([[1, nan, 2, 0.5, -1], [nan, 5, nan, 3, 4], [nan, nan, nan, nan, nan], [2, -np.inf, np.inf, nan, 2]],
                 np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=largest)
    model = make_model([node], {"x": (F, [4, 5])}, ["values", "indices"], {"k": np.array([k], np.int64)}, opset=11)
    graph = import_onnx(model)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})
    for name, want in zip(graph.outputs, run_ort(model, {"x": x}).values()):
        np.testing.assert_array_equal(native[name], want)
    order = [[1, 2, 0, 3, 4], [0, 2, 1, 4, 3], [0, 1, 2, 3, 4], [3, 2, 0, 4, 1]] if largest else \
        [[4, 3, 0, 2, 1], [3, 4, 1, 0, 2], [0, 1, 2, 3, 4], [1, 0, 4, 2, 3]]
    np.testing.assert_array_equal(native[graph.outputs[1]], np.array(order)[:, :k])


def test_top_k_refuses_k_beyond_the_axis():
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0)
    with pytest.raises(OnnxImportError, match="TopK"):
        import_onnx(make_model([node], {"x": (F, [3, 2])}, ["v", "i"], {"k": np.array([4], np.int64)}, opset=11))


def _native_matches_ort(model, feeds):
    graph = import_onnx(model)
    native = compile_graph(graph, optimize=False).run(dict(zip(graph.inputs, feeds.values())))
    for name, want in zip(graph.outputs, run_ort(model, feeds).values()):
        np.testing.assert_allclose(native[name], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress_gathers_the_constant_conditions_true_positions(rng, axis):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Compress", ["x", "c"], ["y"], **({} if axis is None else {"axis": axis}))
    model = make_model([node], {"x": (F, [3, 4])}, ["y"], {"c": np.array([0, 1, 1], bool)}, opset=11)
    check(model, {"x": x})
    _native_matches_ort(model, {"x": x})


def test_max_unpool_puts_values_at_their_indices(rng):
    """Without output_shape as ONNX Runtime; with it, ONNX's rule (the inferred shape's layout, then
    zeros at the end), which ONNX's conformance case expects and ONNX Runtime does not follow."""
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    p, i = run_ort(make_model([pool], {"x": (F, [1, 2, 4, 4])}, ["p", "i"], opset=11), {"x": x}).values()
    ins = {"p": (F, [1, 2, 2, 2]), "i": (TensorProto.INT64, [1, 2, 2, 2])}
    unpool = helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    check(make_model([unpool], ins, ["y"], opset=11), {"p": p, "i": i})
    _native_matches_ort(make_model([unpool], ins, ["y"], opset=11), {"p": p, "i": i})
    unpool = helper.make_node("MaxUnpool", ["p", "i", "shape"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    graph = import_onnx(make_model([unpool], ins, ["y"], {"shape": np.array([1, 2, 5, 5], np.int64)}, opset=11))
    want = np.zeros(32, np.float32)
    want[i.reshape(-1)] = p.reshape(-1)
    want = np.pad(want.reshape(1, 2, 4, 4), [(0, 0), (0, 0), (0, 1), (0, 1)])
    np.testing.assert_array_equal(compile_graph(graph, optimize=False).run({"p": p, "i": i})[graph.outputs[0]], want)


@pytest.mark.parametrize("time_axis", [0, 1])
def test_reverse_sequence_reverses_each_rows_prefix(rng, time_axis):
    shape = [4, 3, 2] if time_axis == 0 else [3, 4, 2]
    x = rng.standard_normal(shape).astype(np.float32)
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], time_axis=time_axis, batch_axis=1 - time_axis)
    model = make_model([node], {"x": (F, shape), "lens": (TensorProto.INT64, [3])}, ["y"], opset=10)
    feeds = {"x": x, "lens": np.array([4, 1, 2], np.int64)}
    check(model, feeds)
    _native_matches_ort(model, feeds)


def test_dropout_mask_is_all_true_without_training(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("Dropout", ["x", "r"], ["y", "mask"])
    check(make_model([node], {"x": (F, [2, 3])}, ["y", "mask"], {"r": np.array(0.3, np.float32)}, opset=13), {"x": x})


@pytest.mark.parametrize("shape", [(2, 2), (3, 3, 3), (2, 1, 4, 4), (5, 5)])
def test_det_matches_onnxruntime(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    node = helper.make_node("Det", ["x"], ["y"])
    model = make_model([node], {"x": (F, list(shape))}, ["y"], opset=11)
    check(model, {"x": x}, rtol=1e-4, atol=1e-5)
    graph = import_onnx(model)
    native = compile_graph(graph, optimize=False).run({graph.inputs[0]: x})[graph.outputs[0]]
    np.testing.assert_allclose(native, next(iter(run_ort(model, {"x": x}).values())), rtol=1e-4, atol=1e-5)


def test_det_of_large_matrices_is_unsupported():
    node = helper.make_node("Det", ["x"], ["y"])
    with pytest.raises(UnsupportedModelError, match="Det"):
        import_onnx(make_model([node], {"x": (F, [6, 6])}, ["y"], opset=11))
