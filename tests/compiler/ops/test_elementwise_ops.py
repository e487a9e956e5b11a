"""Every op of compiler/ops/elementwise.py against ONNX Runtime (or PyTorch where ONNX has no op).

The NumPy references are the executable spec every compiled kernel is tested against, so they are
checked here on edge values too: zeros (both signs), negatives, and magnitudes that saturate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.compiler import DType, Node, TensorType, infer_graph_types
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.ops import OP_TABLE, elementwise

from .ort_check import Const, assert_close, run_cuvil, run_ort

EDGE = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, -3.0, 6.0, -6.0, 7.5, 20.0, -20.0, 88.0, -88.0, 1e4, -1e4]


def values(rng, dtype=np.float32, shape=(4, 16), kind="any") -> np.ndarray:
    """Edge values first, then random ones; ``kind`` keeps them in an op's domain."""
    n = math.prod(shape)
    x = np.concatenate([EDGE, rng.standard_normal(n) * 4])[:n]
    x = {"any": x, "positive": np.abs(x) + 1e-3, "nonzero": np.where(x == 0, 0.25, x)}[kind]
    return x.astype(dtype).reshape(shape)


def ints(rng, dtype, shape=(3, 5), lo=-20, hi=20, nonzero=False) -> np.ndarray:
    x = rng.integers(lo, hi, size=shape).astype(dtype)
    return np.where(x == 0, 1, x).astype(dtype) if nonzero else x


# (cuvil op, cuvil attrs, onnx op, onnx attrs, onnx trailing Const inputs, opset, value kind)
UNARY = [
    ("Relu", {}, "Relu", {}, [], 17, "any"),
    ("Clip", {"min": 0.0, "max": 6.0}, "Clip", {}, [np.float32(0), np.float32(6)], 13, "any"),  # Relu6
    ("Clip", {"min": -1.5}, "Clip", {}, [np.float32(-1.5)], 13, "any"),
    ("Clip", {}, "Clip", {}, [], 13, "any"),
    ("LeakyRelu", {}, "LeakyRelu", {"alpha": 0.01}, [], 17, "any"),
    ("LeakyRelu", {"alpha": 0.2}, "LeakyRelu", {"alpha": 0.2}, [], 17, "any"),
    ("Sigmoid", {}, "Sigmoid", {}, [], 17, "any"),
    ("Tanh", {}, "Tanh", {}, [], 17, "any"),
    ("Gelu", {}, "Gelu", {}, [], 20, "any"),
    ("Gelu", {"approximate": "tanh"}, "Gelu", {"approximate": "tanh"}, [], 20, "any"),
    ("HardSigmoid", {}, "HardSigmoid", {"alpha": 0.2, "beta": 0.5}, [], 17, "any"),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, "HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, [], 17, "any"),
    ("HardSwish", {}, "HardSwish", {}, [], 14, "any"),
    ("Erf", {}, "Erf", {}, [], 17, "any"),
    ("Sqrt", {}, "Sqrt", {}, [], 17, "positive"),
    ("Exp", {}, "Exp", {}, [], 17, "any"),
    ("Log", {}, "Log", {}, [], 17, "positive"),
    ("Reciprocal", {}, "Reciprocal", {}, [], 17, "nonzero"),
    ("Neg", {}, "Neg", {}, [], 17, "any"),
    ("Abs", {}, "Abs", {}, [], 17, "any"),
    ("Identity", {}, "Identity", {}, [], 17, "any"),
    ("Dropout", {"ratio": 0.3}, "Dropout", {}, [np.float32(0.3)], 13, "any"),
]


ORT_F32_ONLY = {"Gelu", "HardSigmoid", "HardSwish", "Erf"}  # ORT's CPU provider has no f64 kernel


