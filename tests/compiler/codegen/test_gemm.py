"""emit_gemm: compiled for this host at O3, called through ctypes, checked against float64 NumPy.

All cases of one target go into one module compiled once (compile time dominates on 2 cores).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.activations import apply_activation
from cuvil.compiler.codegen.cpu.gemm import emit_gemm
from cuvil.compiler.codegen.cpu.tiles import gemm_tile, pack_gemm_b, pack_gemv_b
from cuvil.compiler.ops.fused import ACTIVATIONS
from cuvil.compiler.target import Target
from cuvil.devices.detect import resolve_target

from .kernel_jit import ACT_PARAMS, ACT_REF, aligned, assembly, guarded, jit, passes_in_child, ptr

HOST = resolve_target("host")
SSE = Target("x86-sse4", "x86_64-unknown-linux-gnu", "x86-64-v2", ("+sse4.2",), 128)  # 4-lane path on x86
WIDE16 = Target("avx512-plans-on-host", HOST.triple, HOST.cpu, HOST.features, 512)  # 16-lane IR, AVX2 halves

# (M, N, K, a_layout, bias, residual, activation)
CASES = [
    (1, 1, 1, "row", None, False, "none"),
    (1, 256, 784, "row", "n", False, "Relu"),
    (1, 10, 512, "row", "n", False, "none"),
    (2, 3, 5, "row", None, False, "none"),
    (7, 13, 3, "row", "m", False, "none"),
    (6, 16, 8, "row", "mn", True, "none"),
    (13, 33, 17, "col", "n", True, "none"),
    (33, 70, 129, "col", "m", False, "none"),
    (31, 9, 64, "row", None, True, "none"),
    (64, 200, 300, "row", "n", False, "none"),
    (100, 7, 1, "row", None, False, "none"),
    (3, 65, 4, "col", None, False, "none"),
    (448, 190, 520, "row", "n", False, "none"),  # A over the L2 budget: row blocks outer
    (300, 525, 700, "row", "m", True, "none"),  # A and B over it: L2-sized column chunks of B
] + [(5, 37, 19, "row", "n", True, act) for act in ACT_REF if act != "none"]


def _emit_all(target: Target, cases) -> dict:
    m = ir.Module(name="gemm_tests")
    m.triple = target.triple
    for i, (M, N, K, lay, bias, res, act) in enumerate(cases):
        a, c = ACT_PARAMS.get(act, (0.0, 0.0))
        emit_gemm(m, f"g{i}", target, M, N, K, a_layout=lay, bias=bias, residual=res, activation=act,
                  act_alpha=a, act_beta=c)
    return jit(m, target, [f"g{i}" for i in range(len(cases))])


@pytest.fixture(scope="module")
def host_fns():
    return _emit_all(HOST, CASES)


def _operands(M, N, K, lay, bias, res, act, rng):
    A = rng.standard_normal((M, K))
    W = rng.standard_normal((K, N)) / np.sqrt(K) * (3.0 if act != "none" else 1.0)
    bv = {"n": rng.standard_normal(N), "m": rng.standard_normal(M), "mn": rng.standard_normal((M, N)), None: None}[bias]
    R = rng.standard_normal((M, N)) if res else None
    ref = A @ W
    if bias is not None:
        ref = ref + (bv[:, None] if bias == "m" else bv)
    if res:
        ref = ref + R
    a, c = ACT_PARAMS.get(act, (0.0, 0.0))
    ref = ACT_REF[act](ref, a, c)
    return A, W, bv, R, ref


def _run(f, target, case, rng, a_guard=False):
    M, N, K, lay, bias, res, act = case
    A, W, bv, R, ref = _operands(*case, rng)
    A32 = (A if lay == "row" else A.T).astype(np.float32)
    keep = guarded(A32) if a_guard else (aligned(A32), None)
    Bp, bb, RR = aligned(pack_gemm_b(W, target)), aligned(bv), aligned(R)
    C = aligned(np.full((M, N), np.nan))
    f(ptr(keep[0]), ptr(Bp), ptr(bb), ptr(RR), ptr(C), None)
    return C, ref


def _id(c) -> str:
    return f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-{int(c[5])}-{c[6]}"


@pytest.mark.parametrize("i", range(len(CASES)), ids=[_id(c) for c in CASES])
def test_gemm_matches_numpy(host_fns, i, rng):
    C, ref = _run(host_fns[f"g{i}"], HOST, CASES[i], rng)
    np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-5)


def test_gemm_other_widths(rng):
    """4-lane (SSE), and where the host has AVX2 the x86-avx2 profile and 16-lane (AVX-512) plans."""
    cases = [CASES[i] for i in (1, 4, 6, 7, 9)] + [(5, 37, 19, "row", "n", True, "Gelu")]
    targets = [SSE] + ([resolve_target("x86-avx2"), WIDE16] if HOST.has("avx2") and HOST.has("fma") else [])
    for t in targets:
        fns = _emit_all(t, cases)
        for i, case in enumerate(cases):
            C, ref = _run(fns[f"g{i}"], t, case, rng)
            np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-5, err_msg=f"{t.name} {case}")


def test_gemm_reads_nothing_past_a(host_fns, rng):
    """A ending right before a PROT_NONE page: tails must not over-read (checked in a child process)."""
    for i in (3, 6, 10, 11):
        def check(i=i):
            C, ref = _run(host_fns[f"g{i}"], HOST, CASES[i], rng, a_guard=True)
            return np.allclose(C, ref, rtol=1e-4, atol=1e-5)

        assert passes_in_child(check), f"case {CASES[i]}"


def test_activation_table_covers_fused_ops():
    """Every fused activation name (and "none") emits, on scalars and vectors; any other name is refused."""
    for ty in (ir.FloatType(), ir.VectorType(ir.FloatType(), 8)):
        fn = ir.Function(ir.Module(), ir.FunctionType(ty, [ty]), "f")
        b = ir.IRBuilder(fn.append_basic_block())
        for name in (*ACTIVATIONS, "none"):
            assert apply_activation(b, fn.args[0], name, 0.0, 6.0).type == ty, name
        with pytest.raises(ValueError, match="unknown activation"):
            apply_activation(b, fn.args[0], "Swish")


def test_packing_layout():
    W = np.arange(3 * 21, dtype=np.float32).reshape(3, 21)
    vl = HOST.vector_floats
    P = pack_gemm_b(W, HOST)
    assert P.shape == (-(-21 // vl), 3, vl) and P.flags.c_contiguous and P.dtype == np.float32
    np.testing.assert_array_equal(P.transpose(1, 0, 2).reshape(3, -1)[:, :21], W)
    assert not P.transpose(1, 0, 2).reshape(3, -1)[:, 21:].any()
    np.testing.assert_array_equal(pack_gemm_b(W.T, HOST, trans_b=True, alpha=2.0), 2 * P)


@pytest.mark.parametrize("alpha", [1.0, 0.1])
def test_packing_holds_the_packed_panels_and_no_copy_of_b(alpha):
    """B itself, rounded once only where alpha scales it: the packed panels, no padded or float64 copy
    of all of B (a float64 product of a 1280 x 320 B took the peak to 6x its bytes; a padded copy and a
    transposed one to 3x); alpha 0.1 rounds once from float64."""
    import tracemalloc

    W = np.random.default_rng(0).standard_normal((1280, 320)).astype(np.float32)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        P = pack_gemm_b(W, HOST, trans_b=True, alpha=alpha)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 1.1 * W.nbytes
    expected = W.T if alpha == 1.0 else (W.T.astype(np.float64) * alpha).astype(np.float32)
    np.testing.assert_array_equal(P.transpose(1, 0, 2).reshape(320, -1)[:, :1280], expected)


def test_gemv_packing_layout():
    """A GEMV's B: panels [K, NV*VL] as wide as its tile, the last narrower, zero-padded to whole vectors."""
    t = resolve_target("x86-avx512")
    W = np.arange(3 * 21, dtype=np.float32).reshape(3, 21)
    P = pack_gemv_b(W, t)  # 2 vectors: one panel [3, 32]
    assert P.shape == (96,) and P.dtype == np.float32
    np.testing.assert_array_equal(P.reshape(3, 32)[:, :21], W)
    assert not P.reshape(3, 32)[:, 21:].any()
    np.testing.assert_array_equal(pack_gemv_b(W.T, t, trans_b=True, alpha=2.0), 2 * P)
    W = np.arange(2 * 500, dtype=np.float32).reshape(2, 500)  # 32 vectors: two tiles, the second narrower
    P = pack_gemv_b(W, t)
    w = gemm_tile(t, 1, 500, wide=True)[1] * 16
    assert 256 <= w < 512 and P.shape == (2 * 512,)
    np.testing.assert_array_equal(P[:2 * w].reshape(2, w), W[:, :w])
    np.testing.assert_array_equal(P[2 * w:].reshape(2, 512 - w)[:, :500 - w], W[:, w:])
    assert not P[2 * w:].reshape(2, 512 - w)[:, 500 - w:].any()
    for K, N in ((0, 2), (3, 0)):  # empty operands (the op fuzzer's MatMul of [0, 0] by [0, 2])
        empty = np.zeros((K, N), np.float32)
        assert pack_gemv_b(empty, t).size == pack_gemm_b(empty, t).size == 0


