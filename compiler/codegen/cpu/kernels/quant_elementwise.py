"""Quant family kernels applied element by element: QuantizeLinear, DequantizeLinear (per tensor or per
channel of an axis) and QAdd, each with ``codegen/quant_math.py``'s arithmetic, bit for bit the
reference's."""

from __future__ import annotations

import math

import numpy as np

from ....ops.quant import QuantParams, add_multipliers, clamp_bounds
from ... import irhelpers as h
from ... import quant_math as qm
from .base import KernelContext, kernel
from .elementwise import emit_map


def _per_channel_map(ctx: KernelContext, p: QuantParams, fn) -> None:
    """out[i] = fn(b, in[i], channel) over (outer, C, inner) of the quantization axis."""
    shape = ctx.shape(0)
    if p.per_tensor:
        emit_map(ctx, lambda xs: fn(ctx.b, xs[0], None), [0])
        return
    ax = p.axis % len(shape)
    outer, c, inner = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])
    b = ctx.b
    with h.loop_nest(b, (outer, c, inner)) as (o, ch, i):
        idx = h.linear(b, (o, ch, i), (c * inner, inner, 1))
        h.store(b, fn(b, ctx.read(0, idx), ch), ctx.outs[0], idx)


@kernel("QuantizeLinear")
def emit_quantize(ctx: KernelContext) -> None:
    a = ctx.attrs
    p = QuantParams(a["to"], a["scale"], a["zero_point"], a["axis"])
    lo, hi = clamp_bounds(a["to"], ())

    def fn(b, x, ch):
        scale = qm.channel_value(b, np.float32(p.scale), h.F32, ch, f"{ctx.name}.s")
        zp = qm.channel_value(b, np.float32(p.zero_point), h.F32, ch, f"{ctx.name}.z")
        return qm.saturate(b, b.fdiv(x, scale), zp, lo, hi, h.LLTYPE[p.dtype])

    _per_channel_map(ctx, p, fn)


@kernel("DequantizeLinear")
def emit_dequantize(ctx: KernelContext) -> None:
    a = ctx.attrs
    dtype = ctx.in_types[0].dtype
    p = QuantParams(dtype, a["scale"], a["zero_point"], a["axis"])

    def fn(b, q, ch):
        scale = qm.channel_value(b, np.float32(p.scale), h.F32, ch, f"{ctx.name}.s")
        zp = qm.channel_value(b, p.zero_point, h.I32, ch, f"{ctx.name}.z")
        return qm.dequantize(b, q, dtype, zp, scale)

    _per_channel_map(ctx, p, fn)


@kernel("QAdd")
def emit_qadd(ctx: KernelContext) -> None:
    a = ctx.attrs
    ma, mb = add_multipliers(a)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    da, db = ctx.in_types[0].dtype, ctx.in_types[1].dtype

    def fn(xs):
        b = ctx.b
        fa = b.fmul(b.sitofp(b.sub(qm.widen(b, xs[0], da), h.const(h.I32, a["a_zero_point"])), h.F32),
                    h.const(h.F32, float(ma)))
        fb = b.fmul(b.sitofp(b.sub(qm.widen(b, xs[1], db), h.const(h.I32, a["b_zero_point"])), h.F32),
                    h.const(h.F32, float(mb)))
        return qm.saturate(b, b.fadd(fa, fb), float(a["y_zero_point"]), lo, hi)

    emit_map(ctx, fn, [0, 1])
