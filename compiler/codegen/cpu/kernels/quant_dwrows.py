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

Rows are VL outputs at a time; a row's last partial vector is stored whole except on a channel's
last row, so the spill lands on the next row's first outputs, which are written after it.

Packed weights: int32 ``[channel]`` compensations ``-zp * sum(w)`` (padded to 16), then the
window-row quads, int8 ``[channel][kh][4]``. The bias stays int32 ``[channel]``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....ops.quant import clamp_bounds, multiplier
from ....target import Target
from ... import irhelpers as h
from ... import quant_math as qm
from ..int_dot import Dot, choose_dot
from ..int_gemm import store_bytes
from ...irhelpers import gep
from .base import KernelContext, KernelKey
from .quant_grouped import padded_dims

DWROWS = "dw-rows:"  # + the Dot kind the packing was made for
DWROWS_BIAS = "dw-rows-bias"
BYTE_QUADS = ("vnni", "amx", "sdot", "i8mm", "sve-sdot")  # dot products of 4 bytes a lane
SUMS_PAD = 16


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
            and oh * ow > target.tuning.int8_depthwise_lanes_max_pixels)


def pack_dwrows(key: KernelKey, i: int, arr: np.ndarray, dot: Dot, zp_enc: int) -> tuple[str, np.ndarray] | None:
    if i == 2:
        return DWROWS_BIAS, arr.astype(np.int32)
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


def emit_dwrows_qconv(ctx: KernelContext, dot: Dot, flip: bool, zp_enc: int) -> None:
    a, b = ctx.attrs, ctx.b
    n_img, c, hh, ww = ctx.shape(0)
    _, _, kh, kw = ctx.shape(1)
    oh, ow = ctx.out_shape[2:]
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    _, pitch = _pitch(ctx.key)
    vl, vt, bt = dot.vl, dot.lanes_type, dot.bytes_type
    ft = ir.VectorType(h.F32, vl)
    lo, hi = clamp_bounds(a["to"], a["clamp"])
    mvals = multiplier(a["x_scale"], a["w_scale"], a["y_scale"])
    plane = ctx.scratch
    sums = b.bitcast(ctx.ins[1], h.I32.as_pointer())
    wq = b.bitcast(gep(b, ctx.ins[1], 4 * (-(-c // SUMS_PAD) * SUMS_PAD)), h.I32.as_pointer())
    bias = ctx.ins[2] if len(ctx.in_types) == 3 else None
    mask = h.vector(ir.VectorType(h.I32, 4 * vl),
                    [i * sw + t * dw if t < kw else i * sw for i in range(vl) for t in range(4)])
    chunks = [(x0, min(vl, ow - x0)) for x0 in range(0, ow, vl)]
    h.memset(b, plane, zp_enc & 0xFF, dwrows_scratch(ctx.key, dot))  # the border, once a call

    with h.loop_nest(b, (n_img, c), name="nc") as (n, ch):
        plane_src = gep(b, ctx.ins[0], b.mul(b.add(b.mul(n, h.i64(c)), ch), h.i64(hh * ww)))
        _fill_channel(ctx, plane, plane_src, flip)
        init = h.load(b, sums, ch)
        if bias is not None:
            init = b.add(init, h.load(b, bias, ch))
        init = qm.splat_value(b, init, vt)
        mult = qm.splat_value(b, qm.channel_value(b, mvals, h.F32, ch, f"{ctx.name}.m"), ft)
        wrows = [b.bitcast(qm.splat_value(b, h.load(b, wq, b.add(b.mul(ch, h.i64(kh)), h.i64(ty))), vt), bt)
                 for ty in range(kh)]
        out_plane = gep(b, ctx.outs[0], b.mul(b.add(b.mul(n, h.i64(c)), ch), h.i64(oh * ow)))

        def row(oy: ir.Value, spill: bool) -> None:
            at = b.mul(oy, h.i64(sh * pitch))
            out_row = gep(b, out_plane, b.mul(oy, h.i64(ow)))
            for x0, valid in chunks:
                acc = init
                for ty in range(kh):
                    src = gep(b, plane, b.add(at, h.i64(ty * dh * pitch + x0 * sw)))
                    v = b.load(b.bitcast(src, bt.as_pointer()), align=1)
                    acc = dot.step(b, acc, b.shuffle_vector(v, v, mask), wrows[ty])
                q = qm.requantize(b, acc, mult, a["y_zero_point"], lo, hi)
                store_bytes(b, q, gep(b, out_row, x0), None if spill or valid == vl else valid)

        if oh > 1:
            with h.for_range(b, oh - 1, name="oy") as oy:
                row(oy, True)
        row(h.i64(oh - 1), False)

