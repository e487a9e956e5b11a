"""ReduceMean, ReduceSum, ReduceMax against ONNX Runtime (opset 18: axes as a constant input)."""

import numpy as np
import pytest

from cuvil.compiler import DType, N, TensorType
from cuvil.compiler.errors import ShapeError

from .ort_check import Const, assert_close, infer, run_cuvil, run_ort

OPS = ["ReduceMean", "ReduceSum", "ReduceMax"]


def ort_reduce(op, x, axes, keepdims):
    """ONNX form: axes is an int64 input from opset 18; an absent one means every axis."""
    inputs = [x] + ([Const(np.array(axes, dtype=np.int64))] if axes else [])
    return run_ort(op, inputs, {"keepdims": keepdims}, opset=18)


CASES = {
    "all_axes": ((2, 3, 4), ()),
    "one_axis": ((2, 3, 4), (1,)),
    "first_axis": ((2, 3, 4), (0,)),
    "negative_axis": ((2, 3, 4), (-1,)),
    "two_axes_unsorted": ((2, 3, 4, 5), (3, 1)),
    "mixed_signs": ((2, 3, 4, 5), (-1, 0)),
    "every_axis_listed": ((2, 3, 4), (0, 1, 2)),
    "spatial_mean": ((1, 8, 5, 5), (2, 3)),
    "vector": ((7,), (0,)),
}


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("op", OPS)
def test_reduce_matches_onnxruntime(rng, op, case, keepdims):
    shape, axes = case
    x = rng.standard_normal(shape).astype(np.float32)
    assert_close(run_cuvil(op, [x], axes=axes, keepdims=keepdims), ort_reduce(op, x, axes, keepdims))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
def test_reduce_integers_are_exact(rng, op, dtype):
    x = rng.integers(-1000, 1000, (3, 4, 5)).astype(dtype)
    (y,) = run_cuvil(op, [x], axes=(0, -1), keepdims=0)
    np.testing.assert_array_equal(y, ort_reduce(op, x, (0, -1), 0)[0])


def test_reduce_max_small_ints(rng):
    x = rng.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    (y,) = run_cuvil("ReduceMax", [x], axes=(1,))
    np.testing.assert_array_equal(y, ort_reduce("ReduceMax", x, (1,), 1)[0])


def test_reduce_sum_accumulates_in_float64():
    x = np.full((1 << 16,), 0.1, dtype=np.float32)
    x[0] = 1e8
    (y,) = run_cuvil("ReduceSum", [x], keepdims=0)
    assert y == np.float32(x.astype(np.float64).sum())


def test_reduce_keeps_dtype_float64_and_float16(rng):
    for dtype in (np.float64, np.float16):
        x = rng.standard_normal((3, 4)).astype(dtype)
        for op in OPS:
            (y,) = run_cuvil(op, [x], axes=(1,))
            assert y.dtype == dtype and y.shape == (3, 1)


def test_reduce_over_an_empty_axis():
    x = np.zeros((2, 0, 3), dtype=np.float32)
    assert (run_cuvil("ReduceSum", [x], axes=(1,))[0] == 0).all()
    assert (run_cuvil("ReduceMax", [x], axes=(1,))[0] == -np.inf).all()
    assert np.isnan(run_cuvil("ReduceMean", [x], axes=(1,))[0]).all()


@pytest.mark.parametrize("op", OPS)
def test_reduce_batch_symbol(op):
    assert infer(op, [(N, 3, 4)], axes=(1, 2), keepdims=0) == (TensorType(DType.F32, (N,)),)
    assert infer(op, [(N, 3, 4)], axes=(-1,)) == (TensorType(DType.F32, (N, 3, 1)),)
    assert infer(op, [(N, 3)], keepdims=1) == (TensorType(DType.F32, (1, 1)),)


ERRORS = {
    "axis_too_big": ((2, 3), {"axes": (2,)}),
    "axis_too_negative": ((2, 3), {"axes": (-3,)}),
    "repeated_axis": ((2, 3), {"axes": (1, -1)}),
    "keepdims_2": ((2, 3), {"keepdims": 2}),
}


@pytest.mark.parametrize("case", ERRORS.values(), ids=ERRORS.keys())
@pytest.mark.parametrize("op", OPS)
def test_reduce_rejects_bad_operands(op, case):
    shape, attrs = case
    with pytest.raises(ShapeError):
        infer(op, [shape], **attrs)


@pytest.mark.parametrize("op,dtype", [("ReduceMean", DType.I32), ("ReduceSum", DType.BOOL), ("ReduceMean", DType.BOOL)])
def test_reduce_rejects_unsupported_dtypes(op, dtype):
    with pytest.raises(ShapeError):
        infer(op, [(2, 3)], dtype=dtype)


def test_reduce_max_of_bools_is_any():
    x = np.array([[True, False], [False, False]])
    assert run_cuvil("ReduceMax", [x], axes=(1,), keepdims=0)[0].tolist() == [True, False]
    assert run_cuvil("ReduceMax", [np.zeros((2, 0), bool)], axes=(1,), keepdims=0)[0].tolist() == [False, False]
