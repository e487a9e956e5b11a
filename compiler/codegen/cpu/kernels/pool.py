"""MaxPool and AveragePool over (N, C, *spatial), 1 to 3 spatial dimensions.

float32 1-D and 2-D pools (1-D as 2-D with a height of one) compute ``target.vector_floats`` output
columns at a time, and since shapes are static they decide at compile time where padding matters:
columns whose windows lie inside the input are a loop of plain vector loads, the few border
columns are scalar code that leaves out-of-range taps out, and output rows are grouped into runs
sharing one set of in-range tap rows, so interior rows have no bounds test at all. Rows too narrow
for the loop are vectors with loads masked at the row's ends (masked lanes read as padding); on
512-bit targets rows of up to ``Tuning.half_width_pool_max_ow`` outputs take 8-lane vectors.
Stride s loads s vectors per tap and keeps every s-th lane; taps of one phase share the loads.
A window much taller than its row stride (3x3, 5x5 at stride 1) is pooled separably, rows into
scratch then columns, about 2K operations per output instead of K*K and code linear in K.

An int8 2-D MaxPool on the byte-quad targets shuffles bytes instead (``quant_pool.py``). Other
dtypes, 3-D pools and windows too big to unroll (``MAX_VECTOR_LOADS``) take the generic loop
(``pool_generic.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from ....ir.dtypes import DType
from ... import irhelpers as h
from .. import vecops
from ...irhelpers import gep
from ..vecops import load_vec, store_vec, vec_type
from .base import KernelContext, KernelKey, kernel
from .pool_generic import emit_generic_pool, window_count
from .quant_pool import byte_maxpool_ok, byte_maxpool_scratch, emit_byte_maxpool


# ---------------------------------------------------------------------------- f32 vector path ---
@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a pool: input size, output size, kernel, stride, dilation, pads."""

    size: int
    out: int
    k: int = 1
    stride: int = 1
    dil: int = 1
    pad_lo: int = 0
    pad_hi: int = 0

    def start(self, o: int) -> int:
        return o * self.stride - self.pad_lo

    def taps(self, o: int) -> tuple[int, ...]:
        """Taps of output position ``o`` that land inside the input."""
        return tuple(t for t in range(self.k) if 0 <= self.start(o) + t * self.dil < self.size)

    def inside(self, o: int) -> bool:
        """Every tap of output position ``o`` lands inside the input."""
        return self.start(o) >= 0 and self.start(o) + (self.k - 1) * self.dil < self.size

    def counted(self, o: int, include_pad: bool) -> int:
        """AveragePool's divisor along this axis (never counting the ceil_mode overhang)."""
        lo, hi = (-self.pad_lo, self.size + self.pad_hi) if include_pad else (0, self.size)
        return min(self.start(o) + self.k, hi) - max(self.start(o), lo)


def _axes(key: KernelKey) -> tuple[_Axis, _Axis]:
    """(rows, columns) of the pool; a 1-D pool is one row."""
    a, shape, osp = dict(key.attrs), key.in_types[0].shape[2:], key.out_types[0].shape[2:]
    nd = len(shape)
    dil, pads = a.get("dilations", (1,) * nd), a["pads"]
    axes = [_Axis(shape[i], osp[i], a["kernel_shape"][i], a["strides"][i], dil[i], pads[i], pads[nd + i])
            for i in range(nd)]
    return (_Axis(1, 1), axes[0]) if nd == 1 else (axes[0], axes[1])


"""The generic path unrolls at most this many taps per window; bigger windows loop over them."""
MAX_VECTOR_LOADS = 256
"""The vector path unrolls every tap's loads of an output vector (``_vector_loads``); a window that
needs more (a 200-tap window dilated at stride 10 wants 2,000) takes the generic path, whose taps
are a run-time loop: unrolled, they cost seconds of LLVM time."""


def _vector_loads(rows: _Axis, cols: _Axis) -> int:
    """Vector loads per output vector: per pass, tap rows x tap columns x column stride."""
    if _rows_first(rows, cols):
        return cols.k * cols.stride + rows.k
    return rows.k * cols.k * cols.stride