def test_gemv_tile_spans_the_registers():
    """M = 1 on a wide B: one row of C as wide as the registers allow (the LSTM's 1x64 by 64x256 step
    in one tile of 16 zmm at 512 bits), panels of at most 8 vectors otherwise."""
    avx512, avx2 = resolve_target("x86-avx512"), resolve_target("x86-avx2")
    assert gemm_tile(avx512, 1, 256, wide=True) == (1, 16)
    assert gemm_tile(avx512, 1, 256) == (1, 8)
    assert gemm_tile(avx2, 1, 256, wide=True)[1] <= 14
    m = ir.Module()
    m.triple = avx512.triple
    emit_gemm(m, "g", avx512, 1, 256, 64, b_layout="wide", residual=True)
    asm = assembly(m, avx512)
    assert len(re.findall(r"vfmadd\d+ps\s+[^\n]*zmm", asm)) >= 16 and "Spill" not in asm and "Reload" not in asm


@pytest.mark.parametrize("name", ["x86-avx512", "x86-avx2", "x86-sse4"])
def test_gemv_wide_b_matches_numpy(name, rng):
    """b_layout="wide" (M = 1): N within one tile, over the registers (two tiles), with a partial vector;
    the zero-padded B is read whole, C's tail stored masked."""
    t = SSE if name == "x86-sse4" else resolve_target(name)
    need = {"x86-avx512": "avx512f", "x86-avx2": "avx2", "x86-sse4": "sse4.2"}[name]
    if not HOST.has(need):
        pytest.skip(f"{name} code runs on an {need} host (this one: {HOST.name})")
    cases = [(256, 64, "n", True), (600, 33, None, False), (21, 7, "n", False), (100, 512, "n", True), (500, 9, "n", True)]
    m = ir.Module()
    m.triple = t.triple
    for i, (N, K, bias, res) in enumerate(cases):
        emit_gemm(m, f"w{i}", t, 1, N, K, b_layout="wide", bias=bias, residual=res, activation="none")
    fns = jit(m, t, [f"w{i}" for i in range(len(cases))])
    for i, (N, K, bias, res) in enumerate(cases):
        A, W = rng.standard_normal((1, K)), rng.standard_normal((K, N)) / np.sqrt(K)
        bv, R = rng.standard_normal(N), rng.standard_normal((1, N))
        ref = A @ W + (bv if bias else 0) + (R if res else 0)
        C = aligned(np.full((1, N), np.nan))
        AA, Bp, bb, RR = aligned(A), aligned(pack_gemv_b(W, t)), aligned(bv), aligned(R)
        fns[f"w{i}"](ptr(AA), ptr(Bp), ptr(bb) if bias else None, ptr(RR) if res else None, ptr(C), None)
        np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-5, err_msg=f"{t.name} {cases[i]}")


