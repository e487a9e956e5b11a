"""QMatMul: constant weights packed as the integer GEMM's vector operand (columns in lanes, their
sums beside them), activation rows broadcast; weights computed at run time (or a bias that is) take
direct loops. Requantized by ``quant_units.py``'s epilogue, as QConv is.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ..int_dot import Dot, choose_dot, pairs_bounded
from ..int_gemm import GemmGeometry, emit_int_gemm
from ...irhelpers import gep
from .base import KernelContext, KernelKey, kernel
from .quant_units import QUADS, dot_of, encoding, multiplier_at, multipliers, requant_epilogue, sums_bytes


def _pack_qmatmul(key: KernelKey, i: int, arr: np.ndarray, target: Target):
    k, n = key.in_types[1].shape
    if len(key.in_types) == 3 and key.packed[2] != "const":
        return None  # a bias computed at run time takes the direct loops, which read plain weights
    if i == 1:
        rows = math.prod(key.in_types[0].shape[:-1])
        dot = choose_dot(target, pairs_bounded(arr.T), tiles=rows >= target.tuning.amx_min_rows)
        per = dot.per_unit
        k4, cols_pad = -(-k // per), -(-n // dot.vl) * dot.vl
        quads = np.zeros((per * k4, cols_pad), dot.unit_dtype)
        quads[:k, :n] = arr
        vec = quads.reshape(k4, per, cols_pad).transpose(0, 2, 1)  # [k4][cols][per]
        sums = np.zeros(sums_bytes(cols_pad) // 4, np.int32)
        sums[:n] = arr.astype(np.int64).sum(axis=0)
        return QUADS + dot.kind, np.concatenate([sums.view(np.uint8), np.ascontiguousarray(vec).view(np.uint8).reshape(-1)])
    if i == 2:
        padded = np.zeros(-(-n // 16) * 16, np.int32)
        padded[:n] = arr
        return "padded", padded
    return None


def _matmul_geometry(key: KernelKey, dot: Dot) -> GemmGeometry:
    k, n = key.in_types[1].shape
    rows = math.prod(key.in_types[0].shape[:-1])
    return GemmGeometry(rows=rows, cols=n, cols_pad=-(-n // dot.vl) * dot.vl, k4=-(-k // dot.per_unit),
                        vec_is_u=False)


def _qmatmul_scratch(key: KernelKey, target: Target) -> int:
    dot = dot_of(key, target)
    if dot is None or (len(key.in_types) == 3 and key.packed[2] != "padded"):
        return 0
    geo = _matmul_geometry(key, dot)
    return geo.rows * 4 * geo.k4 + 64


def _qmatmul_gemm(ctx: KernelContext, dot: Dot) -> None:
    a, b = ctx.attrs, ctx.b
    geo = _matmul_geometry(ctx.key, dot)
    k = ctx.shape(1)[0]
    flip, shift = encoding(ctx.in_types[0].dtype, dot)
    zp_enc = a["a_zero_point"] + shift
    per = dot.per_unit
    elem = ir.IntType(32 // per)
    rows_in = b.bitcast(ctx.scratch, elem.as_pointer())
    h.memset0(b, ctx.scratch, geo.rows * 4 * geo.k4)  # K's padding: its weights are zero
    with h.loop_nest(b, (geo.rows, k), name="a") as (r, kk):
        v = h.load(b, ctx.ins[0], b.add(b.mul(r, h.i64(k)), kk))
        if flip:
            v = b.xor(v, ir.Constant(h.I8, 0x80))
        h.store(b, v if per == 4 else b.zext(v, elem), rows_in, b.add(b.mul(r, h.i64(per * geo.k4)), kk))
    sums = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    bq = gep(b, ctx.ins[1], sums_bytes(geo.cols_pad))
    bias = ctx.ins[2] if len(ctx.in_types) == 3 else None
    mults = multipliers(ctx, ("a_scale", "b_scale", "y_scale"), geo.cols_pad)
    epi = requant_epilogue(ctx, a, mults, False, sums, bias, zp_enc,
                            lambda bb, row: gep(bb, ctx.outs[0], bb.mul(row, h.i64(geo.cols))), geo.cols, dot)
    emit_int_gemm(b, dot, ctx.target, geo, ctx.scratch, bq, epi)


def _qmatmul_direct(ctx: KernelContext) -> None:
    a, b = ctx.attrs, ctx.b
    k, n = ctx.shape(1)
    rows = math.prod(ctx.shape(0)[:-1])
    dtype = ctx.in_types[0].dtype
    mults = multipliers(ctx, ("a_scale", "b_scale", "y_scale"))
    az = h.const(h.I32, a["a_zero_point"])
    with h.loop_nest(b, (rows, n)) as (r, col):
        init = h.load(b, ctx.ins[2], col) if len(ctx.in_types) == 3 else h.const(h.I32, 0)

        def step(acc, kk):
            xv = b.sub(qm.widen(b, h.load(b, ctx.ins[0], b.add(b.mul(r, h.i64(k)), kk)), dtype), az)
            wv = b.sext(h.load(b, ctx.ins[1], b.add(b.mul(kk, h.i64(n)), col)), h.I32)
            return b.add(acc, b.mul(xv, wv))

        acc = h.reduce_range(b, k, init, step, name="k")
        mult = multiplier_at(b, mults, col)
        h.store(b, qm.finish(b, acc, mult, a), ctx.outs[0], b.add(b.mul(r, h.i64(n)), col))


@kernel("QMatMul", pack=_pack_qmatmul, scratch=_qmatmul_scratch)
def emit_qmatmul(ctx: KernelContext) -> None:
    dot = dot_of(ctx.key, ctx.target)
    if dot is not None and (len(ctx.in_types) == 2 or ctx.key.packed[2] == "padded"):
        _qmatmul_gemm(ctx, dot)
    else:
        _qmatmul_direct(ctx)
