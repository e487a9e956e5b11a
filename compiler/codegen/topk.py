"""TopKIndices' code, one sequential body both backends share (``sequential.SEQUENTIAL``): per line along
the axis, each element in index order is inserted into the line's k best so far (kept best first, in
the output itself), so the work is n * k per line and nothing beyond the output is needed. An element
goes after every kept one it does not beat: kept ones have lower indices, so equal values stay in
index order. NaN beats every number (ranks first when largest, last when smallest), as the reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from llvmlite import ir

from ..ir.types import TensorType
from ..ops.common import norm_axis
from . import irhelpers as h


def _beats(b: ir.IRBuilder, v: ir.Value, w: ir.Value, largest: bool, signed: bool) -> ir.Value:
    """Whether v ranks before w (strictly)."""
    if not h.is_float(v.type):
        cmp = b.icmp_signed if signed else b.icmp_unsigned
        return cmp(">" if largest else "<", v, w)
    v_nan, w_nan = b.fcmp_unordered("uno", v, v), b.fcmp_unordered("uno", w, w)
    nan_first = b.and_(v_nan, b.not_(w_nan)) if largest else b.and_(w_nan, b.not_(v_nan))
    return b.or_(b.fcmp_ordered(">" if largest else "<", v, w), nan_first)


def top_k_indices(b: ir.IRBuilder, a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType],
                  ptrs: Sequence[ir.Value], out: ir.Value) -> None:
    shape = tuple(ins[0].shape)
    axis = norm_axis("TopKIndices", a["axis"], len(shape))
    n, k, largest = shape[axis], a["k"], bool(a["largest"])
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    if k == 0 or outer * inner == 0:
        return
    x, signed = ptrs[0], not ins[0].dtype.is_unsigned
    count, enters = h.entry_alloca(b, h.I64, "kept"), h.entry_alloca(b, h.I1, "enters")
    with h.loop_nest(b, (outer, inner), name="line") as (o, i):
        src, dst = b.add(b.mul(o, h.i64(n * inner)), i), b.add(b.mul(o, h.i64(k * inner)), i)

        def slot(t: ir.Value) -> ir.Value:
            return b.add(dst, b.mul(t, h.i64(inner)))

        def value(j: ir.Value) -> ir.Value:
            return h.load(b, x, b.add(src, b.mul(j, h.i64(inner))))

        b.store(h.i64(0), count)
        with h.for_range(b, n, name="j") as j:
            v, held = value(j), b.load(count)
            b.store(ir.Constant(h.I1, 1), enters)
            with b.if_then(b.icmp_signed(">=", held, h.i64(k))):  # full: most elements beat not even the last
                b.store(_beats(b, v, value(h.load(b, out, slot(h.i64(k - 1)))), largest, signed), enters)
            with b.if_then(b.load(enters)):  # it goes before the first kept one it beats
                pos = h.reduce_range(b, held, h.i64(0), lambda acc, t: b.add(acc, b.zext(
                    b.not_(_beats(b, v, value(h.load(b, out, slot(t))), largest, signed)), h.I64)), "pos")
                last = h.call_intrinsic(b, "llvm.smin", held, h.i64(k - 1))  # the slot freed, or the one dropped
                with h.for_range(b, b.sub(last, pos), name="shift") as t:
                    q = b.sub(b.sub(last, h.i64(1)), t)
                    h.store(b, h.load(b, out, slot(q)), out, slot(b.add(q, h.i64(1))))
                h.store(b, j, out, slot(pos))
                b.store(b.add(last, h.i64(1)), count)