def _rows_first(rows: _Axis, cols: _Axis) -> bool:
    """Pool rows first when that saves work: K*Kw taps per output against about Kw*sh + K."""
    return rows.k > 1 and cols.k > 1 and rows.k * cols.k > rows.stride * cols.k + rows.k


def _vectorizable(key: KernelKey) -> bool:
    x = key.in_types[0]
    return (x.dtype is DType.F32 and len(x.shape) in (3, 4) and math.prod(key.out_types[0].shape) > 0
            and _vector_loads(*_axes(key)) <= MAX_VECTOR_LOADS)


def _separable(key: KernelKey) -> bool:
    return _vectorizable(key) and _rows_first(*_axes(key))


def _padded(rows: _Axis) -> _Axis:
    """The separable pool's scratch rows: the input's, with pad rows above and below (the ceil_mode
    overhang included), so the second sweep has no border rows at all."""
    below = max(0, rows.start(rows.out - 1) + (rows.k - 1) * rows.dil + 1 - rows.size)
    return _Axis(rows.pad_lo + rows.size + below, rows.out, rows.k, rows.stride, rows.dil)


def _scratch(key: KernelKey, target) -> int:
    if key.op == "MaxPool" and byte_maxpool_ok(key, target):
        return byte_maxpool_scratch(key, target)
    rows, cols = _axes(key)
    return 4 * _padded(rows).size * cols.out if _separable(key) else 0


def _reduce(b: ir.IRBuilder, kind: str, vals: list[ir.Value], ty: ir.Type) -> ir.Value:
    """Max or sum of ``vals`` as a balanced tree (independent chains for the scheduler).

    Max is ``a > b ? a : b`` (one ``maxps``) plus an unordered test per pair of taps, so a NaN
    anywhere in the window gives NaN as the reference's ``np.max`` does, at about two instructions
    per tap rather than the five of ``llvm.maximum``. No taps at all (a dilated window over padding
    only) gives the padding value: -inf for max, 0 for the sum.
    """
    if not vals:
        return h.const(ty, float("-inf") if kind == "max" else 0.0)
    if kind == "sum" or len(vals) == 1:
        return _tree(vals, b.fadd)
    nan = _tree([b.fcmp_unordered("uno", vals[i], vals[min(i + 1, len(vals) - 1)]) for i in range(0, len(vals), 2)],
                b.or_)
    return b.select(nan, h.const(ty, float("nan")), _tree(vals, lambda x, y: b.select(b.fcmp_ordered(">", x, y), x, y)))


