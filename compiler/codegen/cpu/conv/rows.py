"""Convs with small outputs (ResNet's 512x4x4 3x3) as a transposed GEMM that never multiplies padding.

Pure ``llvmlite.ir``; ``emit.emit_conv2d`` dispatches here when ``plan.conv_plan`` picks
``"rows"``. The micro-kernel's broadcast rows are MR pixels of one output row (a cell), its
vectors NV x VL output channels (Y^T[pixels, OC], as the ``transposed`` 1x1 path), and its k loop
runs over input channels with the taps inside it. Which (pixel, tap) pairs read inside the image
is known at compile time, so the padding products are simply not emitted (a 4x4 output with pad 1
does 100 of im2col's 144 FMAs). Cells that compute the same pairs (same valid kh count, same valid
kw taps per pixel) share one loop body over a constant table of their positions; in big kernels
(8x8 outputs) taps that share their valid pixels run as a loop too.

Weights (``pack.pack_conv_weights``): per column tile of nv panels, ``[C, KH*KW, nv, VL]``,
tiles in order (``column_tiles``), output channels past OC zero: each tile is one contiguous
stream. Loop order per tile: channel blocks outer, cells inner, so a block's weights are read
from DRAM once (the model's 512x4x4 layers stream 9.4 MB each) and stay in L1 for every output
row; the block ``Tuning.rows_prefetch_blocks`` ahead is prefetched meanwhile (without it even L3-resident weights
run at im2col's speed). Partial sums live in a stack tile; the epilogue adds bias and residual,
applies the activation and stores NCHW. The sums are a helper function per shape and tile, so layers that
differ only in their epilogue share their code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from llvmlite import ir

from ....digest import short_hex
from ....target import Target
from ...activations import apply_activation
from ..gemm import acc_loop, tap_table
from ...mathfns import fma
from ..vecops import F32P, broadcast, define_helper, load_vec, store_vec
from .plan import column_tiles
from ...irhelpers import F32, I8P, call_named, for_range, gep, i64, prefetch

UNROLL_FMAS = 300  # kernels whose unrolled bodies would hold more FMAs (8x8 outputs: 575) loop over
TAP_LOOP = 6  # the taps that share their valid pixels, from this many on (8x8: 1.2x faster)
LINE = 64  # bytes per cache line


def _valid_taps(o: int, s: int, pad: int, d: int, k: int, size: int) -> tuple[int, ...]:
    """Taps t of output position o whose input position o*s - pad + t*d lies inside [0, size)
    (always a range)."""
    return tuple(t for t in range(k) if 0 <= o * s - pad + t * d < size)


def pixel_chunks(ow_count: int, mr: int) -> list[tuple[int, int]]:
    """(first ow, pixels): ceil(OW/MR) chunks as even as possible, so no chunk is a lone pixel."""
    n = math.ceil(ow_count / mr)
    base, extra = divmod(ow_count, n)
    sizes = [base + 1] * extra + [base] * (n - extra)
    return [(sum(sizes[:i]), s) for i, s in enumerate(sizes)]


def cell_classes(p) -> list[tuple[tuple, list[tuple[int, int, int, int]]]]:
    """Cells grouped by what they compute: key (nk valid kh taps, valid kw taps of each pixel),
    cells (oh, first valid kh, first ow, cell index). A 4x4 output has two classes (top and bottom
    rows, the others); cells without a valid tap keep zero sums."""
    chunks = pixel_chunks(p.OW, p.mr)
    classes: dict[tuple, list] = {}
    for oh in range(p.OH):
        khs = _valid_taps(oh, p.sh, p.pt, p.dh, p.KH, p.H)
        for j, (ow0, mr) in enumerate(chunks):
            cols = tuple(_valid_taps(ow0 + i, p.sw, p.pl, p.dw, p.KW, p.W) for i in range(mr))
            if khs and any(cols):
                classes.setdefault((len(khs), cols), []).append((oh, khs[0], ow0, oh * len(chunks) + j))
    return list(classes.items())


def fma_count(p) -> int:
    """Vector FMAs the kernel executes per image: one per valid (pixel, tap), channel and panel."""
    pairs = sum(len(_valid_taps(oh, p.sh, p.pt, p.dh, p.KH, p.H)) * len(_valid_taps(ow, p.sw, p.pl, p.dw, p.KW, p.W))
                for oh in range(p.OH) for ow in range(p.OW))
    return pairs * p.C * math.ceil(p.OC / p.vl)


def channel_block(C: int, most: int) -> int:
    """The largest divisor of C up to ``most`` (``Tuning.rows_channel_block``; all of C when that is below 8)."""
    d = max(x for x in range(1, min(C, most) + 1) if C % x == 0)
    return d if d >= 8 else C


def emit_conv_rows(fn: ir.Function, p, target: Target, *, bias: bool, residual: bool, activation: str = "none",
                   act_alpha: float = 0.0, act_beta: float = 0.0) -> None:
    """The body of ``fn`` (the emit_conv2d signature) for a ``rows`` plan: per column tile and image, the
    partial sums (the helper :func:`_sums_helper` defines), then the epilogue."""
    X, Wp, bias_p, res_p, Y, _ = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vl, P, HW = p.vl, p.OH * p.OW, p.H * p.W
    panels, panel = math.ceil(p.OC / vl), p.C * p.T * vl
    buf = _stack(b, P * p.nv * vl)  # the tile's partial sums Y^T: [pixel, vector, lane]
    for first, count, nv in column_tiles(panels, p.nv):
        sums = _sums_helper(fn.module, target, p, nv)
        with for_range(b, count, name="ct") as j:
            s0 = b.add(i64(first), b.mul(j, i64(nv)))
            w = gep(b, Wp, b.mul(s0, i64(panel)))
            nxt = b.select(b.icmp_unsigned("<", b.add(s0, i64(nv)), i64(panels)), gep(b, w, nv * panel), w)
            with for_range(b, p.N, name="n") as n:
                b.call(sums, [gep(b, X, b.mul(n, i64(p.C * HW))), w, nxt, buf])
                yn = gep(b, Y, b.mul(n, i64(p.OC * P)))
                rn = gep(b, res_p, b.mul(n, i64(p.OC * P))) if residual else None
                _epilogue(b, p, buf, nv, s0, yn, rn, bias_p if bias else None, (activation, act_alpha, act_beta))
    b.ret_void()


def _sums_helper(module: ir.Module, target: Target, p, nv: int) -> ir.Function:
    """``void (x, w, next, sums)``: one image's partial sums for a column tile of ``nv`` panels (its weights at
    ``w``, the next tile's at ``next``), channel blocks outer, cells inner. A helper that every layer of the
    module with the same shape and tile calls, whatever its epilogue (ResNet-18's 512x4x4 convs with and
    without a residual: 77 kB of IR each)."""
    shape = dataclasses.replace(p, N=1, OC=1)  # neither the batch nor the output channels change the sums' code
    name = "rows_sums_" + short_hex(repr((shape, nv)), 16)
    return define_helper(module, name, target, [F32P] * 4, lambda b, fn: _sums(b, p, nv, *fn.args))


def _sums(b: ir.IRBuilder, p, nv: int, x: ir.Value, w: ir.Value, nxt: ir.Value, buf: ir.Value) -> None:
    """Zero ``buf``, then add every channel block's products. Each block prefetches the one
    rows_prefetch_blocks on, counting into the next tile (the last tile: its own start again)."""
    vl, P, T, HW = p.vl, p.OH * p.OW, p.T, p.H * p.W
    cb = channel_block(p.C, p.tuning.rows_channel_block)
    nblk, cells = p.C // cb, p.OH * len(pixel_chunks(p.OW, p.mr))
    classes = cell_classes(p)
    unrolled = sum(nk * sum(map(len, cols)) for (nk, cols), _ in classes) * p.nv  # FMAs of all bodies unrolled
    tap_loop = TAP_LOOP if unrolled > UNROLL_FMAS else p.T + 1
    blk = cb * T * nv * vl
    per_cell = -(-4 * blk // LINE) / cells  # lines of a block to prefetch per cell
    _memset0(b, buf, P * nv * vl)
    with for_range(b, nblk, name="cb") as j:
        g = b.add(j, i64(p.tuning.rows_prefetch_blocks))
        pf = b.select(b.icmp_unsigned("<", g, i64(nblk)), b.gep(w, [b.mul(g, i64(blk))]),
                      b.gep(nxt, [b.mul(b.sub(g, i64(nblk)), i64(blk))]))
        k = _Block(gep(b, w, b.mul(j, i64(blk))), nv, b.bitcast(pf, I8P), math.ceil(per_cell / cb),
                   gep(b, x, b.mul(j, i64(cb * HW))), cb, buf, tap_loop)
        for key, where in classes:
            _cells(b, p, k, key, where)


@dataclass
class _Block:
    """One channel block of one column tile and image."""

    w: ir.Value  # the tile's weights at this block: [channels, T, nv, VL]
    nv: int
    pf: ir.Value  # i8* to the weights to prefetch meanwhile
    per_step: int  # cache lines prefetched per channel step
    x: ir.Value  # this image's input at this block
    channels: int
    buf: ir.Value
    tap_loop: int  # taps with the same valid pixels run as a loop from this many on


def _cells(b, p, k: _Block, key, where) -> None:
    """One class of cells: its one cell inline, or a loop over a constant table of them (the loop
    count through an asm, so LLVM keeps it a loop: unrolled it doubled the code for no gain)."""
    if len(where) == 1:
        return _cell(b, p, k, key, *(i64(v) for v in where[0]))
    table = tap_table(b.module, [v for cell in where for v in cell])
    with for_range(b, _opaque(b, i64(len(where))), name="cell") as i:
        _cell(b, p, k, key, *(b.load(b.gep(table, [i64(0), b.add(b.mul(i, i64(4)), i64(f))], inbounds=True))
                              for f in range(4)))


def _cell(b, p, k: _Block, key, oh: ir.Value, kh0: ir.Value, ow0: ir.Value, idx: ir.Value) -> None:
    """Cell idx (MR pixels from (oh, ow0), valid kh taps from kh0 on): the block's channels over
    its valid (pixel, tap) pairs, added to the partial sums."""
    vl, nv, (nk, cols) = p.vl, k.nv, key
    groups: dict[tuple, list] = {}  # pixels -> (weight offset, x offset) of the taps valid for them
    for kk in range(nk):
        for kw in range(p.KW):
            pix = tuple(i for i, c in enumerate(cols) if kw in c)
            if pix:
                groups.setdefault(pix, []).append(((kk * p.KW + kw) * nv * vl, kk * p.dh * p.W + kw * p.dw - p.pl))
    ih0 = b.add(b.sub(b.mul(oh, i64(p.sh)), i64(p.pt)), b.mul(kh0, i64(p.dh)))  # input row of tap kh0
    xr = b.gep(k.x, [b.add(b.mul(ih0, i64(p.W)), b.mul(ow0, i64(p.sw)))])  # may point into the left pad
    wr = gep(b, k.w, b.mul(kh0, i64(p.KW * nv * vl)))
    pix0 = b.add(b.mul(oh, i64(p.OW)), ow0)
    pf = b.gep(k.pf, [b.mul(idx, i64(k.channels * k.per_step * LINE))])

    def per_channel(c, acc):
        line = _opaque(b, b.gep(pf, [b.mul(c, i64(k.per_step * LINE))]))
        for q in range(k.per_step):  # the last cells run past the block: harmless hints
            prefetch(b, b.gep(line, [i64(q * LINE)]), p.tuning.rows_prefetch_locality)
        xc = _opaque(b, b.gep(xr, [b.mul(c, i64(p.H * p.W))]))
        wc = _opaque(b, b.gep(wr, [b.mul(c, i64(p.T * nv * vl))], inbounds=True))
        for pix, taps in groups.items():
            acc = _taps(b, p, nv, wc, xc, pix, taps, acc, k.tap_loop)
        return acc

    rows = [gep(b, k.buf, b.mul(b.add(pix0, i64(i)), i64(nv * vl))) for i in range(len(cols))]
    acc = [[load_vec(b, gep(b, r, v * vl), vl) for v in range(nv)] for r in rows]
    acc = acc_loop(b, k.channels, acc, per_channel, "kc")
    for r, row in zip(rows, acc):
        for v, x in enumerate(row):
            store_vec(b, x, gep(b, r, v * vl))


def _taps(b, p, nv: int, wc, xc, pix, taps, acc, tap_loop: int):
    """acc[i] += x[tap + i*sw] * w[tap] for the pixels i of ``pix`` and each tap: unrolled, or from
    ``tap_loop`` taps on a loop over a constant table of (weight, input) offsets as in
    ``gemm.emit_tile``. The loop costs 12-20% in the small 4x4 kernels (loops of 2-6 taps) but wins
    in the 8x8 ones, whose unrolled bodies no longer fit the op cache, and cuts their LLVM time 2-3x."""
    vl = p.vl

    def one(acc, w_off, x_off):
        wv = [load_vec(b, b.gep(w_off, [i64(v * vl)], inbounds=True), vl) for v in range(nv)]
        acc = [list(row) for row in acc]
        for i in pix:
            a = broadcast(b, b.load(b.gep(x_off, [i64(i * p.sw)]), align=4), vl)
            acc[i] = [fma(b, a, wv[v], acc[i][v]) for v in range(nv)]
        return acc

    if len(taps) < tap_loop:
        for w_off, x_off in taps:
            acc = one(acc, gep(b, wc, w_off), _opaque(b, b.gep(xc, [i64(x_off)])))
        return acc
    table = tap_table(b.module, [v for tap in taps for v in tap])

    def per_tap(t, acc):
        w_off, x_off = (b.load(b.gep(table, [i64(0), b.add(b.mul(t, i64(2)), i64(f))], inbounds=True)) for f in (0, 1))
        return one(acc, b.gep(wc, [w_off], inbounds=True), _opaque(b, b.gep(xc, [x_off]), keep=True))
    return acc_loop(b, len(taps), acc, per_tap, "tap")


def _epilogue(b, p, buf, nv: int, s0, yn, rn, bias_p, act) -> None:
    """Y[oc, :] = act(Y^T[:, oc] + bias[oc] + residual[oc, :]) for the tile's channels below OC:
    scalar loops that LLVM neither unrolls nor vectorizes (as it does the lane loops of ``gemm``'s
    transposed epilogue, which then cost more compile time than the FMAs); ~1% of the run time."""
    vl, P = p.vl, p.OH * p.OW
    oc0 = b.mul(s0, i64(vl))
    left = b.sub(i64(p.OC), oc0)
    with for_range(b, b.select(b.icmp_unsigned("<", left, i64(nv * vl)), left, i64(nv * vl)), name="eo") as o:
        oc = b.add(oc0, o)
        yo = gep(b, yn, b.mul(oc, i64(P)))
        ro = gep(b, rn, b.mul(oc, i64(P))) if rn is not None else None
        bias_v = b.load(gep(b, bias_p, oc), align=4) if bias_p is not None else None
        src = gep(b, buf, o)
        with for_range(b, _opaque(b, i64(P)), name="ep") as q:  # a loop: no unrolled or vector copies
            x = b.load(b.gep(_opaque(b, src, keep=True), [b.mul(q, i64(nv * vl))], inbounds=True), align=4)
            if bias_v is not None:
                x = b.fadd(x, bias_v)
            if ro is not None:
                x = b.fadd(x, b.load(b.gep(ro, [q], inbounds=True), align=4))
            b.store(apply_activation(b, x, *act), b.gep(yo, [q], inbounds=True), align=4)


def _stack(b: ir.IRBuilder, nfloats: int) -> ir.Value:
    """A 32-byte aligned float[nfloats] stack buffer (``b`` in the entry block: never in a loop)."""
    a = b.alloca(ir.ArrayType(F32, nfloats))
    a.align = 32
    return b.bitcast(a, F32P)


def _memset0(b: ir.IRBuilder, dst: ir.Value, nfloats: int) -> None:
    args = [b.bitcast(dst, I8P), ir.Constant(ir.IntType(8), 0), i64(4 * nfloats), ir.Constant(ir.IntType(1), 0)]
    call_named(b, "llvm.memset.p0.i64", ir.VoidType(), args)



def _opaque(b: ir.IRBuilder, v: ir.Value, keep: bool = False) -> ir.Value:
    """``v`` through an empty asm. A tap's input pointer: LLVM cannot tell that two taps broadcast
    the same element, so it reloads it (one cheap load) instead of keeping up to KH*KW*MR broadcasts
    live across taps, which spilled the accumulators. A channel's pointers: Loop Strength Reduction
    sees three uses of the channel index, not one per load (it was a third of the LLVM time). A
    loop count: the loop stays a loop. With ``keep`` the call is ``noduplicate``: the loop around
    it is not unrolled either."""
    call = b.call(ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=r,0", side_effect=True), [v])
    if keep:
        set.add(call.attributes, "noduplicate")  # valid on a call, missing from llvmlite's list
    return call
