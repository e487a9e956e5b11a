"""Reductions: ReduceSum/Mean/Max, GlobalAveragePool, Softmax and LogSoftmax.

Reductions walk the input in memory order and accumulate into the output (stride 0 on reduced
axes), so whichever axis is innermost the inner loop is contiguous: a vector reduction when the
reduced axis is innermost (float adds carry ``reassoc`` so LLVM may reorder them), a vector
accumulate otherwise.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ....ir.dtypes import DType
from ....ops.common import norm_axis
from ... import irhelpers as h
from ... import mathfns as m
from ...halfprec import half_round
from .base import KernelContext, kernel
from ...irhelpers import collapse


def lowest(dtype: DType, ty: ir.Type) -> ir.Constant:
    if dtype.is_float:
        return h.const(ty, float("-inf"))
    bits = ty.width
    return ir.Constant(ty, 0 if dtype.is_unsigned else -(1 << (bits - 1)))


def combine(b: ir.IRBuilder, kind: str, dtype: DType, acc: ir.Value, x: ir.Value) -> ir.Value:
    if kind == "max":
        if dtype.is_float:
            return h.call_intrinsic(b, "llvm.maximum", acc, x)
        cmp = b.icmp_signed if dtype in h.SIGNED else b.icmp_unsigned
        return b.select(cmp(">", acc, x), acc, x)
    return b.fadd(acc, x, flags=h.FAST) if dtype.is_float else b.add(acc, x)


def reduce_into(ctx: KernelContext, kind: str, axes: tuple[int, ...], scale: float | None) -> None:
    """f16 sums accumulate in f32 (the kernel's scratch: :func:`_wide_sums`) and round once: in f16,
    5,000 ones summed to 2,048."""
    shape, dtype = ctx.shape(0), ctx.in_types[0].dtype
    ty = h.LLTYPE[dtype]
    b, out = ctx.b, ctx.outs[0]
    wide = kind == "sum" and dtype is DType.F16
    acc, acc_ty = (b.bitcast(ctx.scratch, h.F32.as_pointer()), h.F32) if wide else (out, ty)
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    out_n = math.prod(kept)
    init = lowest(dtype, ty) if kind == "max" else h.const(acc_ty, 0)
    with h.for_range(b, out_n, name="init") as i:
        h.store(b, init, acc, i)
    ostr = [0 if i in axes else s for i, s in enumerate(h.contiguous_strides(kept))]
    dims, (icol, ocol) = collapse(shape, [h.contiguous_strides(shape), ostr])
    with h.loop_nest(b, dims) as idx:
        o = h.linear(b, idx, ocol)
        x = h.load(b, ctx.ins[0], h.linear(b, idx, icol))
        h.store(b, combine(b, kind, dtype, h.load(b, acc, o), b.fpext(x, h.F32) if wide else x), acc, o)
    if scale is not None or wide:
        with h.for_range(b, out_n, name="scale") as i:
            v = h.load(b, acc, i)
            v = v if scale is None else b.fmul(v, h.const(acc_ty, scale))
            h.store(b, b.fptrunc(v, ty) if wide else v, out, i)


def _wide_sums(key, target) -> int:
    """Scratch of a sum over f16: the f32 accumulators, one per output element."""
    return 4 * math.prod(key.out_types[0].shape) if key.in_types[0].dtype is DType.F16 else 0


def _axes(ctx: KernelContext) -> tuple[int, ...]:
    rank = len(ctx.shape(0))
    given = ctx.attrs["axes"]
    return tuple(sorted(norm_axis(ctx.key.op, a, rank) for a in given)) if given else tuple(range(rank))


def _count(ctx: KernelContext, axes) -> int:
    return math.prod(ctx.shape(0)[a] for a in axes)


@kernel("ReduceSum", scratch=_wide_sums)
def emit_reduce_sum(ctx: KernelContext) -> None:
    reduce_into(ctx, "sum", _axes(ctx), None)


@kernel("ReduceMax")
def emit_reduce_max(ctx: KernelContext) -> None:
    reduce_into(ctx, "max", _axes(ctx), None)


@kernel("ReduceMean", scratch=_wide_sums)
def emit_reduce_mean(ctx: KernelContext) -> None:
    axes = _axes(ctx)
    reduce_into(ctx, "sum", axes, _mean_scale(_count(ctx, axes)))


@kernel("GlobalAveragePool", scratch=_wide_sums)
def emit_global_avg(ctx: KernelContext) -> None:
    axes = tuple(range(2, len(ctx.shape(0))))
    reduce_into(ctx, "sum", axes, _mean_scale(_count(ctx, axes)))


def _mean_scale(n: int) -> float:
    """The mean of no elements is NaN (0/0), as the reference's."""
    return 1.0 / n if n else float("nan")


def _softmax(ctx: KernelContext, log: bool) -> None:
    """Per (outer, inner) line along the axis: max, sum of exp(x - max), then normalise."""
    shape = ctx.shape(0)
    axis = norm_axis(ctx.key.op, ctx.attrs["axis"], len(shape))
    outer, d, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    ty = h.LLTYPE[ctx.in_types[0].dtype]
    if d == 0 or outer * inner == 0:
        return
    if ctx.scratch is not None and _across(ctx.key):
        _softmax_across(ctx, outer, d, inner, ty, log)
        return
    with h.loop_nest(b, (outer, inner)) as (o, i):
        base = b.add(b.mul(o, h.i64(d * inner)), i)

        def at(j):
            return b.add(base, b.mul(j, h.i64(inner))) if inner != 1 else b.add(base, j)

        mx = h.reduce_range(b, d, h.const(ty, float("-inf")),
                            lambda acc, j: h.call_intrinsic(b, "llvm.maximum", acc, h.load(b, x, at(j))), "mx")

        if ty == h.F16 and not log:
            _half_softmax_line(b, x, y, at, d, mx)
        else:
            _softmax_line(b, x, y, at, d, mx, ty, log)


def _across(key) -> tuple[int, int] | None:
    """(d, inner) of a float32/64 softmax over an axis with elements after it, else None: its lines run side
    by side (:func:`_softmax_across`)."""
    shape = key.in_types[0].shape
    axis = norm_axis(key.op, dict(key.attrs)["axis"], len(shape))
    inner = math.prod(shape[axis + 1:])
    return (shape[axis], inner) if inner > 1 and key.in_types[0].dtype in (DType.F32, DType.F64) else None


def _across_scratch(key, target) -> int:
    """Each line's running max and sum."""
    got = _across(key)
    return 2 * got[1] * key.in_types[0].dtype.itemsize if got else 0


def _softmax_across(ctx: KernelContext, outer: int, d: int, inner: int, ty, log: bool) -> None:
    """A softmax over an axis with elements after it (WaveNet's over 256 classes of each of 1,024 steps):
    the max, the sum and the result of all ``inner`` lines advance together along the axis, the contiguous
    inner index innermost, which vectorizes; a line at a time read one element per stride (6-11x ONNX
    Runtime's time). Each line still sums in axis order, and the results are those of :func:`_softmax_line`."""
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    mx = b.bitcast(ctx.scratch, ty.as_pointer())
    total = h.gep(b, mx, inner)
    with h.for_range(b, outer, name="o") as o:
        base = b.mul(o, h.i64(d * inner))

        def over_lines(body):
            with h.for_range(b, d, name="j") as j, h.for_range(b, inner, name="i") as i:
                body(b.add(base, b.add(b.mul(j, h.i64(inner)), i)), i)

        with h.for_range(b, inner, name="i0") as i:
            h.store(b, h.const(ty, float("-inf")), mx, i)
            h.store(b, h.const(ty, 0.0), total, i)
        over_lines(lambda at, i: h.store(b, h.call_intrinsic(b, "llvm.maximum", h.load(b, mx, i), h.load(b, x, at)),
                                         mx, i))

        def exp_step(at, i):
            e = m.exp(b, b.fsub(h.load(b, x, at), h.load(b, mx, i)))
            if not log:
                h.store(b, e, y, at)
            h.store(b, b.fadd(h.load(b, total, i), e), total, i)

        over_lines(exp_step)
        with h.for_range(b, inner, name="i1") as i:
            s = h.load(b, total, i)
            h.store(b, m.log(b, s) if log else b.fdiv(h.const(ty, 1.0), s), total, i)
        if log:
            over_lines(lambda at, i: h.store(b, b.fsub(b.fsub(h.load(b, x, at), h.load(b, mx, i)), h.load(b, total, i)),
                                             y, at))
        else:
            over_lines(lambda at, i: h.store(b, b.fmul(h.load(b, y, at), h.load(b, total, i)), y, at))


def _softmax_line(b, x, y, at, d: int, mx, ty, log: bool) -> None:
    """exp(x - max) / sum, or (x - max) - log(sum) as the reference orders it (max + log(sum) first
    rounded the log away: [1e30, 1e30, -1e30] gave 0, not -log 2); f16 (LogSoftmax only: Softmax has
    its own rounding) in f32, rounded once."""
    wide = h.F32 if ty == h.F16 else ty
    mx = b.fpext(mx, wide) if wide != ty else mx

    def shifted(j):
        v = h.load(b, x, at(j))
        return b.fsub(b.fpext(v, wide) if wide != ty else v, mx)

    def exp_step(acc, j):
        e = m.exp(b, shifted(j))
        if not log:
            h.store(b, e, y, at(j))
        return b.fadd(acc, e, flags=h.FAST)

    total = h.reduce_range(b, d, h.const(wide, 0.0), exp_step, "sum")
    if log:
        shift = m.log(b, total)
        with h.for_range(b, d, name="w") as j:
            v = b.fsub(shifted(j), shift)
            h.store(b, b.fptrunc(v, ty) if wide != ty else v, y, at(j))
    else:
        inv = b.fdiv(h.const(ty, 1.0), total)
        with h.for_range(b, d, name="w") as j:
            h.store(b, b.fmul(h.load(b, y, at(j)), inv), y, at(j))


def _half_softmax_line(b, x, y, at, d: int, mx) -> None:
    """f16 Softmax as the reference defines it (ONNX's rounding): the shifted values, their
    exponentials and the sum each rounded to half, the quotient rounded once."""
    mx32 = b.fpext(mx, h.F32)

    def exp_step(acc, j):
        e = half_round(b, m.exp(b, half_round(b, b.fsub(b.fpext(h.load(b, x, at(j)), h.F32), mx32))))
        h.store(b, b.fptrunc(e, h.F16), y, at(j))
        return b.fadd(acc, e)

    total = half_round(b, h.reduce_range(b, d, h.const(h.F32, 0.0), exp_step, "sum"))
    with h.for_range(b, d, name="w") as j:
        h.store(b, b.fptrunc(b.fdiv(b.fpext(h.load(b, y, at(j)), h.F32), total), h.F16), y, at(j))


@kernel("Softmax", scratch=_across_scratch)
def emit_softmax(ctx: KernelContext) -> None:
    _softmax(ctx, log=False)


@kernel("LogSoftmax", scratch=_across_scratch)
def emit_log_softmax(ctx: KernelContext) -> None:
    _softmax(ctx, log=True)