def ort_unary(case, x: np.ndarray) -> list[np.ndarray]:
    """ONNX Runtime's result; for ops it lacks in f64, its f32 result widened (f32 tolerance)."""
    _, _, onnx_op, onnx_attrs, consts, opset, _ = case
    run_as = np.float32 if onnx_op in ORT_F32_ONLY else x.dtype
    consts = [Const(np.asarray(c, dtype=run_as)) for c in consts]
    out = run_ort(onnx_op, [x.astype(run_as), *consts], onnx_attrs, opset=opset)
    return [o.astype(x.dtype) for o in out]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", UNARY, ids=[f"{c[0]}{c[1] or ''}" for c in UNARY])
def test_unary_float_ops_match_onnxruntime(rng, dtype, case):
    x = values(rng, dtype, kind=case[6])
    assert_close(run_cuvil(case[0], [x], **case[1]), ort_unary(case, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", UNARY, ids=[c[0] for c in UNARY])
def test_unary_references_keep_rank0_tensors(case):
    """Rank-0 values are legal IR, and NumPy ufuncs return scalars (not arrays) on them."""
    x = np.array(0.75, dtype=np.float32)
    got = OP_TABLE[case[0]].reference([x], OP_TABLE[case[0]].normalize_attrs(case[1]))
    assert_close([np.asarray(g) for g in got], ort_unary(case, x))
    assert got[0].shape == () and isinstance(got[0], np.ndarray)


def test_sigmoid_and_tanh_saturate_without_overflow():
    x = np.array([-1e30, -1e4, -100.0, -30.0, -0.0, 0.0, 30.0, 100.0, 1e4, 1e30, np.inf, -np.inf], np.float32)
    with np.errstate(over="raise", invalid="raise"):
        sig, = run_cuvil("Sigmoid", [x])
        tanh, = run_cuvil("Tanh", [x])
    assert_close([sig], run_ort("Sigmoid", [x]), rtol=1e-6, atol=1e-7)
    assert_close([tanh], run_ort("Tanh", [x]), rtol=1e-6, atol=1e-7)
    assert sig[0] == 0.0 and sig[-3] == 1.0 and tanh[-3] == 1.0 and tanh[0] == -1.0


def test_silu_matches_torch_and_sigmoid_times_x(rng):
    torch = pytest.importorskip("torch")
    x = values(rng, np.float32)
    got, = run_cuvil("SiLU", [x])
    np.testing.assert_allclose(got, torch.nn.functional.silu(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
    sig, = run_ort("Sigmoid", [x])
    assert_close([got], run_ort("Mul", [x, sig]), rtol=1e-5, atol=1e-6)


INT_UNARY = [(op, opset, dtype) for op, opset, dtypes in [
    ("Relu", 14, [np.int8, np.int32]), ("Neg", 13, [np.int8, np.int32, np.int64]),
    ("Abs", 13, [np.int8, np.int32, np.int64, np.uint8]), ("Identity", 16, [np.int64, np.bool_]),
] for dtype in dtypes]


@pytest.mark.parametrize("op,opset,dtype", INT_UNARY, ids=[f"{o}-{np.dtype(d).name}" for o, _, d in INT_UNARY])
def test_integer_unary_ops(rng, op, opset, dtype):
    x = ints(rng, dtype, lo=-100, hi=100)
    assert_close(run_cuvil(op, [x]), run_ort(op, [x], opset=opset), rtol=0, atol=0)


def test_clip_and_relu6_at_their_bounds():
    x = np.array([-np.inf, -1.0, -0.0, 0.0, 5.999, 6.0, 6.001, np.inf], np.float32)
    got, = run_cuvil("Clip", [x], min=0.0, max=6.0)
    assert_close([got], run_ort("Clip", [x, Const(np.float32(0)), Const(np.float32(6))], opset=13), rtol=0, atol=0)
    assert got.tolist() == [0, 0, 0, 0, 5.999000072479248, 6, 6, 6]


# --- binary and variadic arithmetic ---------------------------------------------------------------

BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((), (2, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_float_arithmetic_broadcasts_like_onnxruntime(rng, op, shapes):
    a = values(rng, np.float32, shapes[0], kind="any")
    b = values(rng, np.float32, shapes[1], kind="nonzero")
    assert_close(run_cuvil(op, [a, b]), run_ort(op, [a, b]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_arithmetic_matches_onnxruntime(rng, op, dtype):
    a = ints(rng, dtype, (4, 6), lo=-50, hi=50)
    b = ints(rng, dtype, (6,), lo=-7, hi=7, nonzero=True)
    assert_close(run_cuvil(op, [a, b]), run_ort(op, [a, b]), rtol=0, atol=0)


def test_integer_division_truncates_toward_zero_exactly():
    a = np.array([7, -7, 7, -7, 0, -1, 2**62 + 1, -(2**62) - 1, np.iinfo(np.int64).max], np.int64)
    b = np.array([2, 2, -2, -2, 3, 2, 1, 1, 3], np.int64)
    got, = run_cuvil("Div", [a, b])
    assert_close([got], run_ort("Div", [a, b]), rtol=0, atol=0)
    assert got.tolist()[:6] == [3, -3, -3, 3, 0, 0] and got[6] == 2**62 + 1


def test_pow_matches_onnxruntime(rng):
    base = values(rng, np.float32, (3, 4), kind="positive")
    exp = np.array([0.0, 0.5, -1.0, 2.0], np.float32)
    assert_close(run_cuvil("Pow", [base, exp]), run_ort("Pow", [base, exp]), rtol=1e-5, atol=1e-6)
    neg = np.array([-2.0, -0.5, 0.0, -3.0], np.float32)
    whole = np.array([2.0, 3.0, 2.0, 3.0], np.float32)
    assert_close(run_cuvil("Pow", [neg, whole]), run_ort("Pow", [neg, whole]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_pow_matches_onnxruntime(dtype):
    base = np.array([2, -3, 0, 5, 1, -1, -1, 7], dtype)
    exp = np.array([10, 3, 4, 0, -3, -3, -2, 1], dtype)
    assert_close(run_cuvil("Pow", [base, exp]), run_ort("Pow", [base, exp]), rtol=0, atol=0)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
@pytest.mark.parametrize("shapes", [[(2, 3)], [(2, 3), (3,)], [(2, 1, 4), (3, 1), (1, 1, 4)], [(), (2, 2), (1,)]], ids=str)
def test_variadic_ops_broadcast_like_onnxruntime(rng, op, shapes):
    xs = [values(rng, np.float32, s) for s in shapes]
    assert_close(run_cuvil(op, xs), run_ort(op, xs), rtol=1e-6, atol=0)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_integer_max_min(rng, op):
    xs = [ints(rng, np.int64, (2, 5)), ints(rng, np.int64, (5,)), ints(rng, np.int64, (2, 1))]
    assert_close(run_cuvil(op, xs), run_ort(op, xs, opset=13), rtol=0, atol=0)


def test_single_operand_sum_is_a_copy(rng):
    x = values(rng, np.float32, (3,))
    got, = run_cuvil("Sum", [x])
    assert_close([got], run_ort("Sum", [x]), rtol=0, atol=0)
    assert not np.shares_memory(got, x)


# --- comparisons, Where, Cast ---------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_comparisons_match_onnxruntime(rng, op, dtype):
    a = ints(rng, np.int64, (3, 4), lo=-3, hi=3).astype(dtype)
    b = ints(rng, np.int64, (4,), lo=-3, hi=3).astype(dtype)
    got = run_cuvil(op, [a, b])
    assert got[0].dtype == np.bool_
    assert_close(got, run_ort(op, [a, b]), rtol=0, atol=0)


def test_equal_on_bool_and_signed_zero():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    assert_close(run_cuvil("Equal", [a, b]), run_ort("Equal", [a, b]), rtol=0, atol=0)
    z = np.array([0.0, -0.0], np.float32)
    assert run_cuvil("Equal", [z, z[::-1].copy()])[0].all()


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_where_broadcasts_all_three_operands(rng, dtype):
    cond = rng.random((2, 1, 4)) > 0.5
    x = values(rng, np.float64, (3, 1)).astype(dtype)
    y = values(rng, np.float64, (4,)).astype(dtype)
    assert_close(run_cuvil("Where", [cond, x, y]), run_ort("Where", [cond, x, y]), rtol=0, atol=0)


CASTS = [
    (np.float32, DType.I32), (np.float32, DType.I64), (np.float32, DType.F16), (np.float32, DType.F64),
    (np.float32, DType.BOOL), (np.float64, DType.F32), (np.int64, DType.F32), (np.int32, DType.I8),
    (np.bool_, DType.F32), (np.uint8, DType.I32), (np.int64, DType.BOOL),
]


@pytest.mark.parametrize("src,to", CASTS, ids=[f"{np.dtype(s).name}->{t.value}" for s, t in CASTS])
def test_cast_matches_onnxruntime(rng, src, to):
    x = np.concatenate([[0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.7, -0.7, 100.0, 127.0], rng.standard_normal(10) * 50])
    if np.dtype(src).kind in "iub":
        x = np.round(x)
    x = np.clip(x, 0, 255) if src is np.uint8 else np.clip(x, -128, 127)
    x = x.astype(src)
    onnx_to = {d: getattr(__import__("onnx").TensorProto, n) for d, n in [
        (DType.I32, "INT32"), (DType.I64, "INT64"), (DType.F16, "FLOAT16"), (DType.F64, "DOUBLE"),
        (DType.BOOL, "BOOL"), (DType.F32, "FLOAT"), (DType.I8, "INT8")]}[to]
    assert_close(run_cuvil("Cast", [x], to=to), run_ort("Cast", [x], {"to": onnx_to}), rtol=0, atol=0)


# --- rejected operands and coverage ---------------------------------------------------------------

BAD = [
    ("Add", [TensorType(DType.F32, (2, 3)), TensorType(DType.F32, (4,))], {}),
    ("Add", [TensorType(DType.F32, (2,)), TensorType(DType.I32, (2,))], {}),
    ("Add", [TensorType(DType.BOOL, (2,)), TensorType(DType.BOOL, (2,))], {}),
    ("Neg", [TensorType(DType.BOOL, (2,))], {}),
    ("Sum", [TensorType(DType.F32, (2,)), TensorType(DType.F32, (3,)), TensorType(DType.F32, (2,))], {}),
    ("Sqrt", [TensorType(DType.I32, (2,))], {}),
    ("Sigmoid", [TensorType(DType.I64, (2,))], {}),
    ("Gelu", [TensorType(DType.F32, (2,))], {"approximate": "fast"}),
    ("Where", [TensorType(DType.F32, (2,))] * 3, {}),
    ("Where", [TensorType(DType.BOOL, (2,)), TensorType(DType.F32, (2,)), TensorType(DType.F64, (2,))], {}),
    ("Equal", [TensorType(DType.F32, (2, 2)), TensorType(DType.F32, (3,))], {}),
]


@pytest.mark.parametrize("op,types,attrs", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_operands_raise_shape_error(op, types, attrs):
    node = Node.make(op, [f"x{i}" for i in range(len(types))], ["y"], **attrs)
    with pytest.raises(ShapeError):
        infer_graph_types("bad", {f"x{i}": t for i, t in enumerate(types)}, {}, [node], ["y"])


def test_every_elementwise_op_is_tested_here():
    """A new op in elementwise.py must come with an ONNX Runtime check in this file."""
    source = open(elementwise.__file__).read()
    ops = {name for name in OP_TABLE if f'"{name}"' in source}
    tested = {c[0] for c in UNARY} | {"SiLU", "Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min",
                                      "Equal", "Less", "Greater", "Where", "Cast"}
    assert ops == tested
