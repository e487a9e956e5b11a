"""Gemm, FusedGemm and MatMul.

f32 with a constant weight operand: the register-blocked micro-kernel of ``codegen/gemm.py`` on
weights packed into vector panels (alpha and transB folded in), bias packed per its broadcast (beta
folded in), residual and activation applied in registers. An f32 MatMul of two computed operands:
the same micro-kernel reading B row-major, once per batch index. Everything else (a computed Gemm,
f16, integer MatMul): row-at-a-time loops whose inner loop ``y[m, :] += a[m, k] * b[k, :]`` is a
contiguous vector FMA stream.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ....ir.dtypes import DType
from ... import irhelpers as h
from ..gemm import emit_gemm
from ..tiles import pack_gemm_b, pack_gemv_b
from .base import KernelContext, KernelKey, kernel
from ...irhelpers import broadcast_strides
from .epilogue import apply_epilogue, residual_index, residual_shared

KN = "kn"  # [K, N] row-major (transB applied)
PANELS = "panels"  # tiles.pack_gemm_b
WIDE = "wide"  # tiles.pack_gemv_b: a GEMV's (M = 1) B in panels as wide as its tile
BIAS = "bias_"  # + "n" | "m" | "mn": C times beta, broadcast to the micro-kernel's bias form


def _bias_index(key: KernelKey) -> int | None:
    a = dict(key.attrs)
    if key.op == "FusedGemm":
        return 2 if a["has_bias"] else None
    return 2 if len(key.in_types) == 3 else None


def _micro_ok(key: KernelKey) -> bool:
    c = _bias_index(key)
    return key.in_types[0].dtype is DType.F32 and key.packed[1] == "const" and (c is None or key.packed[c] == "const")


def _bias_mode(shape: tuple[int, ...]) -> str:
    cm, cn = ((1, 1) + tuple(shape))[-2:]
    return "mn" if cm != 1 and cn != 1 else "m" if cm != 1 else "n"


def _pack_gemm(key: KernelKey, i: int, arr: np.ndarray, target):
    a = dict(key.attrs)
    m, n = key.out_types[0].shape
    if _micro_ok(key):
        if i == 1:
            return _packed_b(m, arr, target, trans_b=bool(a["transB"]), alpha=a["alpha"])
        if i == _bias_index(key):
            mode = _bias_mode(arr.shape)
            c = (arr.astype(np.float64) * a["beta"]).reshape(((1, 1) + arr.shape)[-2:])  # its axis of 1 kept (M or N may be 0)
            packed = {"n": lambda: np.broadcast_to(c[0], (n,)), "m": lambda: np.broadcast_to(c[:, 0], (m,)),
                      "mn": lambda: np.broadcast_to(c, (m, n))}[mode]()
            return BIAS + mode, np.ascontiguousarray(packed, dtype=np.float32)
        return None
    if i == 1 and a.get("transB"):
        return KN, np.ascontiguousarray(arr.T)
    return None


def _packed_b(m: int, arr: np.ndarray, target, **how) -> tuple[str, np.ndarray]:
    """A constant B for the micro-kernel: a GEMV's (M = 1) in panels as wide as its tile where B stays in
    L2 between calls (an LSTM's recurrent weights: 0.94x the model's time on Zen 4); vector panels
    otherwise, also for a GEMV whose B streams from memory (wide_mlp's 8 MiB layers ran 2x slower as one
    stream per tile than as 8 panel streams)."""
    if m == 1 and 4 * arr.size <= target.tuning.l2_budget_bytes:
        return WIDE, pack_gemv_b(arr, target, **how)
    return PANELS, pack_gemm_b(arr, target, **how)


def _fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
    if h.is_float(x.type):
        return h.call_intrinsic(b, "llvm.fmuladd", x, y, acc)
    return b.add(b.mul(x, y), acc)


def call_micro_gemm(ctx: KernelContext, m: int, n: int, k: int, *, a_layout: str = "row", bias: str | None = None,
                    bias_ptr=None, res_ptr=None) -> None:
    """Define the micro-kernel for this shape next to the calling kernel (B as ``ctx.key.packed[1]``), and call it."""
    a = ctx.attrs
    fused = ctx.key.op == "FusedGemm"
    fn = emit_gemm(ctx.module, f"{ctx.name}_mk", ctx.target, m, n, k, a_layout=a_layout,
                   b_layout="wide" if ctx.key.packed[1] == WIDE else "packed", bias=bias,
                   residual=res_ptr is not None, activation=a["activation"] if fused else "none",
                   act_alpha=a["act_alpha"] if fused else 0.0, act_beta=a["act_beta"] if fused else 0.0)
    fn.linkage = "internal"
    null = ir.Constant(h.F32.as_pointer(), None)
    ctx.b.call(fn, [ctx.ins[0], ctx.ins[1], bias_ptr or null, res_ptr or null, ctx.outs[0], null])


def matmul_rows(ctx: KernelContext, m: int, k: int, n: int, a_at, b_at, y_base: ir.Value, alpha: float = 1.0) -> None:
    """y[m, :] += alpha * sum_k A[m, k] * B[k, :] for every row; y must be initialised."""
    b, y = ctx.b, ctx.outs[0]
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    if ty == h.F16:
        _half_rows(ctx, m, k, n, a_at, b_at, y_base, alpha)
        return
    with h.for_range(b, m, name="m") as mi:
        row = b.add(y_base, b.mul(mi, h.i64(n)))
        with h.for_range(b, k, name="k") as ki:
            av = a_at(mi, ki)
            if alpha != 1.0:
                av = b.fmul(av, h.const(ty, alpha))
            with h.for_range(b, n, name="n") as ni:
                yk = b.add(row, ni)
                h.store(b, _fma(b, av, b_at(ki, ni), h.load(b, y, yk)), y, yk)


def _half_rows(ctx: KernelContext, m: int, k: int, n: int, a_at, b_at, y_base: ir.Value, alpha: float) -> None:
    """matmul_rows for f16: each output's dot product summed in f32 and rounded once (as the
    reference and NumPy do; summing into the f16 output rounded at every step)."""
    b, y = ctx.b, ctx.outs[0]

    def wide(v):
        return b.fpext(v, h.F32)

    with h.loop_nest(b, (m, n), name="mn") as (mi, ni):
        yk = b.add(y_base, b.add(b.mul(mi, h.i64(n)), ni))
        dot = h.reduce_range(b, k, h.const(h.F32, 0.0),
                             lambda acc, ki: _fma(b, wide(a_at(mi, ki)), wide(b_at(ki, ni)), acc), name="k")
        if alpha != 1.0:
            dot = b.fmul(dot, h.const(h.F32, alpha))
        h.store(b, b.fptrunc(b.fadd(wide(h.load(b, y, yk)), dot), h.F16), y, yk)


def _gemm(ctx: KernelContext) -> None:
    a = ctx.attrs
    m, n = ctx.out_shape
    k = ctx.shape(0)[0] if a["transA"] else ctx.shape(0)[1]
    c = _bias_index(ctx.key)
    r = residual_index(a) if ctx.key.op == "FusedGemm" else None
    if ctx.key.packed[1] in (PANELS, WIDE):
        bias = ctx.key.packed[c][len(BIAS):] if c is not None else None
        call_micro_gemm(ctx, m, n, k, a_layout="col" if a["transA"] else "row", bias=bias,
                        bias_ptr=ctx.ins[c] if c is not None else None, res_ptr=ctx.ins[r] if r is not None else None)
        return
    b, y = ctx.b, ctx.outs[0]
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    shared = ctx.key.op == "FusedGemm" and residual_shared(ctx)
    c_strides = broadcast_strides(ctx.shape(c), (m, n)) if c is not None else None
    with h.loop_nest(b, (m, n)) as (mi, ni):
        init = h.const(ty, 0.0)
        if c is not None:
            init = b.fmul(ctx.read(c, h.linear(b, (mi, ni), c_strides)), h.const(ty, a["beta"]))
        yi = h.linear(b, (mi, ni), (n, 1))
        h.store(b, b.fadd(h.load(b, y, yi), init) if shared else init, y, yi)
    a_str = (1, m) if a["transA"] else (k, 1)
    b_str = (1, k) if a["transB"] and ctx.key.packed[1] != KN else (n, 1)
    matmul_rows(ctx, m, k, n, lambda mi, ki: ctx.read(0, h.linear(b, (mi, ki), a_str)),
                lambda ki, ni: ctx.read(1, h.linear(b, (ki, ni), b_str)), h.i64(0), a["alpha"])
    if ctx.key.op == "FusedGemm":
        apply_epilogue(b, ctx, h.i64(0), m * n)


@kernel("Gemm", pack=_pack_gemm)
def emit_gemm_kernel(ctx: KernelContext) -> None:
    _gemm(ctx)


@kernel("FusedGemm", pack=_pack_gemm)
def emit_fused_gemm(ctx: KernelContext) -> None:
    _gemm(ctx)


def _pack_matmul(key: KernelKey, i: int, arr: np.ndarray, target):
    """A constant 2-D f32 B: one GEMM over all of A's rows on packed panels."""
    if i == 1 and arr.ndim == 2 and key.in_types[0].dtype is DType.F32:
        return _packed_b(math.prod(key.in_types[0].shape[:-1]), arr, target)
    return None


