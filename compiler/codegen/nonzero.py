"""NonZero's code, one sequential body both backends share (``sequential.SEQUENTIAL``): the
coordinates of each nonzero element, in row-major order, into the bounded result's columns
(``i64[rank, <=numel]``: column k of row d at ``d * numel + k``), then their count.

A float is nonzero unless it equals 0 (NaN is nonzero, -0.0 is not), as NumPy's ``nonzero``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llvmlite import ir

from ..ir.types import COUNT_BYTES, TensorType
from . import irhelpers as h


def non_zero(b: ir.IRBuilder, a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType],
             ptrs: Sequence[ir.Value], out: ir.Value) -> None:
    shape = tuple(ins[0].shape)
    bound = outs[0].shape[1]
    strides = h.contiguous_strides(shape)
    count = h.entry_alloca(b, h.I64, "count")
    b.store(h.i64(0), count)
    with h.for_range(b, bound, name="e") as e:
        x = h.load(b, ptrs[0], e)
        nonzero = b.fcmp_unordered("!=", x, h.const(x.type, 0.0)) if h.is_float(x.type) else \
            b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
        with b.if_then(nonzero):
            k = b.load(count)
            for d, (n, st) in enumerate(zip(shape, strides)):
                coord = b.urem(b.udiv(e, h.i64(st)), h.i64(n))
                h.store(b, coord, out, b.add(h.i64(d * bound), k))
            b.store(b.add(k, h.i64(1)), count)
    h.store(b, b.load(count), out, outs[0].count_offset() // COUNT_BYTES)