def _asm(target, M, N, K):
    m = ir.Module()
    m.triple = target.triple
    emit_gemm(m, "g", target, M, N, K, bias="n", activation="Relu")
    return assembly(m, target)


def test_avx512_assembly_uses_zmm_fma():
    asm = _asm(resolve_target("x86-avx512"), 64, 256, 128)
    assert "zmm" in asm and re.search(r"vfmadd\d+ps\s+[^\n]*zmm", asm)
    assert "Spill" not in asm and "Reload" not in asm  # the register tile fits the 32 zmm registers
    mr, nv = gemm_tile(resolve_target("x86-avx512"), 64, 256)
    assert mr * nv >= 20


def test_neon_assembly_uses_fmla():
    asm = _asm(resolve_target("rpi5"), 16, 64, 32)
    assert re.search(r"fmla\s+v\d+\.4s", asm)


def test_gemm_row_major_b(rng):
    """b_layout="row": B is a plain [K, N] activation; its last row ends at a PROT_NONE page."""
    cases = [(3, 21, 10), (17, 64, 33), (1, 5, 7), (9, 40, 4)]
    m = ir.Module()
    m.triple = HOST.triple
    for i, (M, N, K) in enumerate(cases):
        emit_gemm(m, f"r{i}", HOST, M, N, K, b_layout="row", bias="n", activation="Tanh")
    fns = jit(m, HOST, [f"r{i}" for i in range(len(cases))])
    for i, (M, N, K) in enumerate(cases):
        A, B, bias = rng.standard_normal((M, K)), rng.standard_normal((K, N)) / np.sqrt(K), rng.standard_normal(N)
        pid = os.fork()
        if pid == 0:
            try:
                Bg, _keep = guarded(B.astype(np.float32))
                AA, bb, C = aligned(A), aligned(bias), aligned(np.full((M, N), np.nan))
                fns[f"r{i}"](ptr(AA), ptr(Bg), ptr(bb), None, ptr(C), None)
                os._exit(0 if np.allclose(C, np.tanh(A @ B + bias), rtol=1e-4, atol=1e-5) else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"case {cases[i]}: status {status}"