def _tree(vals: list[ir.Value], op) -> ir.Value:
    while len(vals) > 1:
        vals = [op(vals[i], vals[i + 1]) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
    return vals[0]


# Stride 2 on 8 lanes: two in-lane ``vshufps`` halves each keep columns 0 1 4 5 2 3 6 7 (lane order),
# so every tap is one shuffle instead of two, and one ``vpermpd`` per output vector undoes it.
_INLANE = (0, 2, 8, 10, 4, 6, 12, 14)
_UNDO_INLANE = (0, 1, 4, 5, 2, 3, 6, 7)


def _gather(b: ir.IRBuilder, vs: list[ir.Value], s: int, phases: list[int]) -> list[ir.Value]:
    """For each phase r, lanes ``s*i + r`` of the s consecutive vectors ``vs`` (in ``_INLANE``
    order for stride 2 on 8 lanes)."""
    if s == 1:
        return vs
    vl = vs[0].type.count
    if s == 2 and vl == 8:
        return [b.shuffle_vector(vs[0], vs[1], h.vector(ir.VectorType(h.I32, 8), [i + r for i in _INLANE]))
                for r in phases]
    while len(vs) > 2:  # concatenate to one wide vector, padding to a power of two with undef
        if len(vs) % 2:
            vs.append(h.undef(vs[0].type))
        n = 2 * vs[0].type.count
        vs = [b.shuffle_vector(vs[i], vs[i + 1], h.vector(ir.VectorType(h.I32, n), list(range(n))))
              for i in range(0, len(vs), 2)]
    lo, hi = vs if len(vs) == 2 else (vs[0], h.undef(vs[0].type))
    return [b.shuffle_vector(lo, hi, h.vector(ir.VectorType(h.I32, vl), [s * i + r for i in range(vl)]))
            for r in phases]


@dataclass(frozen=True)
class _Pass:
    """One sweep from a source of (rows.size, cols.size) planes to (rows.out, cols.out) planes.
    ``div_rows`` / ``div_cols``: which axes' counts AveragePool divides by in this sweep;
    ``row_div``: divide by that axis's count instead, computed at run time (one run of rows)."""

    kind: str  # "max" or "sum"
    rows: _Axis
    cols: _Axis
    vl: int
    include_pad: bool
    div_rows: bool
    div_cols: bool
    scalar_tails: bool
    row_div: _Axis | None = None

    def row_runs(self) -> list[tuple[int, int, tuple[int, ...], int]]:
        """Maximal runs [start, stop) of output rows with the same tap rows (and divisor)."""
        runs: list = []
        for o in range(self.rows.out):
            count = self.rows.counted(o, self.include_pad) if self.kind == "sum" and self.div_rows else 1
            key = (self.rows.taps(o), count)
            if runs and runs[-1][2:] == key:
                runs[-1] = (runs[-1][0], o + 1, *key)
            else:
                runs.append((o, o + 1, *key))
        return runs

    def columns(self) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
        """(lo, hi, static vector starts, scalar columns): a loop covers [lo, hi) but its last vector.

        Windows fully inside the input are a contiguous range; with at least one vector of them,
        the loop takes them and the borders are scalar. Otherwise the whole row is static masked
        vectors, or scalar when under half a vector wide.
        """
        cols, vl = self.cols, self.vl
        full = [c for c in range(cols.out) if cols.inside(c)]
        if full and full[-1] + 1 - full[0] >= vl:
            lo, hi = full[0], full[-1] + 1
            return lo, hi, (hi - vl,), tuple(c for c in range(cols.out) if not lo <= c < hi)
        if cols.out >= vl:
            return 0, 0, tuple(range(0, cols.out - vl, vl)) + (cols.out - vl,), ()
        if 2 * cols.out >= vl:
            return 0, 0, (0,), ()
        return 0, 0, (), tuple(range(cols.out))

    def divisor(self, rcount: int, c: int) -> float:
        cc = self.cols.counted(c, self.include_pad) if self.div_cols and c < self.cols.out else 1
        return float(rcount * cc)


def _blocks(cols: _Axis) -> dict[int, list[int]]:
    """Taps grouped by the stride-aligned block they read: offset t*dil = q*stride + r -> q: [r]."""
    blocks: dict[int, list[int]] = {}
    for t in range(cols.k):
        q, r = divmod(t * cols.dil, cols.stride)
        blocks.setdefault(q, []).append(r)
    return blocks


def _masked_load(b: ir.IRBuilder, ptr: ir.Value, vl: int, ok: list[bool], pad: ir.Value) -> ir.Value:
    """The vector at ``ptr`` with the lanes not ``ok`` never read and set to ``pad``."""
    if all(ok):
        return load_vec(b, ptr, vl)
    if not any(ok):
        return pad
    return h.masked_load(b, ptr, vec_type(vl), h.vector(ir.VectorType(h.I1, vl), [int(m) for m in ok]), 4, pad)


def _static_taps(b: ir.IRBuilder, p: _Pass, rowp: list[ir.Value], c0: int) -> list[ir.Value]:
    """Tap vectors of output columns [c0, c0 + vl), c0 static: elements outside the row are
    masked off at load time and read as the padding value (-inf or 0), lanes past the output are
    don't-cares."""
    cols, vl, s = p.cols, p.vl, p.cols.stride
    pad = h.const(vec_type(vl), float("-inf") if p.kind == "max" else 0.0)
    vals = []
    for row in rowp:
        for q, phases in _blocks(cols).items():
            vs = []
            for k in range(s):
                first = cols.start(c0) + s * q + k * vl
                ok = [0 <= first + e < cols.size for e in range(vl)]
                ptr = b.gep(row, [h.i64(first)])  # not inbounds: may point before the row when masked
                vs.append(_masked_load(b, ptr, vl, ok, pad))
            vals += _gather(b, vs, s, phases)
    return vals


def _loop_taps(b: ir.IRBuilder, p: _Pass, rowp: list[ir.Value], c0: ir.Value) -> list[ir.Value]:
    """Tap vectors of interior output columns [c0, c0 + vl) that are not a row's last vector: every
    load, even the stride's unused tail lanes, stays before the next vector's taps, so in the row."""
    cols, vl, s = p.cols, p.vl, p.cols.stride
    start = b.sub(b.mul(c0, h.i64(s)), h.i64(cols.pad_lo))
    vals = []
    for row in rowp:
        for q, phases in _blocks(cols).items():
            base = gep(b, row, b.add(start, h.i64(s * q)))
            vals += _gather(b, [load_vec(b, gep(b, base, k * vl), vl) for k in range(s)], s, phases)
    return vals


def _window_taps(b: ir.IRBuilder, p: _Pass, rowp: list[ir.Value], c: int) -> list[ir.Value]:
    """One output column's in-range taps (dilation 1: contiguous) as vectors along each row, the
    tail masked and read as padding: a wide window over few columns costs K*K/vl loads, and LLVM
    finds no scalar tree to turn into gathers."""
    taps, vl = p.cols.taps(c), p.vl
    first, n = p.cols.start(c) + taps[0], len(taps)
    pad = h.const(vec_type(vl), float("-inf") if p.kind == "max" else 0.0)
    return [_masked_load(b, gep(b, row, first + j), vl, [e < n - j for e in range(vl)], pad)
            for row in rowp for j in range(0, n, vl)]


def _hreduce(b: ir.IRBuilder, kind: str, v: ir.Value) -> ir.Value:
    """Lane 0 of ``v`` reduced across its lanes by halving."""
    n = v.type.count
    while n > 1:
        n //= 2
        halves = [b.shuffle_vector(v, h.undef(v.type), h.vector(ir.VectorType(h.I32, n), list(range(k, k + n))))
                  for k in (0, n)]
        v = _reduce(b, kind, halves, halves[0].type)
    return b.extract_element(v, ir.Constant(h.I32, 0))


def _row_count(b: ir.IRBuilder, p: _Pass, oh: ir.Value) -> ir.Value:
    """``p.row_div.counted(oh)`` as a float, at run time."""
    ax = p.row_div
    lo, hi = (-ax.pad_lo, ax.size + ax.pad_hi) if p.include_pad else (0, ax.size)
    return b.sitofp(window_count(b, b.sub(b.mul(oh, h.i64(ax.stride)), h.i64(ax.pad_lo)), ax.k, lo, hi), h.F32)


def _row(b: ir.IRBuilder, p: _Pass, xp: ir.Value, yp: ir.Value, oh: ir.Value, taps: tuple[int, ...],
         rcount: int) -> None:
    """Output row ``oh`` of one plane, whose in-range tap rows are ``taps``."""
    rows, cols, vl = p.rows, p.cols, p.vl
    vt = vec_type(vl)
    top = b.sub(b.mul(oh, h.i64(rows.stride)), h.i64(rows.pad_lo))
    rowp = [gep(b, xp, b.mul(b.add(top, h.i64(t * rows.dil)), h.i64(cols.size))) for t in taps]
    yrow = gep(b, yp, b.mul(oh, h.i64(cols.out)))

    rdiv = _row_count(b, p, oh) if p.kind == "sum" and p.row_div is not None else None

    def finish(vals, ty, div, gathered=False):
        acc = _reduce(b, p.kind, vals, ty)
        if gathered and cols.stride == 2 and vl == 8:
            acc = b.shuffle_vector(acc, h.undef(ty), h.vector(ir.VectorType(h.I32, 8), _UNDO_INLANE))
        if p.kind != "sum" or (div == 1.0 and rdiv is None):
            return acc
        d = h.vector(ty, [float(x) for x in div]) if isinstance(div, list) else h.const(ty, div)
        if rdiv is not None:
            d = b.fmul(d, vecops.broadcast(b, rdiv, ty.count) if isinstance(ty, ir.VectorType) else rdiv)
        return b.fdiv(acc, d)

    lo, hi, statics, scalars = p.columns()
    nloop = -(-(hi - lo) // vl) - 1 if hi > lo else 0
    if nloop:
        with h.for_range(b, nloop, name="cv") as j:
            c0 = b.add(b.mul(j, h.i64(vl)), h.i64(lo))
            store_vec(b, finish(_loop_taps(b, p, rowp, c0), vt, p.divisor(rcount, lo), True), gep(b, yrow, c0))
    for c0 in statics:
        div = [p.divisor(rcount, c0 + i) for i in range(vl)]
        v = finish(_static_taps(b, p, rowp, c0), vt, div if len(set(div)) > 1 else div[0], True)
        n = min(vl, cols.out - c0)
        store_vec(b, v, gep(b, yrow, c0), vecops.lane_mask(vl, n) if n < vl else None, p.scalar_tails)
    for c in scalars:
        taps_c = cols.taps(c)
        if cols.dil == 1 and len(taps_c) * len(rowp) > 8:
            acc = _hreduce(b, p.kind, _reduce(b, p.kind, _window_taps(b, p, rowp, c), vt))
            h.store(b, finish([acc], h.F32, p.divisor(rcount, c)), yrow, c)
            continue
        vals = [h.load(b, row, cols.start(c) + t * cols.dil) for row in rowp for t in taps_c]
        h.store(b, finish(vals, h.F32, p.divisor(rcount, c)), yrow, c)


def _sweep(b: ir.IRBuilder, p: _Pass, xp: ir.Value, yp: ir.Value) -> None:
    for start, stop, taps, rcount in p.row_runs():
        if stop - start == 1:
            _row(b, p, xp, yp, h.i64(start), taps, rcount)
        else:
            with h.for_range(b, stop, start=start, name="oh") as oh:
                _row(b, p, xp, yp, oh, taps, rcount)


def _vector_pool(ctx: KernelContext, kind: str) -> None:
    rows, cols = _axes(ctx.key)
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    n, c = ctx.shape(0)[:2]
    vl = ctx.target.vector_floats
    if vl == 16 and cols.out <= ctx.target.tuning.half_width_pool_max_ow:
        vl = 8  # rows too narrow to half fill a zmm would be scalar code; they half fill a ymm (AVX-512VL)
    common = {"kind": kind, "vl": vl, "include_pad": bool(ctx.attrs.get("count_include_pad", 0)),
              "scalar_tails": not ctx.target.tuning.masked_stores}
    if not _separable(ctx.key):
        with h.for_range(b, n * c, name="nc") as nc:
            _sweep(b, _Pass(rows=rows, cols=cols, div_rows=True, div_cols=True, **common),
                   gep(b, x, b.mul(nc, h.i64(rows.size * cols.size))), gep(b, y, b.mul(nc, h.i64(rows.out * cols.out))))
        return
    # Rows pooled into scratch, whose pad rows are written once here and never again.
    tmp, padded = b.bitcast(ctx.scratch, h.F32.as_pointer()), _padded(rows)
    pad = h.const(h.F32, float("-inf") if kind == "max" else 0.0)
    for lo, hi in ((0, rows.pad_lo), (rows.pad_lo + rows.size, padded.size)):
        with h.for_range(b, hi * cols.out, start=lo * cols.out, name="pad") as i:
            h.store(b, pad, tmp, i)
    with h.for_range(b, n * c, name="nc") as nc:
        _sweep(b, _Pass(rows=_Axis(rows.size, rows.size), cols=cols, div_rows=False, div_cols=True, **common),
               gep(b, x, b.mul(nc, h.i64(rows.size * cols.size))), gep(b, tmp, rows.pad_lo * cols.out))
        _sweep(b, _Pass(rows=padded, cols=_Axis(cols.out, cols.out), div_rows=False, div_cols=False, row_div=rows,
                        **common), tmp, gep(b, y, b.mul(nc, h.i64(rows.out * cols.out))))


def _pool(ctx: KernelContext, kind: str) -> None:
    if kind == "max" and byte_maxpool_ok(ctx.key, ctx.target):
        emit_byte_maxpool(ctx)
    elif _vectorizable(ctx.key):
        _vector_pool(ctx, "sum" if kind == "avg" else kind)
    else:
        emit_generic_pool(ctx, kind)


@kernel("MaxPool", scratch=_scratch)
def emit_max_pool(ctx: KernelContext) -> None:
    _pool(ctx, "max")


@kernel("AveragePool", scratch=_scratch)
def emit_avg_pool(ctx: KernelContext) -> None:
    _pool(ctx, "avg")
