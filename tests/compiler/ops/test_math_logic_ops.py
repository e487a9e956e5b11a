"""The ops of compiler/ops/elementwise_math.py and logic.py against ONNX Runtime, on edge values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.compiler import DType
from cuvil.compiler.errors import ShapeError

from .ort_check import assert_close, infer, run_cuvil, run_ort

DOMAIN = {  # values inside each function's domain, edges included
    "any": [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, 2.5, -2.5, 3.14159, -7.0, 20.0, -20.0, 1000.0],
    "unit": [0.0, -0.0, 0.25, -0.25, 0.5, -0.5, 0.999, -0.999, 1.0, -1.0, 1e-4, -1e-4],
    "open unit": [0.0, -0.0, 0.25, -0.25, 0.5, -0.5, 0.999, -0.999, 1e-4, -1e-4],
    "from one": [1.0, 1.0001, 1.5, 2.0, 10.0, 1e4],
    "moderate": [0.0, -0.0, 1e-4, -1e-4, 0.3, -0.3, 0.7, 1.0, -1.0, 5.0, -5.0, 20.0, -20.0],
}
FLOAT_UNARY = [("Floor", "any"), ("Ceil", "any"), ("Round", "any"), ("Sign", "any"), ("Sin", "any"),
               ("Cos", "any"), ("Tan", "moderate"), ("Asin", "unit"), ("Acos", "unit"), ("Atan", "any"),
               ("Sinh", "moderate"), ("Cosh", "moderate"), ("Asinh", "any"), ("Acosh", "from one"),
               ("Atanh", "open unit")]


PYTHON_MATH = {"Floor": math.floor, "Ceil": math.ceil, "Round": round, "Sign": lambda v: math.copysign(1, v) if v else v,
               "Sin": math.sin, "Cos": math.cos, "Tan": math.tan, "Asin": math.asin, "Acos": math.acos,
               "Atan": math.atan, "Sinh": math.sinh, "Cosh": math.cosh, "Asinh": math.asinh, "Acosh": math.acosh,
               "Atanh": math.atanh}


@pytest.mark.parametrize("op, kind", FLOAT_UNARY)
def test_float_unary_math_matches_onnxruntime(op, kind):
    x = np.array(DOMAIN[kind], np.float32)
    assert_close(run_cuvil(op, [x]), run_ort(op, [x], opset=13 if op == "Sign" else 17 if op != "Round" else 11),
                 rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op, kind", FLOAT_UNARY)
def test_float64_unary_math_matches_python(op, kind):
    """ONNX Runtime lacks several of these in float64: Python's math module decides."""
    x = np.array(DOMAIN[kind], np.float64)
    want = np.array([float(PYTHON_MATH[op](v)) for v in x.tolist()])
    assert_close(run_cuvil(op, [x]), [want], rtol=1e-12, atol=1e-15)


def test_round_takes_halves_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999], np.float32)
    assert run_cuvil("Round", [x])[0].tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, 2.0]


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod_takes_the_sign_of_divisor_or_dividend(fmod, dtype):
    x = np.array([7, -7, 7, -7, 0, 5], dtype)
    y = np.array([3, 3, -3, -3, 2, 5], dtype)
    expected = [1, -1, 1, -1, 0, 0] if fmod else [1, 2, -2, -1, 0, 0]
    got, = run_cuvil("Mod", [x, y], fmod=fmod)
    assert got.tolist() == expected and got.dtype == dtype
    if fmod or dtype != np.float32:  # a float floor-mod is ONNX opset 28, newer than this ONNX Runtime
        assert_close([got], run_ort("Mod", [x, y], {"fmod": fmod}, opset=13), rtol=0, atol=0)


def test_mean_is_the_average_of_all_operands():
    a, b, c = (np.array([1.0, 2.0, 3.0], np.float32) * k for k in (1, 2, 6))
    got, = run_cuvil("Mean", [a, b, c])
    assert got.tolist() == [3.0, 6.0, 9.0]


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_boolean_logic_broadcasts(op):
    x = np.array([[True, False], [True, True]])
    y = np.array([True, False])
    assert_close(run_cuvil(op, [x, y]), run_ort(op, [x, y], opset=7), rtol=0, atol=0)
    with pytest.raises(ShapeError, match="bool"):
        infer(op, [(2,), (2,)], dtype=DType.I32)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_bitwise_ops(op, dtype):
    x = np.array([0, 1, 5, 12, -1 if np.dtype(dtype).kind == "i" else 255], dtype)
    y = np.array([3, 3, 6, 10, 7], dtype)
    assert_close(run_cuvil(op, [x, y]), run_ort(op, [x, y], opset=18), rtol=0, atol=0)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_within_and_beyond_the_width(direction):
    x = np.array([1, 16, 255, 128, 7], np.uint8)
    y = np.array([1, 2, 3, 8, 9], np.uint8)
    got, = run_cuvil("BitShift", [x, y], direction=direction)
    assert got.tolist() == ([2, 64, 248, 0, 0] if direction == "LEFT" else [0, 4, 31, 0, 0])


def test_signed_right_shift_keeps_the_sign():
    x = np.array([-16, -16, 16, -1], np.int32)
    y = np.array([2, 40, 40, -1], np.int32)
    assert run_cuvil("BitShift", [x, y], direction="RIGHT")[0].tolist() == [-4, -1, 0, -1]


def test_nan_inf_tests_and_not():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0], np.float32)
    assert run_cuvil("IsNaN", [x])[0].tolist() == [True, False, False, False, False]
    assert run_cuvil("IsInf", [x])[0].tolist() == [False, True, True, False, False]
    assert run_cuvil("IsInf", [x], detect_positive=0)[0].tolist() == [False, False, True, False, False]
    assert run_cuvil("Not", [np.array([True, False])])[0].tolist() == [False, True]


@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual"])
def test_inclusive_comparisons(op):
    x = np.array([1, 2, 3], np.int64)
    y = np.array([2, 2, 2], np.int64)
    assert_close(run_cuvil(op, [x, y]), run_ort(op, [x, y], opset=16), rtol=0, atol=0)