@kernel("MatMul", pack=_pack_matmul)
def emit_matmul(ctx: KernelContext) -> None:
    """numpy matmul: 1-D operands become a row / a column; batch dimensions broadcast."""
    sa, sb = ctx.shape(0), ctx.shape(1)
    if ctx.key.packed[1] in (PANELS, WIDE):
        call_micro_gemm(ctx, math.prod(sa[:-1]), sb[1], sb[0])
        return
    sa = (1,) + sa if len(sa) == 1 else sa
    sb = sb + (1,) if len(sb) == 1 else sb
    m, k, n = sa[-2], sa[-1], sb[-1]
    batch = ctx.out_shape[: len(ctx.out_shape) - (len(ctx.shape(0)) > 1) - (len(ctx.shape(1)) > 1)]
    a_bs = broadcast_strides(sa[:-2], batch) if batch else ()
    b_bs = broadcast_strides(sb[:-2], batch) if batch else ()
    b, y = ctx.b, ctx.outs[0]
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    micro = _row_b_gemm(ctx, m, n, k)
    if micro is None:
        with h.for_range(b, math.prod(ctx.out_shape), name="z") as i:
            h.store(b, h.const(ty, 0), y, i)
    with h.loop_nest(b, batch, name="bt") as bi:
        a_off = h.linear(b, bi, [s * m * k for s in a_bs])
        b_off = h.linear(b, bi, [s * k * n for s in b_bs])
        y_off = h.linear(b, bi, [s * m * n for s in h.contiguous_strides(batch)])
        if micro is not None:
            null = ir.Constant(h.F32.as_pointer(), None)
            b.call(micro, [h.gep(b, ctx.ins[0], a_off), h.gep(b, ctx.ins[1], b_off), null, null, h.gep(b, y, y_off), null])
        else:
            matmul_rows(ctx, m, k, n, lambda mi, ki: ctx.read(0, b.add(a_off, h.linear(b, (mi, ki), (k, 1)))),
                        lambda ki, ni: ctx.read(1, b.add(b_off, h.linear(b, (ki, ni), (n, 1)))), y_off)


def _row_b_gemm(ctx: KernelContext, m: int, n: int, k: int) -> ir.Function | None:
    """The register-blocked micro-kernel on a plain row-major B, for an f32 MatMul of two computed
    operands (attention's Q K^T and A V): the row loop below left N = 65 columns to LLVM's vectorizer, at
    about 1/6 of the speed of N = 32 (ViT-tiny's 4x65x32 by 4x32x65)."""
    if ctx.out_types[0].dtype is not DType.F32 or ctx.scalar(0) is not None or ctx.scalar(1) is not None or not k:
        return None
    fn = emit_gemm(ctx.module, f"{ctx.name}_mk", ctx.target, m, n, k, b_layout="row")
    fn.linkage = "internal"
    return fn
