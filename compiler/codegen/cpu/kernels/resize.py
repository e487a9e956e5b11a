"""Resize of float32 planes, a row at a time: along W each output element gathers its taps from one row;
along H each output row blends whole rows, one weight a row, which the vectorizer takes.

The shared per-element code (``codegen/gathers``) computes every output element from all its taps, two
table loads and a product of weights a tap: a 2x bilinear upsample of 64 16x16 planes took 100 us, ONNX
Runtime's uint8 one 25 us. Where both axes grow, each input row is resized along W once (its gathers run
once, not once per output row) and the output rows are blended from those; where they shrink, each output
row is blended first, then resized along W. It applies where only the last two axes are resized and no
output lies outside the input (tf_crop_and_resize's extrapolation); anything else keeps the per-element
kernel. Taps are summed in float32; the reference sums them in float64 (within float tolerance; a nearest
resize copies exactly).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from ....ir.dtypes import DType
from ....ops.resample import Taps, resize_attrs, resize_taps
from ....target import Target
from ... import irhelpers as h
from ...gathers import table
from .base import KernelContext, KernelKey, kernel
from .gathers import emit_per_element


@dataclass(frozen=True)
class _Planes:
    planes: int  # the product of the axes before the last two
    h: int
    w: int
    oh: int
    ow: int
    along_h: Taps | None  # None: that axis is not resized
    along_w: Taps | None


def _planes(key: KernelKey) -> _Planes | None:
    """The plane-wise form of a Resize, or None where it does not apply (see the module's docstring)."""
    x, y = key.in_types[0], key.out_types[0]
    if x.dtype is not DType.F32 or y.dtype is not DType.F32 or len(x.shape) < 2:
        return None
    shape = tuple(x.shape)
    a = resize_attrs(dict(key.attrs), shape)
    taps = [resize_taps(a, axis, n) for axis, n in enumerate(shape)]
    if any(t is not None for t in taps[:-2]) or all(t is None for t in taps[-2:]) or \
            any(t is not None and t.outside.any() for t in taps[-2:]):
        return None
    return _Planes(math.prod(shape[:-2]), shape[-2], shape[-1], y.shape[-2], y.shape[-1], taps[-2], taps[-1])


def _grows(p: _Planes) -> bool:
    """Both axes resized, to at least as many rows: the input rows go along W first (see the docstring)."""
    return p.along_h is not None and p.along_w is not None and p.oh >= p.h


def _scratch(key: KernelKey, target: Target) -> int:
    """A growing plane's input rows resized along W, or a shrinking one's blended row."""
    p = _planes(key)
    if p is None or p.along_h is None or p.along_w is None:
        return 0
    return 4 * (p.h * p.ow if _grows(p) else p.w)


def _tap_sum(b: ir.IRBuilder, taps: list[tuple[ir.Value, ir.Value | None]]) -> ir.Value:
    """sum(value * weight) in float32, in tap order; a gather's one tap (no weight) is its value."""
    (value, weight), *rest = taps
    if weight is None:
        return value
    acc = b.fmul(value, weight)
    for value, weight in rest:
        acc = h.call_intrinsic(b, "llvm.fma", value, weight, acc)
    return acc


def _tables(b: ir.IRBuilder, taps: Taps, stride: int) -> tuple[ir.Value, ir.Value | None, int]:
    """Index (times ``stride``) and weight tables of ``taps``, row-major by output position; no weights for a
    gather (one tap of weight 1); and the taps per position."""
    n = taps.index.shape[1]
    index = table(b, "resize.index", taps.index.reshape(-1) * stride, h.I64)
    weight = None if n == 1 else table(b, "resize.weight", taps.weight.reshape(-1), h.F32)
    return index, weight, n


def _taps_at(b: ir.IRBuilder, index: ir.Value, weight: ir.Value | None, n: int, at: ir.Value):
    """(index, weight) of each of the ``n`` taps of output position ``at``."""
    row = b.mul(at, h.i64(n))
    return [(h.load(b, index, b.add(row, h.i64(j))), None if weight is None else h.load(b, weight, b.add(row, h.i64(j))))
            for j in range(n)]


def _gather_row(b: ir.IRBuilder, line: ir.Value, out: ir.Value, tables, ow: int) -> None:
    """out[c] = sum over c's taps along W of line[index] * weight."""
    index, weight, n = tables
    with h.for_range(b, ow, name="col") as c:
        h.store(b, _tap_sum(b, [(h.load(b, line, i), wt) for i, wt in _taps_at(b, index, weight, n, c)]), out, c)


def _blend_row(b: ir.IRBuilder, rows: ir.Value, out: ir.Value, tables, r: ir.Value, width: int) -> None:
    """out[c] = sum over output row r's taps along H of rows[index + c] * weight (the index table holds each
    row's offset): whole rows, one weight each."""
    at = _taps_at(b, *tables, r)
    with h.for_range(b, width, name="col") as c:
        h.store(b, _tap_sum(b, [(h.load(b, rows, b.add(i, c)), wt) for i, wt in at]), out, c)


@kernel("Resize", scratch=_scratch)
def emit_resize(ctx: KernelContext) -> None:
    p = _planes(ctx.key)
    if p is None:
        emit_per_element(ctx)
        return
    b = ctx.b
    row_at = lambda base, r, width: h.gep(b, base, b.mul(r, h.i64(width)))  # noqa: E731
    scratch = b.bitcast(ctx.scratch, h.F32.as_pointer()) if ctx.scratch is not None else None
    w_tables = _tables(b, p.along_w, 1) if p.along_w is not None else None
    h_tables = _tables(b, p.along_h, p.ow if _grows(p) else p.w) if p.along_h is not None else None
    with h.for_range(b, p.planes, name="plane") as plane:
        x, y = row_at(ctx.ins[0], plane, p.h * p.w), row_at(ctx.outs[0], plane, p.oh * p.ow)
        if h_tables is None:  # along W alone
            with h.for_range(b, p.h, name="row") as r:
                _gather_row(b, row_at(x, r, p.w), row_at(y, r, p.ow), w_tables, p.ow)
        elif w_tables is None:  # along H alone
            with h.for_range(b, p.oh, name="row") as r:
                _blend_row(b, x, row_at(y, r, p.ow), h_tables, r, p.w)
        elif _grows(p):
            with h.for_range(b, p.h, name="row") as r:
                _gather_row(b, row_at(x, r, p.w), row_at(scratch, r, p.ow), w_tables, p.ow)
            with h.for_range(b, p.oh, name="orow") as r:
                _blend_row(b, scratch, row_at(y, r, p.ow), h_tables, r, p.ow)
        else:
            with h.for_range(b, p.oh, name="orow") as r:
                _blend_row(b, x, scratch, h_tables, r, p.w)
                _gather_row(b, scratch, row_at(y, r, p.ow), w_tables, p.ow)
