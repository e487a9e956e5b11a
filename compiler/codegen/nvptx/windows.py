"""GPU element code for windowed and reducing ops: each thread loops over what its one output needs.

Conv and the pools unroll their taps at emit time; out-of-range taps read a clamped index and are
masked with ``select``. Gemm, MatMul, Softmax, LayerNorm and Reduce* loop over the reduced axis.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from .. import irhelpers as h
from .. import mathfns as m
from ..halfprec import half_round
from ..irhelpers import broadcast_strides
from .common import acc_loop, all_of, fused_tail, has_bias, in_range, lin, mac, masked_load, store_at
from .context import Loop, OpContext


def conv(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    xs, ws = ctx.shape(0), ctx.shape(1)
    nd = len(xs) - 2
    oc, cg, ks = ws[0], ws[1], ws[2:]
    strides, dil, pads, group = a["strides"], a["dilations"], a["pads"][:nd], a["group"]
    ocg = oc // group
    xst, wst = h.contiguous_strides(xs), h.contiguous_strides(ws)
    bias = has_bias(ctx, 2)
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    half = ty == h.F16  # f16 sums in f32 and rounds once, as the reference
    wide = widener(ty)

    def value(b, idx):
        n, mo, sp = idx[0], idx[1], idx[2:]
        ch0 = b.mul(b.udiv(mo, h.i64(ocg)), h.i64(cg))
        acc = wide(b, ctx.load(2, mo)) if bias else h.const(h.F32 if half else ty, 0.0)

        def per_channel(acc, ic):
            xbase = lin(b, [n, b.add(ch0, ic)], xst[:2])
            wbase = lin(b, [mo, ic], wst[:2])
            for tap in range(math.prod(ks)):
                t = [tap // math.prod(ks[d + 1:]) % ks[d] for d in range(nd)]
                pos = [b.add(b.mul(sp[d], h.i64(strides[d])), h.i64(t[d] * dil[d] - pads[d])) for d in range(nd)]
                ok = all_of(b, [in_range(b, p, xs[2 + d]) for d, p in enumerate(pos)])
                xv = masked_load(b, ctx.ins[0], lin(b, pos, xst[2:], xbase), ok, h.const(ty, 0.0))
                wv = ctx.load(1, b.add(wbase, h.i64(sum(t[d] * wst[2 + d] for d in range(nd)))))
                acc = mac(b, wide(b, xv), wide(b, wv), acc)
            return acc

        acc = acc_loop(b, cg, acc, per_channel)
        acc = b.fptrunc(acc, ty) if half else acc
        return fused_tail(ctx, b, acc, lin(b, idx, h.contiguous_strides(ctx.out_shape)), 2 + bias)

    return [store_at(ctx, 0, value)]


def widener(ty: ir.Type):
    """f16 operands widened to f32 (f16 sums in f32 and rounds once, as the reference); others as they are."""
    return (lambda b, v: b.fpext(v, h.F32)) if ty == h.F16 else (lambda b, v: v)


def gemm(ctx: OpContext) -> list[Loop]:
    a = ctx.attrs
    (am, ak), (_, bn) = ctx.shape(0), ctx.shape(1)
    ta, tb = a["transA"], a["transB"]
    K = ak if not ta else am
    M, N = ctx.out_shape
    bias = has_bias(ctx, 2)
    cst = broadcast_strides(ctx.shape(2), (M, N)) if bias else None
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    wide, wty = widener(ty), h.F32 if ty == h.F16 else ty

    def value(b, idx):
        mi, ni = idx

        def step(acc, k):
            av = ctx.load(0, b.add(b.mul(k, h.i64(ak)), mi) if ta else b.add(b.mul(mi, h.i64(ak)), k))
            bv = ctx.load(1, b.add(b.mul(ni, h.i64(bn)), k) if tb else b.add(b.mul(k, h.i64(bn)), ni))
            return mac(b, wide(b, av), wide(b, bv), acc)

        acc = b.fmul(acc_loop(b, K, h.const(wty, 0.0), step), h.const(wty, a["alpha"]))
        if bias:
            acc = b.fadd(acc, b.fmul(wide(b, ctx.load(2, lin(b, idx, cst))), h.const(wty, a["beta"])))
        acc = b.fptrunc(acc, ty) if wty != ty else acc
        return fused_tail(ctx, b, acc, b.add(b.mul(mi, h.i64(N)), ni), 2 + bias)

    return [store_at(ctx, 0, value)]


def matmul(ctx: OpContext) -> list[Loop]:
    sa, sb = list(ctx.shape(0)), list(ctx.shape(1))
    a1, b1 = len(sa) == 1, len(sb) == 1
    sa, sb = ([1] + sa if a1 else sa), (sb + [1] if b1 else sb)
    M, K, N = sa[-2], sa[-1], sb[-1]
    batch = tuple(ctx.out_shape[: len(ctx.out_shape) - (0 if a1 else 1) - (0 if b1 else 1)])
    full = batch + (M, N)
    abst, bbst = broadcast_strides(sa[:-2], batch), broadcast_strides(sb[:-2], batch)
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    wide, wty = widener(ty), h.F32 if ty == h.F16 else ty

    def body(b, idx, i):
        bi, mi, ni = idx[:-2], idx[-2], idx[-1]
        abase = b.add(b.mul(lin(b, bi, abst), h.i64(M * K)), b.mul(mi, h.i64(K)))
        bbase = b.add(b.mul(lin(b, bi, bbst), h.i64(K * N)), ni)

        def step(acc, k):
            return mac(b, wide(b, ctx.load(0, b.add(abase, k))), wide(b, ctx.load(1, b.add(bbase, b.mul(k, h.i64(N))))), acc)

        acc = acc_loop(b, K, h.const(wty, 0.0), step)
        h.store(b, b.fptrunc(acc, ty) if wty != ty else acc, ctx.outs[0], i)

    return [Loop(full, body)]


def pool(ctx: OpContext, kind: str) -> list[Loop]:
    a, xs = ctx.attrs, ctx.shape(0)
    nd = len(xs) - 2
    ks, strides, pads = a["kernel_shape"], a["strides"], a["pads"]
    dil = a.get("dilations", (1,) * nd)
    xst = h.contiguous_strides(xs)
    dtype = ctx.in_types[0].dtype
    ty = h.LLTYPE[dtype]
    lowest = -math.inf if dtype.is_float else int(np.iinfo(dtype.numpy).min)  # MaxPool also takes i8/u8

    def greater(b, v, acc):
        if dtype.is_float:
            return b.fcmp_ordered(">", v, acc)
        return (b.icmp_signed if dtype in h.SIGNED else b.icmp_unsigned)(">", v, acc)

    def value(b, idx):
        base = lin(b, idx[:2], xst[:2])
        acc = h.const(ty, lowest if kind == "max" else 0.0)
        starts = [b.sub(b.mul(idx[2 + d], h.i64(strides[d])), h.i64(pads[d])) for d in range(nd)]
        for tap in range(math.prod(ks)):
            t = [tap // math.prod(ks[d + 1:]) % ks[d] for d in range(nd)]
            pos = [b.add(starts[d], h.i64(t[d] * dil[d])) for d in range(nd)]
            ok = all_of(b, [in_range(b, p, xs[2 + d]) for d, p in enumerate(pos)])
            fill = h.const(ty, lowest if kind == "max" else 0.0)
            v = masked_load(b, ctx.ins[0], lin(b, pos, xst[2:], base), ok, fill)
            acc = b.select(greater(b, v, acc), v, acc) if kind == "max" else b.fadd(acc, v)
        if kind == "max":
            return acc
        div = h.i64(1)
        for d in range(nd):  # per-axis count of the counted region, as the reference's divisor
            lo, hi = (-pads[d], xs[2 + d] + pads[nd + d]) if a["count_include_pad"] else (0, xs[2 + d])
            s, e = starts[d], b.add(starts[d], h.i64(ks[d]))
            e = b.select(b.icmp_signed("<", e, h.i64(hi)), e, h.i64(hi))
            s = b.select(b.icmp_signed(">", s, h.i64(lo)), s, h.i64(lo))
            div = b.mul(div, b.sub(e, s))
        return b.fdiv(acc, b.sitofp(div, ty))

    return [store_at(ctx, 0, value)]


def global_avg(ctx: OpContext) -> list[Loop]:
    xs = ctx.shape(0)
    plane = math.prod(xs[2:])
    ty = h.LLTYPE[ctx.in_types[0].dtype]

    def value(b, idx):
        base = b.mul(b.add(b.mul(idx[0], h.i64(xs[1])), idx[1]), h.i64(plane))
        total = acc_loop(b, plane, h.const(ty, 0.0), lambda acc, k: b.fadd(acc, ctx.load(0, b.add(base, k))))
        return b.fdiv(total, h.const(ty, float(plane)))

    return [store_at(ctx, 0, value)]


def lrn(ctx: OpContext) -> list[Loop]:
    a, xs = ctx.attrs, ctx.shape(0)
    size, c = a["size"], xs[1]
    before = (size - 1) // 2
    xst = h.contiguous_strides(xs)
    ty = h.LLTYPE[ctx.in_types[0].dtype]

    def value(b, idx):
        i = lin(b, idx, xst)
        acc = h.const(ty, 0.0)
        for j in range(size):
            ch = b.add(idx[1], h.i64(j - before))
            v = masked_load(b, ctx.ins[0], b.add(i, h.i64((j - before) * xst[1])), in_range(b, ch, c), h.const(ty, 0.0))
            acc = h.call_intrinsic(b, "llvm.fma", v, v, acc)
        base = h.call_intrinsic(b, "llvm.fma", acc, h.const(ty, a["alpha"] / size), h.const(ty, a["bias"]))
        return b.fdiv(ctx.load(0, i), m.exp(b, b.fmul(h.const(ty, a["beta"]), m.log(b, base))))

    return [store_at(ctx, 0, value)]


def softmax(ctx: OpContext) -> list[Loop]:
    xs = ctx.shape(0)
    axis = ctx.attrs["axis"] % len(xs)
    st = h.contiguous_strides(xs)
    L, s = xs[axis], st[axis]
    ty = h.LLTYPE[ctx.in_types[0].dtype]
    log = ctx.node_op == "LogSoftmax"

    def value(b, idx):
        i = lin(b, idx, st)
        base = b.sub(i, b.mul(idx[axis], h.i64(s)))
        at = lambda k: ctx.load(0, b.add(base, b.mul(k, h.i64(s))))  # noqa: E731
        def bigger(acc, k):
            v = at(k)
            return b.select(b.fcmp_ordered(">", v, acc), v, acc)

        mx = acc_loop(b, L, h.const(ty, -math.inf), bigger)
        if ty == h.F16 and not log:  # as the reference: shifted values, exponentials and sum rounded to half
            mx32 = b.fpext(mx, h.F32)
            e = lambda v: half_round(b, m.exp(b, half_round(b, b.fsub(b.fpext(v, h.F32), mx32))))  # noqa: E731
            total = half_round(b, acc_loop(b, L, h.const(h.F32, 0.0), lambda acc, k: b.fadd(acc, e(at(k)))))
            return b.fptrunc(b.fdiv(e(ctx.load(0, i)), total), h.F16)
        total = acc_loop(b, L, h.const(ty, 0.0), lambda acc, k: b.fadd(acc, m.exp(b, b.fsub(at(k), mx))))
        d = b.fsub(ctx.load(0, i), mx)
        return b.fsub(d, m.log(b, total)) if log else b.fdiv(m.exp(b, d), total)

    return [store_at(ctx, 0, value)]


def layernorm(ctx: OpContext) -> list[Loop]:
    xs = ctx.shape(0)
    axis = ctx.attrs["axis"] % len(xs)
    D = math.prod(xs[axis:])
    sst = broadcast_strides(ctx.shape(1), xs[axis:])
    bst = broadcast_strides(ctx.shape(2), xs[axis:]) if len(ctx.in_types) > 2 else None
    ty = h.LLTYPE[ctx.in_types[0].dtype]

    def value(b, idx):
        i = lin(b, idx, h.contiguous_strides(xs))
        base = b.sub(i, b.urem(i, h.i64(D)))
        at = lambda k: ctx.load(0, b.add(base, k))  # noqa: E731
        mean = b.fdiv(acc_loop(b, D, h.const(ty, 0.0), lambda acc, k: b.fadd(acc, at(k))), h.const(ty, float(D)))
        def square(acc, k):
            d = b.fsub(at(k), mean)
            return h.call_intrinsic(b, "llvm.fma", d, d, acc)

        sq = acc_loop(b, D, h.const(ty, 0.0), square)
        var = b.fdiv(sq, h.const(ty, float(D)))
        inv = b.fdiv(h.const(ty, 1.0), h.call_intrinsic(b, "llvm.sqrt", b.fadd(var, h.const(ty, ctx.attrs["epsilon"]))))
        y = b.fmul(b.fmul(b.fsub(ctx.load(0, i), mean), inv), ctx.load(1, lin(b, idx[axis:], sst)))
        return b.fadd(y, ctx.load(2, lin(b, idx[axis:], bst))) if bst is not None else y

    return [store_at(ctx, 0, value)]


def reduce(ctx: OpContext) -> list[Loop]:
    xs, a = ctx.shape(0), ctx.attrs
    axes = sorted(ax % len(xs) for ax in a["axes"]) if a["axes"] else list(range(len(xs)))
    kept = [d for d in range(len(xs)) if d not in axes]
    st = h.contiguous_strides(xs)
    red = [xs[d] for d in axes]
    R = math.prod(red)
    ty = h.LLTYPE[ctx.in_types[0].dtype]
    op = ctx.node_op
    signed = ctx.in_types[0].dtype in h.SIGNED
    out_st = h.contiguous_strides([xs[d] for d in kept])

    def body(b, idx, i):
        # the output's linear index i enumerates the kept dimensions whether or not keepdims is set
        kidx = [b.urem(b.udiv(i, h.i64(s)), h.i64(xs[d])) for d, s in zip(kept, out_st)]
        base = lin(b, kidx, [st[d] for d in kept])

        def step(acc, r):
            v = ctx.load(0, b.add(base, lin(b, [b.urem(b.udiv(r, h.i64(math.prod(red[j + 1:]))), h.i64(red[j]))
                                                for j in range(len(red))], [st[d] for d in axes])))
            if op == "ReduceMax":
                return b.select(b.fcmp_ordered(">", v, acc) if h.is_float(ty) else
                                (b.icmp_signed if signed else b.icmp_unsigned)(">", v, acc), v, acc)
            return b.fadd(acc, v) if h.is_float(ty) else b.add(acc, v)

        init = h.const(ty, -math.inf if op == "ReduceMax" else 0.0) if h.is_float(ty) else \
            ir.Constant(ty, -(2 ** (ty.width - 1)) if op == "ReduceMax" and signed else 0)
        acc = acc_loop(b, R, init, step)
        if op == "ReduceMean":
            acc = b.fdiv(acc, h.const(ty, float(R)))
        h.store(b, acc, ctx.outs[0], i)

    return [Loop(ctx.out_shape, body)]
