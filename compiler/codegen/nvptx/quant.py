"""GPU element code of the quant family: one thread per output element, ``dp4a`` for the dot products.

QConv and QMatMul gather four (activation, weight) byte pairs along K into two 32-bit words and
add their dot product with one ``dp4a`` (``llvm.nvvm.idp4a``, sm_61 and newer); padding taps
read the zero point, so ``sum((x - zp) * w) = dp4a-sum - zp * sum(w)`` (the weight sum by a second
``dp4a`` against ones). Requantization and the Q/DQ arithmetic are ``codegen/quant_math.py``'s, as
on the CPU, so both backends equal the reference bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from ...ir.dtypes import DType
from ...ops.quant import QuantParams, add_multipliers, clamp_bounds, multiplier
from .. import irhelpers as h
from .. import quant_math as qm
from ..irhelpers import broadcast_strides
from .common import in_range, lin, store_at
from .context import Loop, OpContext

ONES = 0x01010101


def _pack4(b: ir.IRBuilder, bytes_: Sequence[ir.Value]) -> ir.Value:
    word = h.const(h.I32, 0)
    for i, v in enumerate(bytes_):
        word = b.or_(word, b.shl(b.zext(v, h.I32), h.const(h.I32, 8 * i)))
    return word


def _dp4a(b: ir.IRBuilder, x_dtype: DType, x4: ir.Value, w4: ir.Value, acc: ir.Value) -> ir.Value:
    sign = "s" if x_dtype is DType.I8 else "u"
    fn = h.intrinsic(b.module, f"llvm.nvvm.idp4a.{sign}.s", h.I32, [h.I32, h.I32, h.I32])
    return b.call(fn, [x4, w4, acc])


def _sum_pair(b: ir.IRBuilder, count: int, step) -> tuple[ir.Value, ir.Value]:
    """(acc, weight sum) after ``count`` runtime steps ``step((acc, wsum), i)``, from zero."""
    zero = h.const(h.I32, 0)
    if count == 0:
        return zero, zero
    slots = [h.entry_alloca(b, h.I32, "acc"), h.entry_alloca(b, h.I32, "wsum")]
    for s in slots:
        b.store(zero, s)
    with h.for_range(b, count, name="q") as i:
        for s, v in zip(slots, step((b.load(slots[0]), b.load(slots[1])), i)):
            b.store(v, s)
    return b.load(slots[0]), b.load(slots[1])


def _channel(ctx: OpContext, p: QuantParams, idx) -> ir.Value | None:
    return None if p.per_tensor else idx[p.axis % len(ctx.shape(0))]


def quantize(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    p = QuantParams(a["to"], a["scale"], a["zero_point"], a["axis"])
    lo, hi = clamp_bounds(a["to"], ())
    st = h.contiguous_strides(ctx.shape(0))

    def value(b, idx):
        ch = _channel(ctx, p, idx)
        scale = qm.channel_value(b, np.float32(p.scale), h.F32, ch, "q.s")
        zp = qm.channel_value(b, np.float32(p.zero_point), h.F32, ch, "q.z")
        return qm.saturate(b, b.fdiv(ctx.load(0, lin(b, idx, st)), scale), zp, lo, hi, h.LLTYPE[p.dtype])

    return [store_at(ctx, 0, value)]


def dequantize(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    dtype = ctx.in_types[0].dtype
    p = QuantParams(dtype, a["scale"], a["zero_point"], a["axis"])
    st = h.contiguous_strides(ctx.shape(0))

    def value(b, idx):
        ch = _channel(ctx, p, idx)
        scale = qm.channel_value(b, np.float32(p.scale), h.F32, ch, "dq.s")
        zp = qm.channel_value(b, p.zero_point, h.I32, ch, "dq.z")
        return qm.dequantize(b, ctx.load(0, lin(b, idx, st)), dtype, zp, scale)

    return [store_at(ctx, 0, value)]


def qadd(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    ma, mb = add_multipliers(a)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    out = ctx.out_shape
    strides = [broadcast_strides(ctx.shape(k), out) for k in range(2)]

    def value(b, idx):
        terms = []
        for k, (zp, m) in enumerate(((a["a_zero_point"], ma), (a["b_zero_point"], mb))):
            q = qm.widen(b, ctx.load(k, lin(b, idx, strides[k])), ctx.in_types[k].dtype)
            terms.append(b.fmul(b.sitofp(b.sub(q, h.const(h.I32, zp)), h.F32), h.const(h.F32, float(m))))
        return qm.saturate(b, b.fadd(terms[0], terms[1]), float(a["y_zero_point"]), lo, hi)

    return [store_at(ctx, 0, value)]


def qconv(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    xs, ws = ctx.shape(0), ctx.shape(1)
    nd = len(xs) - 2
    m, cg, ks = ws[0], ws[1], ws[2:]
    taps = math.prod(ks)
    strides, dil, pads, group = a["strides"], a["dilations"], a["pads"][:nd], a["group"]
    xst, wst = h.contiguous_strides(xs), h.contiguous_strides(ws)
    dtype = ctx.in_types[0].dtype
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mvals = multiplier(a["x_scale"], a["w_scale"], a["y_scale"])
    xz = a["x_zero_point"]
    fill = ir.Constant(h.I8, xz & 0xFF)

    def value(b, idx):
        n, oc, sp = idx[0], idx[1], idx[2:]
        ch0 = b.mul(b.udiv(oc, h.i64(m // group)), h.i64(cg))
        ones = h.const(h.I32, ONES)

        def tap_reads(ic: ir.Value, tap: int):
            t = [tap // math.prod(ks[d + 1:]) % ks[d] for d in range(nd)]
            pos = [b.add(b.mul(sp[d], h.i64(strides[d])), h.i64(t[d] * dil[d] - pads[d])) for d in range(nd)]
            ok = in_range(b, pos[0], xs[2])
            for d in range(1, nd):
                ok = b.and_(ok, in_range(b, pos[d], xs[2 + d]))
            xi = lin(b, pos, xst[2:], lin(b, [n, b.add(ch0, ic)], xst[:2]))
            xv = b.select(ok, ctx.load(0, b.select(ok, xi, h.i64(0))), fill)
            wv = ctx.load(1, lin(b, [oc, ic], wst[:2], sum(t[d] * wst[2 + d] for d in range(nd))))
            return xv, wv

        def quad(state, c4):
            acc, wsum = state
            for tap in range(taps):
                pairs = [tap_reads(b.add(b.mul(c4, h.i64(4)), h.i64(j)), tap) for j in range(4)]
                w4 = _pack4(b, [w for _, w in pairs])
                acc = _dp4a(b, dtype, _pack4(b, [x for x, _ in pairs]), w4, acc)
                wsum = _dp4a(b, DType.I8, ones, w4, wsum)
            return acc, wsum

        acc, wsum = _sum_pair(b, cg // 4, quad)
        for ic in range(4 * (cg // 4), cg):  # channels after the last quad
            for tap in range(taps):
                xv, wv = tap_reads(h.i64(ic), tap)
                w32 = b.sext(wv, h.I32)
                acc = b.add(acc, b.mul(qm.widen(b, xv, dtype), w32))
                wsum = b.add(wsum, w32)
        acc = b.sub(acc, b.mul(wsum, h.const(h.I32, xz)))
        if len(ctx.in_types) == 3:
            acc = b.add(acc, ctx.load(2, oc))
        mult = qm.channel_value(b, mvals, h.F32, oc, "qconv.m")
        return qm.requantize(b, acc, mult, a["y_zero_point"], lo, hi)

    return [store_at(ctx, 0, value)]


def qmatmul(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    k, n = ctx.shape(1)
    dtype = ctx.in_types[0].dtype
    mvals = multiplier(a["a_scale"], a["b_scale"], a["y_scale"])
    az = a["a_zero_point"]
    rows = math.prod(ctx.shape(0)[:-1])

    def body(b, idx, i):
        r, col = b.udiv(i, h.i64(n)), b.urem(i, h.i64(n))
        ones = h.const(h.I32, ONES)
        row = b.mul(r, h.i64(k))

        def quad(state, k4):
            acc, wsum = state
            k0 = b.mul(k4, h.i64(4))
            xs = [ctx.load(0, b.add(row, b.add(k0, h.i64(j)))) for j in range(4)]
            w4 = _pack4(b, [ctx.load(1, b.add(b.mul(b.add(k0, h.i64(j)), h.i64(n)), col)) for j in range(4)])
            return _dp4a(b, dtype, _pack4(b, xs), w4, acc), _dp4a(b, DType.I8, ones, w4, wsum)

        acc, wsum = _sum_pair(b, k // 4, quad)
        for kk in range(k - k % 4, k):
            w32 = b.sext(ctx.load(1, b.add(h.i64(kk * n), col)), h.I32)
            acc = b.add(acc, b.mul(qm.widen(b, ctx.load(0, b.add(row, h.i64(kk))), dtype), w32))
            wsum = b.add(wsum, w32)
        acc = b.sub(acc, b.mul(wsum, h.const(h.I32, az)))
        if len(ctx.in_types) == 3:
            acc = b.add(acc, ctx.load(2, col))
        mult = qm.channel_value(b, mvals, h.F32, col, "qmatmul.m")
        h.store(b, qm.finish(b, acc, mult, a), ctx.outs[0], i)

    return [Loop((rows * n,), body)]


EMITTERS = {"QuantizeLinear": quantize, "DequantizeLinear": dequantize, "QAdd": qadd, "QConv": qconv,
            "QMatMul": qmatmul}
