"""Depthwise int8 sums two taps a ``vpmaddwd`` on 256-bit x86 (``quant_depthwise.py``, ``quant_grouped.py``).

AVX2 has no 32-bit multiply worth the name (``vpmulld``: 2 uops, 10 cycles' latency), but ``vpmaddwd``
multiplies 16 int16 pairs and sums each pair into an int32 in one. Two taps' 16 values (channels or output
columns) are interleaved in lanes by ``vpunpcklwd`` / ``vpunpckhwd``, which work within each 128-bit half, so
the first ``vpmaddwd`` sums lanes 0-3 and 8-11 and the second 4-7 and 12-15 (``PAIR_ORDER``); the weights come
as the matching pairs. Every product and pair sum is exact in int32, so the totals equal the one-tap loop's.
"""

from __future__ import annotations

from llvmlite import ir

from ....target import Target
from ... import irhelpers as h

PAIR_LANES = 16  # values of one tap a step: a ymm of int16
PAIR_ORDER = ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
"""The lanes each ``vpmaddwd``'s eight sums belong to."""
UNPACK = tuple([q + k * PAIR_LANES for q in order for k in (0, 1)] for order in PAIR_ORDER)
"""``vpunpcklwd`` and ``vpunpckhwd`` of two 16-lane vectors: each lane of ``PAIR_ORDER`` beside its second tap's."""


def tap_pairs(target: Target) -> bool:
    """x86 at 256 bits: depthwise sums take two taps a ``vpmaddwd`` rather than one ``vpmulld`` a tap."""
    return target.triple.startswith("x86_64") and target.vector_floats == 8


def pair_madd(b: ir.IRBuilder, sums: list[ir.Value], x0: ir.Value, x1: ir.Value, weights: list[ir.Value]) -> list[ir.Value]:
    """``sums`` (two ``<8 x i32>``, ``PAIR_ORDER``'s lanes) plus two taps' ``<16 x i16>`` values against their
    weights (per half, ``<16 x i16>`` pairs)."""
    mask = ir.VectorType(h.I32, PAIR_LANES)
    return [b.add(s, h.call_named(b, "llvm.x86.avx2.pmadd.wd", s.type, [b.shuffle_vector(x0, x1, h.vector(mask, UNPACK[k])), w]))
            for k, (s, w) in enumerate(zip(sums, weights))]


def requantized(b: ir.IRBuilder, sums: list[ir.Value], finish) -> ir.Value:
    """``pair_madd``'s sums as one ``<16 x i8>`` in lane order: lanes 0-7, then 8-15, each through
    ``finish(half, <8 x i32>)`` (bias, requantization) to ``<8 x i8>``."""
    mask = ir.VectorType(h.I32, PAIR_LANES // 2)
    q0, q1 = (finish(k, b.shuffle_vector(sums[0], sums[1], h.vector(mask, idx))) for k, idx in enumerate(PAIR_ORDER))
    return b.shuffle_vector(q0, q1, h.vector(ir.VectorType(h.I32, PAIR_LANES), list(range(PAIR_LANES))))
