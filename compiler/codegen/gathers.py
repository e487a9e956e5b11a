"""Per-output-element code both backends share, for ops whose output element reads a computed set of
input elements (ConvTranspose's taps, Resize's interpolation taps; a line of a reduction or scan in
``reductions.py``).

Each entry of :data:`PER_ELEMENT` turns (attributes, input types, output types) into
``value(builder, output index per dimension, input pointers) -> element`` (an op with
``OpDef.run_time_check`` gets the model's fault word after its inputs): the CPU kernel runs it in
a loop nest over the output, the NVPTX kernel once per thread. Taps that fall outside the input
read a clamped index and are masked with ``select``, so no branch depends on the data. Tables known
at compile time (Resize's indices and weights) are internal constant globals of the module.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from llvmlite import ir

from ..ir.dtypes import DType
from ..ir.types import TensorType
from ..ops.resample import integer_fill, resize_attrs, resize_taps
from . import irhelpers as h
from .grid_sample import grid_sample
from .halfprec import float_convert
from .reductions import arg_extreme, cumulative, reduce_min_prod
from .scatter import checked_index, gather_nd, scatter_elements, scatter_nd

Value = Callable[[ir.IRBuilder, Sequence[ir.Value], Sequence[ir.Value]], ir.Value]
Factory = Callable[[Mapping, Sequence[TensorType], Sequence[TensorType]], Value]


def _masked(b: ir.IRBuilder, ptr: ir.Value, index: ir.Value, ok: ir.Value, fill: ir.Value) -> ir.Value:
    return b.select(ok, h.load(b, ptr, b.select(ok, index, h.i64(0))), fill)


def _all(b: ir.IRBuilder, conds: Sequence[ir.Value]) -> ir.Value:
    out = ir.Constant(h.I1, 1)
    for c in conds:
        out = b.and_(out, c)
    return out


def table(b: ir.IRBuilder, prefix: str, values: np.ndarray, ty: ir.Type) -> ir.Value:
    """An internal constant global holding ``values`` (as ``ty``); a pointer to its first element."""
    arr = ir.ArrayType(ty, max(len(values), 1))
    g = ir.GlobalVariable(b.module, arr, b.module.get_unique_name(prefix))
    g.global_constant, g.linkage = True, "internal"
    items = values.tolist() or [0]
    g.initializer = ir.Constant(arr, [ir.Constant(ty, int(v) if isinstance(ty, ir.IntType) else float(v)) for v in items])
    return b.bitcast(g, ty.as_pointer())


def _fma_taps(b: ir.IRBuilder, ptrs, taps, xbase: ir.Value, wbase: ir.Value, acc: ir.Value, ty: ir.Type,
              acc_ty: ir.Type) -> ir.Value:
    """``acc`` + the masked ``taps`` (ok, x offset, w offset: an int or a value) of x * w."""
    for ok, xoff, woff in taps:
        xv = float_convert(b, _masked(b, ptrs[0], b.add(xbase, xoff), ok, h.const(ty, 0.0)), acc_ty)
        wv = float_convert(b, h.load(b, ptrs[1], b.add(wbase, woff if isinstance(woff, ir.Value) else h.i64(woff))), acc_ty)
        acc = h.call_intrinsic(b, "llvm.fma", xv, wv, acc)
    return acc


def _tap_sum(b: ir.IRBuilder, ptrs, channel_sum, channels: int, bases, bias_at, ty: ir.Type, acc_ty: ir.Type) -> ir.Value:
    """bias + the sum over ``channels`` of ``channel_sum(acc, x base, w base)`` (one channel's taps),
    in ``acc_ty``; ``bases(c)`` gives channel c's x and w base indices."""

    def per_channel(acc, c):
        return channel_sum(acc, *bases(c))

    init = float_convert(b, h.load(b, ptrs[2], bias_at), acc_ty) if bias_at is not None else h.const(acc_ty, 0.0)
    return float_convert(b, h.reduce_range(b, channels, init, per_channel, "c") if channels else init, ty)


# --- ConvTranspose ---------------------------------------------------------------------------------
def conv_transpose(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> Value:
    """y[n, m, o] = b[m] + sum over the group's channels c and taps t with o + pad - t*dil = i*stride
    (0 <= i < in) of x[n, c, i] * w[c, m mod M/g, t]."""
    xs, ws = tuple(ins[0].shape), tuple(ins[1].shape)
    nd, cg, mg = len(xs) - 2, xs[1] // a["group"], ws[1]
    kernel = ws[2:]
    xst, wst = h.contiguous_strides(xs), h.contiguous_strides(ws)
    strides, dil, pads = a["strides"], a["dilations"], a["pads"][:nd]
    ty = h.LLTYPE[outs[0].dtype]
    acc_ty = h.F64 if outs[0].dtype is DType.F64 else h.F32  # f16 accumulates in f32
    bias = len(ins) > 2

    def value(b, idx, ptrs):
        n, m, sp = idx[0], idx[1], idx[2:]
        group, ml = b.udiv(m, h.i64(mg)), b.urem(m, h.i64(mg))
        taps = []
        for t in itertools.product(*(range(k) for k in kernel)):
            oks, pos = [], []
            for d in range(nd):
                q = b.add(sp[d], h.i64(pads[d] - t[d] * dil[d]))
                i = b.udiv(q, h.i64(strides[d]))
                oks += [b.icmp_signed(">=", q, h.i64(0)), b.icmp_unsigned("<", i, h.i64(xs[2 + d]))]
                if strides[d] > 1:
                    oks.append(b.icmp_unsigned("==", b.urem(q, h.i64(strides[d])), h.i64(0)))
                pos.append(i)
            taps.append((_all(b, oks), h.linear(b, pos, xst[2:]), sum(tt * s for tt, s in zip(t, wst[2:]))))

        def bases(c):
            ch = b.add(b.mul(group, h.i64(cg)), c)
            return h.linear(b, [n, ch], xst[:2]), h.linear(b, [ch, ml], wst[:2])

        return _tap_sum(b, ptrs, lambda acc, xb, wb: _fma_taps(b, ptrs, taps, xb, wb, acc, ty, acc_ty), cg, bases,
                        m if bias else None, ty, acc_ty)

    return value


# --- Conv beyond two spatial dims ------------------------------------------------------------------
UNROLLED_TAPS = 32
"""At most this many taps of a direct N-d convolution are unrolled per channel: the innermost kernel
axes whose product fits (the last one always), the outer ones are loops. A 5x5x5 pooling window
unrolled whole was 155 KB of IR and 0.4 s of LLVM time; 3x3x3 stays fully unrolled."""


def _unrolled_from(kernel: Sequence[int]) -> int:
    """The first kernel axis of the unrolled inner block (see :data:`UNROLLED_TAPS`)."""
    s = len(kernel) - 1
    while s > 0 and math.prod(kernel[s - 1:]) <= UNROLLED_TAPS:
        s -= 1
    return s


def conv_nd(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType], bias: bool) -> Value:
    """Direct N-d convolution: per output element, the group's channels times the taps (the outer
    kernel axes looped, the inner ones unrolled: :data:`UNROLLED_TAPS`), a tap over the padding
    masked (f16 accumulates in f32)."""
    xs, ws = tuple(ins[0].shape), tuple(ins[1].shape)
    nd, cg, mg = len(xs) - 2, ws[1], ws[0] // a["group"]
    kernel = ws[2:]
    xst, wst = h.contiguous_strides(xs), h.contiguous_strides(ws)
    strides, dil, pads = a["strides"], a["dilations"], a["pads"][:nd]
    ty = h.LLTYPE[outs[0].dtype]
    acc_ty = h.F64 if outs[0].dtype is DType.F64 else h.F32
    inner = _unrolled_from(kernel)

    def value(b, idx, ptrs):
        n, m, sp = idx[0], idx[1], idx[2:]
        ch0 = b.mul(b.udiv(m, h.i64(mg)), h.i64(cg))

        def taps(outer: Sequence[ir.Value]) -> list:
            """The unrolled block's taps at the outer axes' tap indices ``outer``."""
            base = [b.add(b.mul(sp[d], h.i64(strides[d])), b.sub(b.mul(t, h.i64(dil[d])), h.i64(pads[d])))
                    for d, t in enumerate(outer)]
            woff = h.linear(b, outer, wst[2:2 + inner]) if outer else None
            out = []
            for t in itertools.product(*(range(k) for k in kernel[inner:])):
                pos = base + [b.add(b.mul(sp[d], h.i64(strides[d])), h.i64(t[d - inner] * dil[d] - pads[d]))
                              for d in range(inner, nd)]
                ok = _all(b, [b.icmp_unsigned("<", p, h.i64(xs[2 + d])) for d, p in enumerate(pos)])
                w = sum(tt * s for tt, s in zip(t, wst[2 + inner:]))
                out.append((ok, h.linear(b, pos, xst[2:]), w if woff is None else b.add(woff, h.i64(w))))
            return out

        fixed = taps([]) if inner == 0 else None  # all unrolled: the taps do not depend on the channel

        def channel_sum(acc, xb, wb, outer=()):
            if fixed is not None:
                return _fma_taps(b, ptrs, fixed, xb, wb, acc, ty, acc_ty)
            if len(outer) == inner:
                return _fma_taps(b, ptrs, taps(outer), xb, wb, acc, ty, acc_ty)
            return h.reduce_range(b, kernel[len(outer)], acc, lambda a_, t: channel_sum(a_, xb, wb, (*outer, t)),
                                  f"t{len(outer)}")

        def bases(c):
            return h.linear(b, [n, b.add(ch0, c)], xst[:2]), h.linear(b, [m, c], wst[:2])

        return _tap_sum(b, ptrs, channel_sum, cg, bases, m if bias else None, ty, acc_ty)

    return value


# --- Resize ----------------------------------------------------------------------------------------
def resize(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> Value:
    """A sum over the product of the resized axes' taps (one tap each for nearest: a plain load);
    floats in f32 (f64 for f64 data), rounded once; integers (nearest: weights 0 or 1) in their own
    type, as the reference, so every value is copied exactly."""
    shape = tuple(ins[0].shape)
    full = resize_attrs(a, shape)
    taps = {axis: t for axis, n in enumerate(shape) if (t := resize_taps(full, axis, n)) is not None}
    dtype = outs[0].dtype
    ty = h.LLTYPE[dtype]
    acc_ty = ty if not dtype.is_float else h.F32 if dtype in (DType.F32, DType.F16) else h.F64
    st = h.contiguous_strides(shape)
    gather = all(t.index.shape[1] == 1 for t in taps.values())
    outside = any(t.outside.any() for t in taps.values())
    fill = h.const(ty, a["extrapolation_value"]) if dtype.is_float else \
        ir.Constant(ty, integer_fill(a["extrapolation_value"], dtype.numpy))

    def value(b, idx, ptrs):
        base = h.linear(b, [idx[d] for d in range(len(shape)) if d not in taps], [st[d] for d in range(len(shape)) if d not in taps])
        per_axis, out = [], []
        for axis, t in taps.items():
            n = t.index.shape[1]
            row = b.mul(idx[axis], h.i64(n))
            itab = table(b, "resize.index", t.index.reshape(-1) * st[axis], h.I64)
            wtab = None if gather else table(b, "resize.weight", t.weight.reshape(-1), acc_ty)
            per_axis.append([(h.load(b, itab, b.add(row, h.i64(j))),
                              None if gather else h.load(b, wtab, b.add(row, h.i64(j)))) for j in range(n)])
            if t.outside.any():
                out.append(b.icmp_unsigned("!=", h.load(b, table(b, "resize.outside", t.outside, h.I8), idx[axis]),
                                           ir.Constant(h.I8, 0)))
        if gather:
            v = h.load(b, ptrs[0], b.add(base, _sum(b, [p[0][0] for p in per_axis])))
        else:
            acc = h.const(acc_ty, 0.0) if dtype.is_float else ir.Constant(ty, 0)
            for combo in itertools.product(*per_axis):
                w = functools.reduce(b.fmul if dtype.is_float else b.mul, [wk for _, wk in combo])
                x = h.load(b, ptrs[0], b.add(base, _sum(b, [c[0] for c in combo])))
                acc = h.call_intrinsic(b, "llvm.fma", float_convert(b, x, acc_ty), w, acc) if dtype.is_float \
                    else b.add(acc, b.mul(x, w))
            v = float_convert(b, acc, ty) if dtype.is_float else acc
        if outside:
            v = b.select(_any(b, out), fill, v)
        return v

    return value


def _sum(b: ir.IRBuilder, xs: Sequence[ir.Value]) -> ir.Value:
    acc = h.i64(0)
    for x in xs:
        acc = b.add(acc, x)
    return acc


def _any(b: ir.IRBuilder, conds: Sequence[ir.Value]) -> ir.Value:
    out = ir.Constant(h.I1, 0)
    for c in conds:
        out = b.or_(out, c)
    return out


# --- Trilu, GatherElements -------------------------------------------------------------------------
def trilu(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> Value:
    shape = tuple(ins[0].shape)
    st = h.contiguous_strides(shape)
    ty = h.LLTYPE[ins[0].dtype]
    zero = h.const(ty, 0.0) if ins[0].dtype.is_float else ir.Constant(ty, 0)

    def value(b, idx, ptrs):
        diag = b.sub(idx[-1], idx[-2])  # j - i
        keep = b.icmp_signed(">=" if a["upper"] else "<=", diag, h.i64(a["k"]))
        return b.select(keep, h.load(b, ptrs[0], h.linear(b, idx, st)), zero)

    return value


def gather_elements(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]) -> Value:
    """An index outside [-n, n) is refused as the reference refuses it (OpDef.run_time_check): the
    element reads nothing, is 0, and sets the fault word (``ptrs[2]``)."""
    data, ind = tuple(ins[0].shape), tuple(ins[1].shape)
    axis = a["axis"] % len(data)
    dst, ist = h.contiguous_strides(data), h.contiguous_strides(ind)
    n = data[axis]
    zero = h.const(h.LLTYPE[outs[0].dtype], 0)

    def value(b, idx, ptrs):
        j, inside = checked_index(b, h.load(b, ptrs[1], h.linear(b, idx, ist)), n, ptrs[2])
        if n == 0:
            return zero  # an empty axis: every index is outside it, and there is nothing to read
        pos = [j if d == axis else idx[d] for d in range(len(data))]
        return b.select(inside, h.load(b, ptrs[0], h.linear(b, pos, dst)), zero)

    return value


PER_ELEMENT: Mapping[str, Factory] = {
    "ReduceMin": lambda a, i, o: reduce_min_prod(a, i, o, prod=False),
    "ReduceProd": lambda a, i, o: reduce_min_prod(a, i, o, prod=True),
    "ArgMax": lambda a, i, o: arg_extreme(a, i, o, largest=True),
    "ArgMin": lambda a, i, o: arg_extreme(a, i, o, largest=False),
    "ConvTranspose": conv_transpose, "Resize": resize, "Trilu": trilu, "GatherElements": gather_elements,
    "CumSum": lambda a, i, o: cumulative(a, i, o, prod=False),
    "CumProd": lambda a, i, o: cumulative(a, i, o, prod=True),
    "GridSample": grid_sample, "ScatterElements": scatter_elements, "ScatterND": scatter_nd,
    "GatherND": gather_nd,
}
"""op -> per-element code; both backends give every op listed a kernel built on it."""

