"""Int8 MaxPool by byte shuffles, VL outputs a vector, on the targets of the window-row quads.

The vector pool of ``pool.py`` is float32 only, so an int8 MaxPool took the generic loop: one
compare and select per tap and output, each tap bounds-checked (SqueezeNet's 3x3 stride-2 pools,
128 x 27 x 27 -> 13 x 13: 127 us where ONNX Runtime takes 7). Here each channel is copied into a
plane bordered with the dtype's lowest value (set once a call; a window always overlaps the input,
so the border never wins), and for VL outputs each window row is one vector load whose taps are
byte shuffles (lane i: its window's byte), maxed as VL bytes. Outputs are VL at a time along a row,
or, for a small plane, as runs across its rows, as in ``quant_dwrows.py``.
"""

from __future__ import annotations

import math

from llvmlite import ir

from ....ir.dtypes import DType
from ....target import Target
from ... import irhelpers as h
from ..int_dot import choose_dot
from ...irhelpers import gep
from .base import KernelContext, KernelKey
from ..int_gemm import store_lanes
from .quant_dwrows import BYTE_QUADS, each_chunk, plane_runs

BYTE_SHUFFLES = BYTE_QUADS + ("avx2-wd", "avx2-ubsw")
"""The targets (by their dot product) this pool runs on: it needs byte shuffles, not dot products, and AVX2's
were timed (x86-avx2 on the Xeon, the small CNN's two pools: 5.9k and 3.0k cycles by the generic loop, 1.1k
and 1.0k here, fp32's 1.4k and 0.9k)."""
_MAX = {DType.U8: ("llvm.umax", 0), DType.I8: ("llvm.smax", 0x80)}  # the max, the lowest value's byte


def _geometry(key: KernelKey) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, ...]]:
    a = dict(key.attrs)
    return tuple(a["kernel_shape"]), tuple(a["strides"]), tuple(a.get("dilations") or (1, 1)), tuple(a["pads"])


def _dims(key: KernelKey) -> tuple[int, int]:
    """(plane rows, bytes per plane row): every tap of every output inside."""
    (kh, kw), (sh, sw), (dh, dw), pads = _geometry(key)
    _, _, hh, ww = key.in_types[0].shape
    oh, ow = key.out_types[0].shape[2:]
    return (max(hh + pads[0], (oh - 1) * sh + (kh - 1) * dh + 1),
            max(ww + pads[1], (ow - 1) * sw + (kw - 1) * dw + 1))


def byte_maxpool_ok(key: KernelKey, target: Target) -> bool:
    x = key.in_types[0]
    if x.dtype not in _MAX or len(x.shape) != 4 or len(key.out_types) != 1 or not math.prod(key.out_types[0].shape):
        return False
    dot = choose_dot(target, False)
    (_, kw), (_, sw), (_, dw), _ = _geometry(key)
    return dot.kind in BYTE_SHUFFLES and (dot.vl - 1) * sw + (kw - 1) * dw < 4 * dot.vl


def byte_maxpool_scratch(key: KernelKey, target: Target) -> int:
    rows, pitch = _dims(key)
    return -(-(rows * pitch + 4 * choose_dot(target, False).vl) // 64) * 64 + 64


def emit_byte_maxpool(ctx: KernelContext) -> None:
    b = ctx.b
    (kh, kw), (sh, sw), (dh, dw), pads = _geometry(ctx.key)
    n_img, c, hh, ww = ctx.shape(0)
    oh, ow = ctx.out_shape[2:]
    _, pitch = _dims(ctx.key)
    vl = choose_dot(ctx.target, False).vl
    bt = ir.VectorType(h.I8, 4 * vl)
    maxf, lowest = _MAX[ctx.in_types[0].dtype]
    flat, runs = plane_runs((oh, ow), sh, sw, dw, kw, pitch, vl)
    masked = ctx.target.tuning.masked_stores
    plane = ctx.scratch
    h.memset(b, plane, lowest, byte_maxpool_scratch(ctx.key, ctx.target))  # the border, once a call

    with h.for_range(b, n_img * c, name="bytepool") as nc:
        src = gep(b, ctx.ins[0], b.mul(nc, h.i64(hh * ww)))
        with h.for_range(b, hh, name="cy") as iy:
            h.memcpy(b, gep(b, plane, b.add(b.mul(iy, h.i64(pitch)), h.i64(pads[0] * pitch + pads[1]))),
                     gep(b, src, b.mul(iy, h.i64(ww))), ww)
        out_plane = gep(b, ctx.outs[0], b.mul(nc, h.i64(oh * ow)))

        def emit(run, at: ir.Value, out: ir.Value, room: bool) -> None:
            acc = None
            for ty in range(kh):
                p = gep(b, plane, b.add(at, h.i64(run.at + ty * dh * pitch)))
                v = b.load(b.bitcast(p, bt.as_pointer()), align=1)
                for tx in range(kw):
                    mask = h.vector(ir.VectorType(h.I32, vl), [run.mask[4 * i] + tx * dw for i in range(vl)])
                    lanes = b.shuffle_vector(v, v, mask)
                    acc = lanes if acc is None else h.call_intrinsic(b, maxf, acc, lanes)
            store_lanes(b, acc, gep(b, out, run.first), None if room or run.count == vl else run.count, masked)

        each_chunk(b, emit, runs, flat, out_plane, (oh, ow), sh * pitch, vl)
