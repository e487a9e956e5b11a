"""Native Trilu, GatherElements, CumSum/Prod, ReduceMin/Prod, ArgMax/Min and the scatters against the reference
(``test_nvptx`` re-runs them on the simulated GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler.errors import RunTimeCheckError

from tests.compiler.codegen.test_kernels import rnd, run_op


@pytest.mark.parametrize("upper, k", [(1, 0), (0, 0), (1, -2), (0, 3)])
def test_trilu(upper, k):
    run_op("Trilu", [rnd(2, 5, 7, seed=1)], upper=upper, k=k)
    run_op("Trilu", [rnd(4, 3, dtype=np.int64, seed=2)], upper=upper, k=k)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_elements(axis):
    x = rnd(3, 4, 5, seed=3)
    idx = np.random.default_rng(axis).integers(-x.shape[axis], x.shape[axis], size=(3, 4, 5)).astype(np.int64)
    run_op("GatherElements", [x, idx], axis=axis)
    run_op("GatherElements", [x.astype(np.float16), idx.astype(np.int32)], axis=axis)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_cumsum(exclusive, reverse, dtype):
    run_op("CumSum", [rnd(3, 6, 4, dtype=dtype, seed=4)], axis=1, exclusive=exclusive, reverse=reverse)
    run_op("CumProd", [rnd(3, 6, 4, dtype=dtype, seed=5)], axis=1, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("axes, keepdims", [((), 1), ((1,), 0), ((0, 2), 1), ((-1,), 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_reduce_min_prod(op, axes, keepdims, dtype):
    lo, hi = (0.5, 1.5) if op == "ReduceProd" else (-3, 3)
    run_op(op, [rnd(3, 4, 5, dtype=dtype, lo=lo, hi=hi, seed=5)], axes=axes, keepdims=keepdims)


def test_reduce_min_of_bools_and_unsigned():
    run_op("ReduceMin", [rnd(4, 6, dtype=np.bool_, seed=6)], axes=(1,), keepdims=0)
    run_op("ReduceMin", [rnd(4, 6, dtype=np.uint8, lo=0, hi=9, seed=7)], axes=(0,), keepdims=1)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keepdims, last", [(0, 1, 0), (1, 0, 1), (2, 1, 1), (-1, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_arg_extremes(op, axis, keepdims, last, dtype):
    x = rnd(3, 5, 4, dtype=dtype, lo=0, hi=2, seed=8)  # few distinct values: ties
    run_op(op, [x], axis=axis, keepdims=keepdims, select_last_index=last)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8])
def test_scatter(reduction, dtype):
    """Repeated indices reduce in order; indices smaller than data off the axis."""
    x, upd = rnd(4, 5, 3, dtype=dtype, lo=0, hi=9, seed=12), rnd(3, 2, 3, dtype=dtype, lo=0, hi=9, seed=13)
    idx = np.array([[[0, 1, 1], [-1, 4, 0]], [[2, 2, 2], [1, -5, 0]], [[0, 0, 0], [3, 3, 3]]], np.int64)
    run_op("ScatterElements", [x, idx, upd], axis=1, reduction=reduction)
    nd = np.array([[1, -1], [0, 3], [1, 4]], np.int32)
    run_op("ScatterND", [x, nd, rnd(3, 3, dtype=dtype, lo=0, hi=9, seed=14)], reduction=reduction)
    run_op("ScatterND", [x, nd[:, :1], rnd(3, 5, 3, dtype=dtype, lo=0, hi=9, seed=15)], reduction=reduction)


def test_scatter_refuses_indices_outside_the_axis():
    x = rnd(3, 4, seed=16)
    sess = run_op("ScatterElements", [x, np.array([[0, 1]], np.int64), np.ones((1, 2), np.float32)], axis=1)
    with pytest.raises(RunTimeCheckError, match="a gather or scatter op"):  # it named Gather only
        sess.run({"x0": x, "x1": np.array([[0, 4]], np.int64), "x2": np.ones((1, 2), np.float32)})
    sess = run_op("ScatterND", [x, np.array([[2, -4]], np.int64), np.ones(1, np.float32)])
    with pytest.raises(RunTimeCheckError):
        sess.run({"x0": x, "x1": np.array([[-4, 0]], np.int64), "x2": np.ones(1, np.float32)})
    got = sess.run({"x0": x, "x1": np.array([[-3, 3]], np.int64), "x2": np.full(1, 9, np.float32)})
    want = x.copy()
    want[0, 3] = 9
    np.testing.assert_array_equal(next(iter(got.values())), want)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims):
    x = rnd(2, 4, 3, seed=17)
    idx = np.array([[[1, -1], [0, 2]], [[-2, 0], [1, 1]]], np.int64)
    run_op("GatherND", [x, idx[..., :1] if batch_dims else idx], batch_dims=batch_dims)
    sess = run_op("GatherND", [x, idx], batch_dims=batch_dims)
    with pytest.raises(RunTimeCheckError):
        bad = idx.copy()
        bad[0, 0, 0] = 9
        sess.run({"x0": x, "x1": bad})


@pytest.mark.parametrize("shape, perm", [((1, 37, 50), (0, 2, 1)), ((2, 16, 17, 3), (0, 2, 3, 1)),
                                         ((3, 19, 33), (0, 2, 1)), ((33, 40), (1, 0))])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_transposes_of_the_last_two_axes_go_by_tiles(shape, perm, dtype):
    """Big enough to be read tile by tile (16 x 16, partial tiles at both edges, batch axes in front)."""
    x = rnd(*shape, dtype=dtype, seed=3)
    got = next(iter(run_op("Transpose", [x], perm=perm).run({"x0": x}).values()))
    np.testing.assert_array_equal(got, np.transpose(x, perm))
