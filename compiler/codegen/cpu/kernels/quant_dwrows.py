"""Depthwise QConv on large planes by window-row quads: one quad dot product per kernel row.

``quant_grouped.py``'s per-channel loops widen each tap to int32 and multiply it alone (nine
multiplies and adds per output for a 3x3 window) and copy every channel into an int16 plane of
column phases. Here a channel is copied as its bytes (encoded as the dot product reads them) into a
plane whose border is the activations' zero point, set once per call: a conv pads with the value
whose quantum is zero, so ``sum(w * (x - zp)) = sum(w * x) - zp * sum(w)``, and ``-zp * sum(w)``
is packed with the weights. For VL outputs of a row, one vector load per kernel row and one byte
shuffle put each output's window row (``kw <= 4`` bytes at column ``ox * sw + tx * dw``) in its
lane's quad; one quad dot product (``vpdpbusd``, ``sdot``) with the splat weight quad adds that
row for all VL outputs. Any stride and dilation whose lanes' windows fit in the loaded vector.

Rows are VL outputs at a time; a row's partial last vector is stored whole where its spill lands on
the next row's first outputs (written after it), else only its own lanes (a channel's last row, rows
narrower than half a vector).

Packed weights: int32 ``[channel]`` compensations ``-zp * sum(w)`` (padded to 16), then the
window-row quads, int8 ``[channel][kh][4]``. The bias stays int32 ``[channel]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ....ops.quant import clamp_bounds
from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ..int_dot import Dot, choose_dot
from ..int_gemm import store_lanes
from ...irhelpers import gep
from .base import KernelContext, KernelKey
from .quant_units import multiplier_at, multipliers
from .quant_grouped import padded_dims

DWROWS = "dw-rows:"  # + the Dot kind the packing was made for
PLANE_BIAS_KEY = "dw-rows-bias"
BYTE_QUADS = ("vnni", "amx", "sdot", "i8mm", "sve-sdot")  # dot products of 4 bytes a lane
SUMS_PAD = 16
MAX_FLAT_CHUNKS = 8  # a plane of at most this many chunks is unrolled across its rows


def dwrows_ok(key: KernelKey, target: Target) -> bool:
    """A depthwise conv with constant weights (and bias) on a plane too large for channels in
    lanes, whose window rows fit a quad and whose lanes' windows fit one loaded vector."""
    a = dict(key.attrs)
    if len(key.in_types[0].shape) != 4 or key.packed[1] != "const":
        return False
    if len(key.in_types) == 3 and key.packed[2] != "const":
        return False
    dot = choose_dot(target, False)
    _, c, _, _ = key.in_types[0].shape
    m, cg, _, kw = key.in_types[1].shape
    oh, ow = key.out_types[0].shape[2:]
    sw, dw = a["strides"][1], a["dilations"][1]
    return (dot.kind in BYTE_QUADS and cg == 1 and m == c == a["group"] and c > 0 and kw <= 4
            and (dot.vl - 1) * sw + (kw - 1) * dw < 4 * dot.vl
            and oh * ow > target.tuning.int8_dwrows_min_pixels)


