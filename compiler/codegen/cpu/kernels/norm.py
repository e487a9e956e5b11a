"""Normalisations: BatchNormalization (inference form), LayerNormalization, LRN."""

from __future__ import annotations

import math

from ....ir.dtypes import DType
from ....ops.common import norm_axis
from ... import irhelpers as h
from ... import mathfns as m
from .base import KernelContext, kernel
from ...irhelpers import broadcast_strides, collapse


@kernel("BatchNormalization")
def emit_batch_norm(ctx: KernelContext) -> None:
    """y = x * a[c] + s[c] with a = scale / sqrt(var + eps), s = B - mean * a (per channel, once)."""
    shape = ctx.shape(0)
    n, c, inner = shape[0], shape[1], math.prod(shape[2:])
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    ty, up, down = _arithmetic(ctx)
    eps = h.const(ty, ctx.attrs["epsilon"])
    with h.loop_nest(b, (n, c)) as (i, ch):
        var = up(ctx.read(4, ch))
        a = b.fdiv(up(ctx.read(1, ch)), h.call_intrinsic(b, "llvm.sqrt", b.fadd(var, eps)))
        s = b.fsub(up(ctx.read(2, ch)), b.fmul(up(ctx.read(3, ch)), a))
        base = b.mul(b.add(b.mul(i, h.i64(c)), ch), h.i64(inner))
        with h.for_range(b, inner, name="p") as p:
            k = b.add(base, p)
            h.store(b, down(h.call_intrinsic(b, "llvm.fma", up(h.load(b, x, k)), a, s)), y, k)


def _arithmetic(ctx: KernelContext):
    """(type computed in, widen, narrow): f16 is computed in f32, as an f16 fma would need a library
    call for its exact rounding and f16 sums lose the mean; other types in themselves."""
    b, dtype = ctx.b, ctx.in_types[0].dtype
    if dtype is not DType.F16:
        return h.LLTYPE[dtype], (lambda v: v), (lambda v: v)
    return h.F32, (lambda v: b.fpext(v, h.F32)), (lambda v: b.fptrunc(v, h.F16))


@kernel("LayerNormalization")
def emit_layer_norm(ctx: KernelContext) -> None:
    """Per row of the normalized shape: mean, variance (two passes, stable), then scale and shift."""
    shape = ctx.shape(0)
    axis = norm_axis("LayerNormalization", ctx.attrs["axis"], len(shape))
    normed = shape[axis:]
    rows, d = math.prod(shape[:axis]), math.prod(normed)
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    ty, up, down = _arithmetic(ctx)
    if rows * d == 0:
        return
    params = [broadcast_strides(ctx.shape(i), normed) for i in range(1, len(ctx.in_types))]
    dims, cols = collapse(normed, [h.contiguous_strides(normed)] + params)
    inv_d = h.const(ty, 1.0 / d)
    with h.for_range(b, rows, name="row") as r:
        base = b.mul(r, h.i64(d))

        def at(j):
            return up(h.load(b, x, b.add(base, j)))

        total = h.reduce_range(b, d, h.const(ty, 0.0), lambda acc, j: b.fadd(acc, at(j), flags=h.FAST), "s")
        mean = b.fmul(total, inv_d)

        def sq(acc, j):
            c = b.fsub(at(j), mean)
            return b.fadd(acc, b.fmul(c, c), flags=h.FAST)

        var = b.fmul(h.reduce_range(b, d, h.const(ty, 0.0), sq, "v"), inv_d)
        inv = b.fdiv(h.const(ty, 1.0), h.call_intrinsic(b, "llvm.sqrt", b.fadd(var, h.const(ty, ctx.attrs["epsilon"]))))
        with h.loop_nest(b, dims) as idx:
            k = b.add(base, h.linear(b, idx, cols[0]))
            v = b.fmul(b.fmul(b.fsub(up(h.load(b, x, k)), mean), inv), up(ctx.read(1, h.linear(b, idx, cols[1]))))
            if len(ctx.in_types) == 3:
                v = b.fadd(v, up(ctx.read(2, h.linear(b, idx, cols[2]))))
            h.store(b, down(v), y, k)


@kernel("LRN")
def emit_lrn(ctx: KernelContext) -> None:
    """y = x / (bias + alpha/size * sum of x^2 over the channel window) ** beta."""
    shape = ctx.shape(0)
    n, c, inner = shape[0], shape[1], math.prod(shape[2:])
    size, alpha, beta, bias = (ctx.attrs[k] for k in ("size", "alpha", "beta", "bias"))
    before = (size - 1) // 2
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    ty = h.LLTYPE[ctx.in_types[0].dtype]
    zero = h.const(ty, 0.0)
    with h.loop_nest(b, (n, c)) as (i, ch):
        plane = b.mul(i, h.i64(c))
        with h.for_range(b, inner, name="p") as p:
            acc = zero
            for j in range(size):
                cc = b.add(ch, h.i64(j - before))
                ok = b.and_(b.icmp_signed(">=", cc, h.i64(0)), b.icmp_signed("<", cc, h.i64(c)))
                safe = b.select(ok, cc, ch)
                v = h.load(b, x, b.add(b.mul(b.add(plane, safe), h.i64(inner)), p))
                acc = b.fadd(acc, b.select(ok, b.fmul(v, v), zero))
            k = b.add(b.mul(b.add(plane, ch), h.i64(inner)), p)
            base = h.call_intrinsic(b, "llvm.fma", acc, h.const(ty, alpha / size), h.const(ty, bias))
            h.store(b, b.fmul(h.load(b, x, k), m.exp(b, b.fmul(h.const(ty, -beta), m.log(b, base)))), y, k)
