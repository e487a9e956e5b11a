"""The zero-bordered, stride-phase-split copy a direct or depthwise conv reads (``ConvPlan.copy``): each
channel's input split into the stride's phase planes, so every tap of every stride and dilation is a
contiguous vector load at a constant offset (``ConvPlan.tap_offset``); whole, or band of plane rows by band.
"""

from __future__ import annotations

from llvmlite import ir

from ...irhelpers import for_range, gep, i64, memcpy, memset0, vector
from ..vecops import lane_mask, load_vec, store_vec
from .layout import ConvPlan


def _valid(lo_pad: int, phase: int, s: int, size: int, n: int) -> tuple[int, int]:
    """Plane indices i in [first, last) whose source i*s + phase - lo_pad lies in [0, size)."""
    first = max(0, -(-(lo_pad - phase) // s))
    last = min(n, (size - 1 + lo_pad - phase) // s + 1)
    return first, max(first, last)


def fill_copy(b: ir.IRBuilder, p: ConvPlan, x: ir.Value, dst: ir.Value, chans: int,
               row0: ir.Value | None = None, rows: int = 0) -> None:
    """Copy ``chans`` input channels into the zero-bordered, stride-phase-split planes: the whole
    planes (their borders zero since the kernel's start), or ``rows`` plane rows from ``row0`` on (a
    band: border rows among them are zeroed here, as an earlier band may have filled them)."""
    with for_range(b, chans, name="cc") as c:
        xc = gep(b, x, b.mul(c, i64(p.H * p.W)))
        dc = gep(b, dst, b.mul(c, i64(p.chan_stride)))
        for k, (ph, pw) in enumerate(p.phases):
            i0, i1 = _valid(p.pt, ph, p.sh, p.H, p.OH + p.halo if row0 is not None else p.Hq)
            j0, j1 = _valid(p.pl, pw, p.sw, p.W, p.Wq)
            if j1 <= j0:
                continue
            first, last, shift = i64(i0), i64(i1), None
            if row0 is not None:  # this band's plane rows [lo, hi) have input rows; the rest are zero
                first, last = _clamp(b, b.sub(i64(i0), row0), rows), _clamp(b, b.sub(i64(i1), row0), rows)
                last = b.select(b.icmp_signed("<", last, first), first, last)
                shift = row0
                for z0, z1 in ((i64(0), first), (last, i64(rows))):
                    with for_range(b, z1, start=z0, name="cz") as i:
                        memset0(b, gep(b, dc, b.add(b.mul(i, i64(p.Wq)), i64(k * p.plane))), 4 * p.Wq)
            elif i1 <= i0:
                continue
            with for_range(b, last, start=first, name="ci") as i:
                ih = b.add(b.mul(i if shift is None else b.add(i, shift), i64(p.sh)), i64(ph - p.pt))
                srow = gep(b, xc, b.add(b.mul(ih, i64(p.W)), i64(j0 * p.sw + pw - p.pl)))
                drow = gep(b, dc, b.add(b.mul(i, i64(p.Wq)), i64(k * p.plane + j0)))
                if p.sw == 1:
                    memcpy(b, drow, srow, 4 * (j1 - j0))
                else:
                    _strided_copy(b, drow, srow, j1 - j0, p.sw, p.W - (j0 * p.sw + pw - p.pl), p.vl)


def _clamp(b: ir.IRBuilder, v: ir.Value, hi: int) -> ir.Value:
    """min(max(v, 0), hi)"""
    v = b.select(b.icmp_signed("<", v, i64(0)), i64(0), v)
    return b.select(b.icmp_signed(">", v, i64(hi)), i64(hi), v)


def _strided_copy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, n: int, s: int, src_len: int, vl: int = 0) -> None:
    """dst[j] = src[j*s] for j < n, reading no further than src[src_len - 1]. Stride 2: two vector
    loads and an even-lane shuffle per VL outputs, the last VL overlapping (its upper load masked);
    other strides, or rows shorter than a vector, one element at a time."""
    if not (s == 2 and 1 < vl <= n):
        with for_range(b, n, name="cj") as j:
            v = b.load(b.gep(src, [b.mul(j, i64(s))], inbounds=True), align=4)
            b.store(v, b.gep(dst, [j], inbounds=True), align=4)
        return
    even = vector(ir.VectorType(ir.IntType(32), vl), [2 * i for i in range(vl)])

    def one(j: ir.Value | int, hi_lanes: int) -> None:
        sp = gep(b, src, b.mul(j, i64(2)) if isinstance(j, ir.Value) else 2 * j)
        hi = load_vec(b, gep(b, sp, vl), vl, lane_mask(vl, hi_lanes) if hi_lanes < vl else None)
        store_vec(b, b.shuffle_vector(load_vec(b, sp, vl), hi, even), gep(b, dst, j))

    nsafe = min(n // vl, src_len // (2 * vl))
    if nsafe:
        with for_range(b, nsafe, name="cv") as jv:
            one(b.mul(jv, i64(vl)), vl)
    if nsafe * vl < n:
        one(n - vl, min(vl, src_len - 2 * (n - vl) - vl))
