"""ReduceMin/ReduceProd, ArgMax/ArgMin and CumSum/CumProd's per-element code (entries of
``gathers.PER_ELEMENT``): each output element walks a line of its input, along the reduced or
scanned axes, in the reference's order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from llvmlite import ir

from ..ir.dtypes import DType
from ..ir.types import TensorType
from . import irhelpers as h
from .halfprec import float_convert


def cumulative(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType], prod: bool):
    """The sum (product) along the axis of the elements before (reverse: after) this one, itself
    included unless exclusive; floats accumulate in f64, as the reference does, and are rounded once."""
    shape, dtype = tuple(ins[0].shape), ins[0].dtype
    axis = a["axis"] % len(shape)
    st = h.contiguous_strides(shape)
    ty = h.LLTYPE[dtype]
    acc_ty = h.F64 if dtype.is_float else ty
    pred = {(0, 0): "<=", (1, 0): "<", (0, 1): ">=", (1, 1): ">"}[(a["exclusive"], a["reverse"])]

    def value(b, idx, ptrs):
        unit = int(prod)
        start = h.const(acc_ty, float(unit)) if dtype.is_float else ir.Constant(ty, unit)

        def step(acc, j):
            pos = [j if d == axis else idx[d] for d in range(len(shape))]
            x = h.load(b, ptrs[0], h.linear(b, pos, st))
            x = float_convert(b, x, acc_ty) if dtype.is_float else x
            x = b.select(b.icmp_signed(pred, j, idx[axis]), x, start)
            if prod:
                return b.fmul(acc, x) if dtype.is_float else b.mul(acc, x)
            return b.fadd(acc, x) if dtype.is_float else b.add(acc, x)

        total = h.reduce_range(b, shape[axis], start, step, "k")
        return float_convert(b, total, ty) if dtype.is_float else total

    return value


# --- ReduceMin, ReduceProd, ArgMax, ArgMin ---------------------------------------------------------
def _reduced(a: Mapping, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """(reduced axes, kept axes) of a Reduce* node."""
    rank = len(shape)
    axes = sorted({ax % rank for ax in a["axes"]}) if a["axes"] else list(range(rank))
    return axes, [d for d in range(rank) if d not in axes]


def _positions(b: ir.IRBuilder, r: ir.Value, dims: Sequence[int]) -> list[ir.Value]:
    """Linear index ``r`` over ``dims`` as one index per dimension."""
    return [b.urem(b.udiv(r, h.i64(math.prod(dims[j + 1:]))), h.i64(dims[j])) for j in range(len(dims))]


def reduce_min_prod(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType], prod: bool):
    """ReduceMin (NaN wins, as in NumPy; an empty one is the dtype's highest) and ReduceProd (floats
    multiply in f64 as the reference does); the output index holds the kept axes, reduced ones too
    under keepdims."""
    shape, dtype = tuple(ins[0].shape), ins[0].dtype
    axes, kept = _reduced(a, shape)
    st = h.contiguous_strides(shape)
    ty = h.LLTYPE[dtype]
    acc_ty = h.F64 if prod and dtype.is_float else ty
    signed = dtype in h.SIGNED
    red = [shape[d] for d in axes]

    def value(b, idx, ptrs):
        kidx = [idx[d] for d in kept] if a["keepdims"] else list(idx)
        base = h.linear(b, kidx, [st[d] for d in kept])

        def step(acc, r):
            x = h.load(b, ptrs[0], b.add(base, h.linear(b, _positions(b, r, red), [st[d] for d in axes])))
            if prod:
                x = float_convert(b, x, acc_ty) if dtype.is_float else x
                return b.fmul(acc, x) if dtype.is_float else b.mul(acc, x)
            if dtype.is_float:
                return h.call_intrinsic(b, "llvm.minimum", acc, x)
            return b.select((b.icmp_signed if signed else b.icmp_unsigned)("<", x, acc), x, acc)

        if prod:
            init = h.const(acc_ty, 1.0) if dtype.is_float else ir.Constant(ty, 1)
        elif dtype.is_float:
            init = h.const(ty, float("inf"))
        else:
            init = ir.Constant(ty, (1 << (ty.width - 1)) - 1 if signed else 1 if dtype is DType.BOOL else (1 << ty.width) - 1)
        total = h.reduce_range(b, math.prod(red), init, step, "r")
        return float_convert(b, total, ty) if prod and dtype.is_float else total

    return value


def arg_extreme(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType], largest: bool):
    """ArgMax/ArgMin: the first (select_last_index: last) position of the extreme along the axis."""
    shape, dtype = tuple(ins[0].shape), ins[0].dtype
    axis = a["axis"] % len(shape)
    st = h.contiguous_strides(shape)
    pred = (">" if largest else "<") + ("=" if a["select_last_index"] else "")
    signed = dtype in h.SIGNED

    def value(b, idx, ptrs):
        pos = list(idx) if a["keepdims"] else list(idx[:axis]) + [h.i64(0)] + list(idx[axis:])
        base = h.linear(b, [p for d, p in enumerate(pos) if d != axis], [s for d, s in enumerate(st) if d != axis])
        at = h.i64(0)
        best = h.load(b, ptrs[0], base)
        best_slot, at_slot = h.entry_alloca(b, best.type, "best"), h.entry_alloca(b, h.I64, "at")
        b.store(best, best_slot)
        b.store(at, at_slot)
        with h.for_range(b, shape[axis], start=1, name="j") as j:
            x = h.load(b, ptrs[0], b.add(base, b.mul(j, h.i64(st[axis]))))
            cur = b.load(best_slot)
            if dtype.is_float:  # NaN is the extreme, as in the reference (NumPy): first or last NaN wins
                x_nan, cur_nan = b.fcmp_unordered("uno", x, x), b.fcmp_unordered("uno", cur, cur)
                if a["select_last_index"]:
                    better = b.or_(x_nan, b.and_(b.not_(cur_nan), b.fcmp_ordered(pred, x, cur)))
                else:
                    better = b.and_(b.not_(cur_nan), b.or_(x_nan, b.fcmp_ordered(pred, x, cur)))
            else:
                better = (b.icmp_signed if signed else b.icmp_unsigned)(pred, x, cur)
            b.store(b.select(better, x, cur), best_slot)
            b.store(b.select(better, j, b.load(at_slot)), at_slot)
        return b.load(at_slot)

    return value
