"""NonMaxSuppression's code, one sequential body both backends share (``sequential.SEQUENTIAL``):
it mirrors ``ops.bounded``'s reference step by step.

Each class of each batch takes its candidates best first without sorting or scratch memory: the
next one is the best score strictly after the last one taken (score descending, then box index
ascending), found by one scan. A candidate is kept unless a box kept before it in this class
suppresses it; the kept boxes are read back from the rows already written. The rows stay inside
the bound (at most min(limit, boxes) per class), and the count goes after them
(``TensorType.count_offset``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llvmlite import ir

from ..ir.types import COUNT_BYTES, TensorType
from . import irhelpers as h


def _corners(b: ir.IRBuilder, boxes: ir.Value, base: ir.Value, center: bool) -> list[ir.Value]:
    """(x_min, x_max, y_min, y_max) of the box at element ``base``, as ``ops.bounded.corners``."""
    v = [h.load(b, boxes, b.add(base, h.i64(k))) for k in range(4)]
    if center:
        two = h.const(h.F32, 2.0)
        half_w, half_h = b.fdiv(v[2], two), b.fdiv(v[3], two)
        return [b.fsub(v[0], half_w), b.fadd(v[0], half_w), b.fsub(v[1], half_h), b.fadd(v[1], half_h)]
    y1, x1, y2, x2 = v
    x_ge, y_ge = b.fcmp_ordered(">=", x1, x2), b.fcmp_ordered(">=", y1, y2)
    return [b.select(x_ge, x2, x1), b.select(x_ge, x1, x2), b.select(y_ge, y2, y1), b.select(y_ge, y1, y2)]


def _suppresses(b: ir.IRBuilder, boxes: ir.Value, cand: ir.Value, kept: ir.Value, center: bool,
                iou: ir.Value) -> ir.Value:
    """``ops.bounded.suppresses`` for one pair (element offsets of the two boxes): does ``kept``
    suppress ``cand``?"""
    ax0, ax1, ay0, ay1 = _corners(b, boxes, cand, center)
    bx0, bx1, by0, by1 = _corners(b, boxes, kept, center)
    ix0 = b.select(b.fcmp_ordered(">", bx0, ax0), bx0, ax0)
    ix1 = b.select(b.fcmp_ordered("<", bx1, ax1), bx1, ax1)
    iy0 = b.select(b.fcmp_ordered(">", by0, ay0), by0, ay0)
    iy1 = b.select(b.fcmp_ordered("<", by1, ay1), by1, ay1)
    inter = b.fmul(b.fsub(ix1, ix0), b.fsub(iy1, iy0))
    area_a = b.fmul(b.fsub(ax1, ax0), b.fsub(ay1, ay0))
    area_b = b.fmul(b.fsub(bx1, bx0), b.fsub(by1, by0))
    union = b.fsub(b.fadd(area_a, area_b), inter)
    zero = h.const(h.F32, 0.0)
    ok = ir.Constant(h.I1, 1)
    for x, y in ((ix1, ix0), (iy1, iy0), (inter, zero), (area_a, zero), (area_b, zero), (union, zero)):
        ok = b.and_(ok, b.fcmp_ordered(">", x, y))
    return b.and_(ok, b.fcmp_ordered(">", b.fdiv(inter, union), iou))


def _next_candidate(b: ir.IRBuilder, scores: ir.Value, line: ir.Value, n: int, threshold: ir.Value | None,
                    s: dict) -> None:
    """best_i, best_s: the best candidate after (last_s, last_i) in the reference's order, or -1."""
    b.store(h.i64(-1), s["best_i"])
    b.store(h.const(h.F32, 0.0), s["best_s"])
    last_s, last_i = b.load(s["last_s"]), b.load(s["last_i"])
    with h.for_range(b, n, name="j") as j:
        x = h.load(b, scores, b.add(line, j))
        eligible = b.fcmp_ordered(">", x, threshold) if threshold is not None else b.fcmp_ordered("==", x, x)
        after = b.or_(b.fcmp_ordered("<", x, last_s),
                      b.and_(b.fcmp_ordered("==", x, last_s), b.icmp_signed(">", j, last_i)))
        bi, bs = b.load(s["best_i"]), b.load(s["best_s"])
        better = b.or_(b.icmp_signed("<", bi, h.i64(0)), b.fcmp_ordered(">", x, bs))
        take = b.and_(b.and_(eligible, after), better)
        b.store(b.select(take, j, bi), s["best_i"])
        b.store(b.select(take, x, bs), s["best_s"])


def non_max_suppression(b: ir.IRBuilder, a: Mapping, ins: Sequence[TensorType], outs: Sequence[TensorType],
                        ptrs: Sequence[ir.Value], out: ir.Value) -> None:
    """Write the selected (batch, class, box) rows to ``out`` (i64), then their count."""
    batches, n, classes = ins[0].shape[0], ins[0].shape[1], ins[1].shape[1]
    limit, center = min(a["max_output_boxes_per_class"], n), bool(a["center_point_box"])
    boxes, scores = ptrs[0], ptrs[1]
    count = h.entry_alloca(b, h.I64, "count")
    s = {name: h.entry_alloca(b, t, name) for name, t in (
        ("last_s", h.F32), ("last_i", h.I64), ("taken", h.I64), ("best_s", h.F32), ("best_i", h.I64), ("keep", h.I1))}
    b.store(h.i64(0), count)
    if limit:
        iou = h.load(b, ptrs[2], 0)
        threshold = h.load(b, ptrs[3], 0) if len(ins) > 3 else None
        with h.loop_nest(b, (batches, classes)) as (bt, c):
            start = b.load(count)
            b.store(h.const(h.F32, float("inf")), s["last_s"])
            b.store(h.i64(-1), s["last_i"])
            b.store(h.i64(0), s["taken"])
            line = b.mul(b.add(b.mul(bt, h.i64(classes)), c), h.i64(n))
            box0 = b.mul(bt, h.i64(n * 4))
            with h.for_range(b, n, name="step"):
                with b.if_then(b.icmp_signed("<", b.load(s["taken"]), h.i64(limit))):
                    _next_candidate(b, scores, line, n, threshold, s)
                    best = b.load(s["best_i"])
                    with b.if_else(b.icmp_signed(">=", best, h.i64(0))) as (found, exhausted):
                        with found:
                            b.store(b.load(s["best_s"]), s["last_s"])
                            b.store(best, s["last_i"])
                            cand = b.add(box0, b.mul(best, h.i64(4)))
                            b.store(ir.Constant(h.I1, 1), s["keep"])
                            with h.for_range(b, b.load(count), start=start, name="r") as r:
                                kept = b.add(box0, b.mul(h.load(b, out, b.add(b.mul(r, h.i64(3)), h.i64(2))), h.i64(4)))
                                hit = _suppresses(b, boxes, cand, kept, center, iou)
                                b.store(b.and_(b.load(s["keep"]), b.not_(hit)), s["keep"])
                            with b.if_then(b.load(s["keep"])):
                                row = b.mul(b.load(count), h.i64(3))
                                for k, v in enumerate((bt, c, best)):
                                    h.store(b, v, out, b.add(row, h.i64(k)))
                                b.store(b.add(b.load(count), h.i64(1)), count)
                                b.store(b.add(b.load(s["taken"]), h.i64(1)), s["taken"])
                        with exhausted:
                            b.store(h.i64(limit), s["taken"])
    h.store(b, b.load(count), out, outs[0].count_offset() // COUNT_BYTES)

