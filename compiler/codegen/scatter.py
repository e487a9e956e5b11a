"""ScatterElements', ScatterND's and GatherND's per-element code (entries of ``gathers.PER_ELEMENT``).

An output element starts as data's and folds, in order, every update addressed to it (the
reference's order: a repeated index lets the last update win, or reduces them all). ScatterElements
visits only the updates on its own line along the axis; ScatterND visits every update slice, so
its cost is the output's size times the number of index tuples. An index outside its axis sets the
fault word (``ptrs[3]``, ``OpDef.run_time_check``) and addresses nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from llvmlite import ir

from ..ir.dtypes import DType
from ..ir.types import TensorType
from . import irhelpers as h


def _combine(reduction: str, dtype: DType):
    """(b, current, update) -> the element after the update."""
    fl, signed = dtype.is_float, dtype in h.SIGNED
    cmp = (lambda b, op, x, y: b.icmp_signed(op, x, y)) if signed else (lambda b, op, x, y: b.icmp_unsigned(op, x, y))
    table = {
        "none": lambda b, x, u: u,
        "add": lambda b, x, u: b.fadd(x, u) if fl else b.add(x, u),
        "mul": lambda b, x, u: b.fmul(x, u) if fl else b.mul(x, u),
        "max": lambda b, x, u: h.call_intrinsic(b, "llvm.maximum", x, u) if fl else b.select(cmp(b, ">", u, x), u, x),
        "min": lambda b, x, u: h.call_intrinsic(b, "llvm.minimum", x, u) if fl else b.select(cmp(b, "<", u, x), u, x),
    }
    return table[reduction]


def checked_index(b: ir.IRBuilder, raw: ir.Value, n: int, fault: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(index in [0, n) or 0, inside) of a raw index; outside [-n, n) sets the fault word (GatherElements too)."""
    j = b.sext(raw, h.I64) if raw.type != h.I64 else raw
    j = b.select(b.icmp_signed("<", j, h.i64(0)), b.add(j, h.i64(n)), j)
    inside = b.icmp_unsigned("<", j, h.i64(n))
    with b.if_then(b.not_(inside)):
        h.store(b, ir.Constant(h.I32, 1), fault, 0)
    return b.select(inside, j, h.i64(0)), inside


def scatter_elements(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]):
    data, ind = tuple(ins[0].shape), tuple(ins[1].shape)
    axis = a["axis"] % len(data)
    dst, ist = h.contiguous_strides(data), h.contiguous_strides(ind)
    combine = _combine(a["reduction"], outs[0].dtype)

    def value(b, idx, ptrs):
        x = h.load(b, ptrs[0], h.linear(b, idx, dst))
        off = [d for d in range(len(data)) if d != axis and ind[d] < data[d]]
        on_line = ir.Constant(h.I1, 1)  # is this element's line along the axis one indices covers?
        for d in off:
            on_line = b.and_(on_line, b.icmp_unsigned("<", idx[d], h.i64(ind[d])))
        pos = [b.select(on_line, idx[d], h.i64(0)) if d in off else idx[d] for d in range(len(data))]

        def step(acc, j):
            at = h.linear(b, [j if d == axis else pos[d] for d in range(len(data))], ist)
            t, inside = checked_index(b, h.load(b, ptrs[1], at), data[axis], ptrs[3])
            hit = b.and_(b.and_(on_line, inside), b.icmp_unsigned("==", t, idx[axis]))
            return b.select(hit, combine(b, acc, h.load(b, ptrs[2], at)), acc)

        return h.reduce_range(b, ind[axis], x, step, "u") if ind[axis] else x

    return value


def scatter_nd(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]):
    data, ind = tuple(ins[0].shape), tuple(ins[1].shape)
    k = ind[-1]
    tuples, inner = math.prod(ind[:-1]), data[k:]
    dst, sst = h.contiguous_strides(data), h.contiguous_strides(inner)
    combine = _combine(a["reduction"], outs[0].dtype)

    def value(b, idx, ptrs):
        x = h.load(b, ptrs[0], h.linear(b, idx, dst))
        within = h.linear(b, idx[k:], sst)

        def step(acc, m):
            hit = ir.Constant(h.I1, 1)
            for j in range(k):
                t, inside = checked_index(b, h.load(b, ptrs[1], b.add(b.mul(m, h.i64(k)), h.i64(j))), data[j], ptrs[3])
                hit = b.and_(hit, b.and_(inside, b.icmp_unsigned("==", t, idx[j])))
            u = h.load(b, ptrs[2], b.add(b.mul(m, h.i64(math.prod(inner))), within))
            return b.select(hit, combine(b, acc, u), acc)

        return h.reduce_range(b, tuples, x, step, "u") if tuples else x

    return value


def gather_nd(a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType]):
    """Output (batch..., tuple..., rest...) reads data[batch..., indices[batch..., tuple...], rest...]."""
    data, ind = tuple(ins[0].shape), tuple(ins[1].shape)
    b, k = a["batch_dims"], ind[-1]
    dst, ist = h.contiguous_strides(data), h.contiguous_strides(ind)
    q = len(ind) - 1  # output dims that walk the index tuples, batch dims first

    def value(bld, idx, ptrs):
        base = h.linear(bld, idx[:q], ist[:-1])
        pos = list(idx[:b])
        for j in range(k):
            t, _ = checked_index(bld, h.load(bld, ptrs[1], bld.add(base, h.i64(j))), data[b + j], ptrs[2])
            pos.append(t)
        return h.load(bld, ptrs[0], h.linear(bld, pos + list(idx[q:]), dst))

    return value