def pack_dwrows(key: KernelKey, i: int, arr: np.ndarray, dot: Dot, zp_enc: int) -> tuple[str, np.ndarray] | None:
    if i == 2:
        return PLANE_BIAS_KEY, arr.astype(np.int32)
    if i != 1:
        return None
    m, _, kh, kw = arr.shape
    quads = np.zeros((m, kh, 4), np.int8)
    quads[:, :, :kw] = arr[:, 0]
    sums = np.zeros(-(-m // SUMS_PAD) * SUMS_PAD, np.int32)
    sums[:m] = -zp_enc * arr.reshape(m, -1).astype(np.int64).sum(axis=1)
    return DWROWS + dot.kind, np.concatenate([sums.view(np.uint8), quads.view(np.uint8).reshape(-1)])


def _pitch(key: KernelKey) -> tuple[int, int]:
    """(plane rows, bytes per plane row)."""
    rows, cols, _, _ = padded_dims(key)
    return rows, cols


def dwrows_scratch(key: KernelKey, dot: Dot) -> int:
    rows, pitch = _pitch(key)
    return -(-(rows * pitch + 4 * dot.vl) // 64) * 64 + 64


def _fill_channel(ctx: KernelContext, plane: ir.Value, src: ir.Value, flip: bool) -> None:
    """The channel at ``src`` (H x W bytes) into the plane's interior, encoded for the dot product."""
    b = ctx.b
    _, _, hh, ww = ctx.shape(0)
    _, pitch = _pitch(ctx.key)
    _, _, top, left = padded_dims(ctx.key)
    with h.for_range(b, hh, name="cy") as iy:
        dst = gep(b, plane, b.add(b.mul(iy, h.i64(pitch)), h.i64(top * pitch + left)))
        row = gep(b, src, b.mul(iy, h.i64(ww)))
        if flip:
            with h.for_range(b, ww, name="cx") as ix:
                h.store(b, b.xor(h.load(b, row, ix), ir.Constant(h.I8, 0x80)), dst, ix)
        else:
            h.memcpy(b, dst, row, ww)


@dataclass(frozen=True)
class Chunk:
    """Up to VL consecutive outputs (row-major) of one channel, read by one load per kernel row."""

    first: int  # the first output's index in its row (row mode) or plane (flat mode)
    count: int
    at: int  # plane offset of its first output's window, kernel row 0
    mask: tuple[int, ...]  # byte j of lane i's quad: loaded byte mask[4i + j]


def chunks(key: KernelKey, vl: int) -> tuple[bool, tuple[Chunk, ...]]:
    a = dict(key.attrs)
    (sh, sw), dw = a["strides"], a["dilations"][1]
    return plane_runs(key.out_types[0].shape[2:], sh, sw, dw, key.in_types[1].shape[3], _pitch(key)[1], vl)


def plane_runs(out_hw: tuple[int, int], sh: int, sw: int, dw: int, kw: int, pitch: int,
               vl: int) -> tuple[bool, tuple[Chunk, ...]]:
    """(flat, chunks): a small plane as runs of consecutive outputs across its rows, each as long as
    one loaded vector (4 VL bytes) covers (at most VL, ``MAX_FLAT_CHUNKS`` in all); else one row's
    chunks. Byte ``4i + t`` of a mask is lane i's window byte t (t < kw)."""
    oh, ow = out_hw

    def runs(total: int, offset) -> list[Chunk]:
        out, p = [], 0
        while p < total:
            n = 1
            while n < vl and p + n < total and offset(p + n) - offset(p) + (kw - 1) * dw < 4 * vl:
                n += 1
            rel = [offset(p + min(i, n - 1)) - offset(p) for i in range(vl)]
            mask = tuple(r + t * dw if t < kw else r for r in rel for t in range(4))
            out.append(Chunk(p, n, offset(p), mask))
            p += n
        return out

    flat = runs(oh * ow, lambda p: (p // ow) * sh * pitch + (p % ow) * sw)
    if len(flat) <= MAX_FLAT_CHUNKS:
        return True, tuple(flat)
    return False, tuple(runs(ow, lambda x: x * sw))


def emit_dwrows_qconv(ctx: KernelContext, dot: Dot, flip: bool, zp_enc: int) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, c, hh, ww = ctx.shape(0)
    _, _, kh, _ = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    sh, dh = a["strides"][0], a["dilations"][0]
    _, pitch = _pitch(ctx.key)
    vl, vt, bt = dot.vl, dot.lanes_type, dot.bytes_type
    ft = ir.VectorType(h.F32, vl)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mults = multipliers(ctx)
    plane = ctx.scratch
    sums = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    wq = b.bitcast(gep(b, ctx.ins[1], 4 * (-(-c // SUMS_PAD) * SUMS_PAD)), h.I32.as_pointer())
    bias = ctx.ins[2] if len(ctx.in_types) == 3 else None
    flat, runs = chunks(ctx.key, vl)
    masked = ctx.target.tuning.masked_stores
    h.memset(b, plane, zp_enc & 0xFF, dwrows_scratch(ctx.key, dot))  # the border, once a call

    with h.loop_nest(b, (n_img, c), name="dwrows") as (n, ch):
        plane_src = gep(b, ctx.ins[0], b.mul(b.add(b.mul(n, h.i64(c)), ch), h.i64(hh * ww)))
        _fill_channel(ctx, plane, plane_src, flip)
        init = h.load(b, sums, ch)
        if bias is not None:
            init = b.add(init, h.load(b, bias, ch))
        init = qm.splat_value(b, init, vt)
        mult = qm.splat_value(b, multiplier_at(b, mults, ch), ft)
        wrows = [b.bitcast(qm.splat_value(b, h.load(b, wq, b.add(b.mul(ch, h.i64(kh)), h.i64(ty))), vt), bt)
                 for ty in range(kh)]
        out_plane = gep(b, ctx.outs[0], b.mul(b.add(b.mul(n, h.i64(c)), ch), h.i64(oh * ow)))

        def emit(run: Chunk, at: ir.Value, out: ir.Value, room: bool) -> None:
            """One chunk: ``room``: the outputs after it in this plane take a whole-vector store."""
            acc = init
            for ty in range(kh):
                src = gep(b, plane, b.add(at, h.i64(run.at + ty * dh * pitch)))
                v = b.load(b.bitcast(src, bt.as_pointer()), align=1)
                acc = dot.step(b, acc, b.shuffle_vector(v, v, h.vector(ir.VectorType(h.I32, 4 * vl), run.mask)), wrows[ty])
            q = qm.requantize(b, acc, mult, a["y_zero_point"], lo, hi)
            store_lanes(b, q, gep(b, out, run.first), None if room or run.count == vl else run.count, masked)

        each_chunk(b, emit, runs, flat, out_plane, (oh, ow), sh * pitch, vl)


def each_chunk(b: ir.IRBuilder, emit, runs: tuple[Chunk, ...], flat: bool, out_plane: ir.Value,
               out_hw: tuple[int, int], row_step: int, vl: int) -> None:
    """Call ``emit(run, input offset, output row, room)`` for every chunk of one output plane: the
    whole plane at once when ``flat``, else row by row (the last row apart: its whole-vector stores
    have less room after them). ``row_step``: input bytes between output rows."""
    oh, ow = out_hw

    def row(oy: ir.Value, last: bool) -> None:
        out_row = gep(b, out_plane, b.mul(oy, h.i64(ow)))
        for run in runs:
            emit(run, b.mul(oy, h.i64(row_step)), out_row, run.first + vl <= (ow if last else 2 * ow))

    if flat:
        for run in runs:
            emit(run, h.i64(0), out_plane, run.first + vl <= oh * ow)
        return
    if oh > 1:
        with h.for_range(b, oh - 1, name="oy") as oy:
            row(oy, False)
    row(h.i64(oh - 1), True)
