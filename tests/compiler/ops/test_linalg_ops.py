"""Gemm and MatMul against ONNX Runtime; shape-rule rejections."""

import numpy as np
import pytest

from cuvil.compiler import DType, N, TensorType
from cuvil.compiler.errors import ShapeError
from cuvil.compiler.ir.infer import infer_op
from cuvil.compiler.ops import get_op

from .ort_check import assert_close, infer, randn, run_cuvil, run_ort

F32 = DType.F32


# --- Gemm ------------------------------------------------------------------------------------------
GEMM_CASES = {
    "plain": ((3, 4), (4, 5), None, {}),
    "transA": ((4, 3), (4, 5), None, {"transA": 1}),
    "transB": ((3, 4), (5, 4), (5,), {"transB": 1}),
    "both": ((4, 3), (5, 4), (3, 5), {"transA": 1, "transB": 1}),
    "alpha_beta": ((3, 4), (4, 5), (3, 5), {"alpha": 0.5, "beta": -2.0}),
    "c_scalar": ((3, 4), (4, 5), (), {"beta": 3.0}),
    "c_row": ((3, 4), (4, 5), (1, 5), {}),
    "c_column": ((3, 4), (4, 5), (3, 1), {"alpha": 2.0}),
    "c_one_by_one": ((2, 4), (5, 4), (1, 1), {"transB": 1}),
    "linear_layer": ((1, 784), (256, 784), (256,), {"transB": 1}),
}


@pytest.mark.parametrize("case", GEMM_CASES.values(), ids=GEMM_CASES.keys())
def test_gemm_matches_onnxruntime(rng, case):
    sa, sb, sc, attrs = case
    ins = [randn(rng, sa), randn(rng, sb)] + ([] if sc is None else [randn(rng, sc)])
    assert_close(run_cuvil("Gemm", ins, **attrs), run_ort("Gemm", ins, attrs))


def test_gemm_batch_symbol_and_float64(rng):
    (t,) = infer_op("Gemm", [TensorType(F32, (N, 8)), TensorType(F32, (4, 8)), TensorType(F32, (4,))],
                    get_op("Gemm").normalize_attrs({"transB": 1}))
    assert t == TensorType(F32, (N, 4))
    a, b = randn(rng, (2, 3), np.float64), randn(rng, (3, 2), np.float64)
    (y,) = run_cuvil("Gemm", [a, b])
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, a @ b, rtol=1e-12)


GEMM_ERRORS = {
    "inner_mismatch": ([(3, 4), (5, 6)], {}),
    "inner_mismatch_transposed": ([(3, 4), (4, 5)], {"transA": 1}),
    "a_not_2d": ([(2, 3, 4), (4, 5)], {}),
    "b_not_2d": ([(3, 4), (4,)], {}),
    "c_not_broadcastable": ([(3, 4), (4, 5), (3, 4)], {}),
    "c_rank3": ([(3, 4), (4, 5), (1, 3, 5)], {}),
    "trans_flag_2": ([(3, 4), (4, 5)], {"transB": 2}),
}


@pytest.mark.parametrize("case", GEMM_ERRORS.values(), ids=GEMM_ERRORS.keys())
def test_gemm_rejects_bad_operands(case):
    shapes, attrs = case
    with pytest.raises(ShapeError):
        infer("Gemm", shapes, **attrs)


def test_gemm_rejects_ints():
    with pytest.raises(ShapeError):
        infer("Gemm", [(3, 4), (4, 5)], dtype=DType.I32)


# --- MatMul ----------------------------------------------------------------------------------------
MATMUL_CASES = {
    "2d": ((3, 4), (4, 5)),
    "vec_vec": ((4,), (4,)),
    "vec_mat": ((4,), (4, 5)),
    "mat_vec": ((3, 4), (4,)),
    "vec_batched": ((4,), (2, 4, 5)),
    "batched_vec": ((2, 3, 4), (4,)),
    "batched": ((2, 3, 4), (2, 4, 5)),
    "broadcast_a_2d": ((3, 4), (2, 4, 5)),
    "broadcast_b_2d": ((2, 3, 4), (4, 5)),
    "broadcast_batch_dims": ((2, 1, 3, 4), (1, 5, 4, 6)),
    "broadcast_rank_differs": ((3, 1, 2, 4), (5, 4, 3)),
    "attention_scores": ((1, 2, 8, 16), (1, 2, 16, 8)),
}


@pytest.mark.parametrize("case", MATMUL_CASES.values(), ids=MATMUL_CASES.keys())
def test_matmul_matches_onnxruntime_and_numpy(rng, case):
    a, b = (randn(rng, s) for s in case)
    (y,) = run_cuvil("MatMul", [a, b])
    assert y.shape == np.matmul(a, b).shape
    assert_close([y], run_ort("MatMul", [a, b]))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matmul_integers_are_exact(rng, dtype):
    a, b = (rng.integers(-100, 100, s).astype(dtype) for s in ((2, 3, 4), (4, 5)))
    (y,) = run_cuvil("MatMul", [a, b])
    np.testing.assert_array_equal(y, run_ort("MatMul", [a, b])[0])


def test_matmul_batch_symbol():
    (t,) = infer_op("MatMul", [TensorType(F32, (N, 8, 16)), TensorType(F32, (16, 4))], {})
    assert t == TensorType(F32, (N, 8, 4))
    (t,) = infer_op("MatMul", [TensorType(F32, (N, 16)), TensorType(F32, (16,))], {})
    assert t == TensorType(F32, (N,))


MATMUL_ERRORS = {
    "inner_mismatch": [(3, 4), (5, 6)],
    "vec_inner_mismatch": [(4,), (3,)],
    "vec_mat_mismatch": [(4,), (3, 5)],
    "batch_not_broadcastable": [(2, 3, 4), (3, 4, 5)],
    "scalar": [(), (3,)],
}


@pytest.mark.parametrize("shapes", MATMUL_ERRORS.values(), ids=MATMUL_ERRORS.keys())
def test_matmul_rejects_bad_operands(shapes):
    with pytest.raises(ShapeError):
        infer("MatMul", shapes)


def test_matmul_inner_mismatch_through_run_cuvil(rng):
    with pytest.raises(ShapeError, match="inner dimensions"):
        run_cuvil("MatMul", [randn(rng, (2, 3)), randn(rng, (4, 2))])


def test_matmul_rejects_mixed_dtypes_and_bool():
    with pytest.raises(ShapeError):
        infer_op("MatMul", [TensorType(F32, (2, 3)), TensorType(DType.F64, (3, 2))], {})
    with pytest.raises(ShapeError):
        infer("MatMul", [(2, 3), (3, 2)], dtype=DType.BOOL)
