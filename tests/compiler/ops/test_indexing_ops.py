"""Trilu, GatherElements, CumSum (CumProd by hand), ReduceMin, ReduceProd, ArgMax and ArgMin against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler.errors import ShapeError

from .ort_check import Const, assert_close, infer, randn, run_cuvil, run_ort


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-2, 0, 3])
def test_trilu(rng, upper, k):
    x = randn(rng, (2, 4, 5))
    assert_close(run_cuvil("Trilu", [x], upper=upper, k=k),
                 run_ort("Trilu", [x, Const(np.array(k, np.int64))], {"upper": upper}, opset=14), rtol=0, atol=0)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_takes_negative_indices(rng, axis):
    x = randn(rng, (3, 4))
    idx = rng.integers(-3, 3, size=(2, 4) if axis == 0 else (3, 2)).astype(np.int64)
    assert_close(run_cuvil("GatherElements", [x, idx], axis=axis),
                 run_ort("GatherElements", [x, idx], {"axis": axis}, opset=13), rtol=0, atol=0)


def test_gather_elements_refuses_out_of_range_indices():
    with pytest.raises(ShapeError, match="outside"):
        run_cuvil("GatherElements", [np.zeros((2, 2), np.float32), np.array([[0, 2]], np.int64)], axis=1)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum(rng, exclusive, reverse, dtype):
    x = (randn(rng, (3, 5)) * 10).astype(dtype)
    assert_close(run_cuvil("CumSum", [x], axis=1, exclusive=exclusive, reverse=reverse),
                 run_ort("CumSum", [x, Const(np.array(1, np.int64))], {"exclusive": exclusive, "reverse": reverse},
                         opset=14), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("exclusive, reverse, want", [
    (0, 0, [[2, 6, -24, -120]]), (1, 0, [[1, 2, 6, -24]]), (0, 1, [[-120, -60, -20, 5]]), (1, 1, [[-60, -20, 5, 1]])])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumprod_by_hand(exclusive, reverse, want, dtype):
    """ONNX Runtime 1.32 has no CumProd (opset 26): products worked out by hand; the identity 1 is
    shifted in when exclusive."""
    x = np.array([[2, 3, -4, 5]], dtype)
    got = run_cuvil("CumProd", [x], axis=-1, exclusive=exclusive, reverse=reverse)
    np.testing.assert_array_equal(got[0], np.array(want, dtype))


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_min_and_prod(rng, op, keepdims):
    x = randn(rng, (3, 4, 5))
    assert_close(run_cuvil(op, [x], axes=(0, 2), keepdims=keepdims),
                 run_ort(op, [x, Const(np.array([0, 2], np.int64))], {"keepdims": keepdims}, opset=18), rtol=1e-6, atol=1e-7)


def test_empty_min_and_prod_are_their_identities():
    x = np.zeros((2, 0), np.float32)
    assert run_cuvil("ReduceMin", [x], axes=(1,), keepdims=0)[0].tolist() == [np.inf, np.inf]
    assert run_cuvil("ReduceProd", [x], axes=(1,), keepdims=0)[0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extremes_pick_the_first_or_last_tie(op, last):
    x = np.array([[1, 3, 3, 0], [2, 2, 0, 0]], np.int32)
    got, = run_cuvil(op, [x], axis=1, keepdims=0, select_last_index=last)
    want = {("ArgMax", 0): [1, 0], ("ArgMax", 1): [2, 1], ("ArgMin", 0): [3, 2], ("ArgMin", 1): [3, 3]}[op, last]
    assert got.tolist() == want
    assert_close([got], run_ort(op, [x], {"axis": 1, "keepdims": 0, "select_last_index": last}, opset=13), rtol=0, atol=0)


def test_arg_of_an_empty_axis_is_refused():
    with pytest.raises(ShapeError, match="empty"):
        infer("ArgMax", [(2, 0)], axis=1)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements_matches_onnxruntime(rng, reduction, axis):
    x, upd = randn(rng, (3, 4)), randn(rng, (2, 3))
    idx = rng.integers(-3 if axis == 0 else -4, 3 if axis == 0 else 4, size=(2, 3)).astype(np.int64)
    if reduction == "none":  # ONNX leaves the order of a repeated index open
        idx = np.array([[0, -1, 2], [1, 0, -2]], np.int64) if axis == 0 else np.array([[0, 3, -3], [1, 2, 0]], np.int64)
    attrs = {"axis": axis, "reduction": reduction}
    assert_close(run_cuvil("ScatterElements", [x, idx, upd], **attrs),
                 run_ort("ScatterElements", [x, idx, upd], attrs, opset=18), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_onnxruntime(rng, reduction):
    x, upd = randn(rng, (4, 3, 2)), randn(rng, (2, 2, 2))
    idx = np.array([[[0, 1], [3, -1]], [[-4, 1], [2, 0]]] if reduction != "none" else [[[0, 1], [3, -1]], [[1, 1], [2, 0]]],
                   np.int64)
    attrs = {"reduction": reduction}
    assert_close(run_cuvil("ScatterND", [x, idx, upd], **attrs),
                 run_ort("ScatterND", [x, idx, upd], attrs, opset=18), rtol=1e-6, atol=1e-6)


def test_scatter_refuses_indices_outside_the_axis_and_empty_data():
    with pytest.raises(ShapeError, match="outside"):
        run_cuvil("ScatterElements", [np.zeros((2, 2), np.float32), np.array([[0, 2]], np.int64),
                                      np.ones((1, 2), np.float32)], axis=1)
    with pytest.raises(ShapeError, match="outside"):
        run_cuvil("ScatterND", [np.zeros((2, 2), np.float32), np.array([[0, -3]], np.int64), np.ones(1, np.float32)])
    with pytest.raises(ShapeError, match="no elements"):
        run_cuvil("ScatterND", [np.zeros((0, 2), np.float32), np.zeros((1, 1), np.int64), np.ones((1, 2), np.float32)])


@pytest.mark.parametrize("batch_dims, dshape, ishape", [(0, (3, 4, 2), (2, 2)), (0, (3, 4), (2, 1, 2)),
                                                         (1, (2, 3, 4), (2, 2, 1)), (2, (2, 3, 4), (2, 3, 1))])
def test_gather_nd_matches_onnxruntime(rng, batch_dims, dshape, ishape):
    x = randn(rng, dshape)
    k = ishape[-1]
    idx = np.stack([rng.integers(-dshape[batch_dims + j], dshape[batch_dims + j], size=ishape[:-1]) for j in range(k)],
                   axis=-1).astype(np.int64)
    assert_close(run_cuvil("GatherND", [x, idx], batch_dims=batch_dims),
                 run_ort("GatherND", [x, idx], {"batch_dims": batch_dims}, opset=13), rtol=0, atol=0)
