"""Conv and FusedConv (groups, strides, dilations, pads; 3-D and beyond through the direct N-d code
both backends share, ``codegen/gathers``).

f32 with constant weights: the implicit-GEMM / depthwise micro-kernels of ``cpu/conv/`` on
weights packed for the geometry (1-D runs as 2-D with a height of one). Otherwise a direct
convolution: for each output channel and tap (kh, kw) the output row and column ranges that stay
inside the input are computed once, so the innermost loop ``out[oh, ow] += w * x[ih, ow*s + off]``
has no bounds checks (stride 1: a plain vector FMA stream) and padded taps cost nothing.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ....ir.dtypes import DType
from ... import irhelpers as h
from ...gathers import conv_nd
from ..conv.emit import emit_conv2d
from ..conv.plan import conv_scratch_bytes
from ..conv.pack import pack_conv_weights
from .base import KernelContext, KernelKey, kernel, unsupported
from .epilogue import apply_epilogue, residual_index, residual_shared


def _valid(b: ir.IRBuilder, out: int, size: int, stride: int, offset: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Output positions o in [lo, hi) whose input position o*stride + offset lies in [0, size)
    (an empty range has hi <= lo). Computed at run time, so taps stay a loop, not unrolled code."""
    zero = h.i64(0)
    neg = b.select(b.icmp_signed("<", offset, zero), b.sub(zero, offset), zero)
    lo = b.sdiv(b.add(neg, h.i64(stride - 1)), h.i64(stride))
    lim = b.sub(h.i64(size - 1), offset)
    hi = b.add(b.sdiv(b.select(b.icmp_signed("<", lim, zero), zero, lim), h.i64(stride)), h.i64(1))
    hi = b.select(b.icmp_signed("<", lim, zero), zero, b.select(b.icmp_signed("<", hi, h.i64(out)), hi, h.i64(out)))
    return lo, hi


def _conv(ctx: KernelContext) -> None:
    xs, ws, ys = ctx.shape(0), ctx.shape(1), ctx.out_shape
    if len(xs) < 3:
        raise unsupported(ctx.key.op, f"a convolution needs a spatial dimension, got input rank {len(xs)}")
    if len(xs) > 4 or ctx.out_types[0].dtype is DType.F16:  # f16: summed in f32, rounded once per output
        _conv_nd(ctx)
        return
    a = ctx.attrs
    nd = len(xs) - 2
    # Treat 1-D as 2-D with a height of one.
    two = (lambda t, fill: (fill,) + tuple(t)) if nd == 1 else (lambda t, fill: tuple(t))
    n, c, (hh, ww) = xs[0], xs[1], two(xs[2:], 1)
    m, cg, (kh, kw) = ws[0], ws[1], two(ws[2:], 1)
    oh, ow = two(ys[2:], 1)
    sh, sw = two(a["strides"], 1)
    dh, dw = two(a["dilations"], 1)
    pads = tuple(a["pads"])
    ph, pw = two(pads[:nd], 0)
    g = a["group"]
    mg = m // g
    has_bias = bool(a["has_bias"]) if ctx.key.op == "FusedConv" else len(ctx.in_types) == 3
    b, x, y = ctx.b, ctx.ins[0], ctx.outs[0]
    ty = h.LLTYPE[ctx.out_types[0].dtype]
    plane, iplane = oh * ow, hh * ww
    with h.loop_nest(b, (n, m), name="nm") as (ni, mi):
        ybase = b.mul(b.add(b.mul(ni, h.i64(m)), mi), h.i64(plane))
        init = ctx.read(2, mi) if has_bias else h.const(ty, 0.0)
        shared = ctx.key.op == "FusedConv" and residual_shared(ctx)
        with h.for_range(b, plane, name="z") as p:
            yi = b.add(ybase, p)
            h.store(b, b.fadd(h.load(b, y, yi), init) if shared else init, y, yi)
        grp = b.sdiv(mi, h.i64(mg))
        with h.for_range(b, cg, name="ic") as ic:
            ch = b.add(b.mul(grp, h.i64(cg)), ic)
            xbase = b.mul(b.add(b.mul(ni, h.i64(c)), ch), h.i64(iplane))
            wbase = b.mul(b.add(b.mul(mi, h.i64(cg)), ic), h.i64(kh * kw))
            with h.for_range(b, kh, name="th") as th:
                offh = b.sub(b.mul(th, h.i64(dh)), h.i64(ph))
                h_lo, h_hi = _valid(b, oh, hh, sh, offh)
                with h.for_range(b, kw, name="tw") as tw:
                    offw = b.sub(b.mul(tw, h.i64(dw)), h.i64(pw))
                    w_lo, w_hi = _valid(b, ow, ww, sw, offw)
                    wv = ctx.read(1, b.add(wbase, b.add(b.mul(th, h.i64(kw)), tw)))
                    with h.for_range(b, h_hi, start=h_lo, name="oh") as r:
                        irow = b.add(xbase, b.mul(b.add(b.mul(r, h.i64(sh)), offh), h.i64(ww)))
                        orow = b.add(ybase, b.mul(r, h.i64(ow)))
                        with h.for_range(b, w_hi, start=w_lo, name="ow") as col:
                            xi = b.add(irow, b.add(b.mul(col, h.i64(sw)), offw))
                            yi = b.add(orow, col)
                            acc = h.call_intrinsic(b, "llvm.fmuladd", wv, h.load(b, x, xi), h.load(b, y, yi))
                            h.store(b, acc, y, yi)
        if ctx.key.op == "FusedConv":
            apply_epilogue(b, ctx, ybase, plane)


def _conv_nd(ctx: KernelContext) -> None:
    """One output element at a time; a residual sharing the output is read before it is overwritten."""
    fused = ctx.key.op == "FusedConv"
    bias = bool(ctx.attrs["has_bias"]) if fused else len(ctx.in_types) == 3
    value = conv_nd(ctx.attrs, ctx.in_types, ctx.out_types, bias)
    shape = ctx.out_shape
    b, y = ctx.b, ctx.outs[0]
    shared = fused and residual_shared(ctx)
    with h.loop_nest(b, shape) as idx:
        i = h.linear(b, idx, h.contiguous_strides(shape))
        v = value(b, list(idx), ctx.ins)
        h.store(b, b.fadd(v, h.load(b, y, i)) if shared else v, y, i)
    if fused:
        apply_epilogue(b, ctx, h.i64(0), int(np.prod(shape)))


PACKED = "conv"
BLOCKS = "row_blocks"
"""A part's attribute, not the model's: the blocks of output a conv split by rows runs (``split.py``): a
Winograd conv's blocks of tile rows, a banded direct conv's bands, an uncopied direct conv's pixel vectors."""


def geometry(key: KernelKey) -> dict | None:
    """The micro-kernel's 2-D view of this conv, or None when it does not apply."""
    xs, ws = key.in_types[0].shape, key.in_types[1].shape
    if key.in_types[0].dtype is not DType.F32 or len(xs) not in (3, 4):
        return None
    a = dict(key.attrs)
    if len(xs) == 3:
        p = a["pads"]
        return {"in_shape": (xs[0], xs[1], 1, xs[2]), "w_shape": (ws[0], ws[1], 1, ws[2]), "strides": (1, a["strides"][0]),
                    "pads": (0, p[0], 0, p[1]), "dilations": (1, a["dilations"][0]), "group": a["group"]}
    return {"in_shape": tuple(xs), "w_shape": tuple(ws), "strides": tuple(a["strides"]), "pads": tuple(a["pads"]),
                "dilations": tuple(a["dilations"]), "group": a["group"]}


def _pack_conv(key: KernelKey, i: int, arr: np.ndarray, target):
    g = geometry(key)
    if i != 1 or g is None:
        return None
    w = arr.reshape(g["w_shape"])
    return PACKED, pack_conv_weights(w, target, g["in_shape"], g["strides"], g["pads"], g["dilations"], g["group"])


def _scratch(key: KernelKey, target) -> int:
    g = geometry(key)
    if key.packed[1] != PACKED or g is None:
        return 0
    n, c, hh, ww = g["in_shape"]
    oc, _, kh, kw = g["w_shape"]
    residual = key.op == "FusedConv" and residual_index(dict(key.attrs)) is not None
    return conv_scratch_bytes(target, n, c, hh, ww, oc, kh, kw, g["strides"], g["pads"], g["dilations"], g["group"],
                              residual)


def _micro(ctx: KernelContext) -> None:
    g = geometry(ctx.key)
    a = ctx.attrs
    fused = ctx.key.op == "FusedConv"
    bias_i = (2 if a["has_bias"] else None) if fused else (2 if len(ctx.in_types) == 3 else None)
    res_i = residual_index(a) if fused else None
    n, c, hh, ww = g["in_shape"]
    oc, _, kh, kw = g["w_shape"]
    fn = emit_conv2d(ctx.module, f"{ctx.name}_mk", ctx.target, n, c, hh, ww, oc, kh, kw, g["strides"], g["pads"],
                     g["dilations"], g["group"], bias=bias_i is not None, residual=res_i is not None,
                     activation=a["activation"] if fused else "none", act_alpha=a["act_alpha"] if fused else 0.0,
                     act_beta=a["act_beta"] if fused else 0.0, blocks=a.get(BLOCKS))
    fn.linkage = "internal"
    f32p = h.F32.as_pointer()
    null = ir.Constant(f32p, None)
    scratch = ctx.b.bitcast(ctx.scratch, f32p) if _scratch(ctx.key, ctx.target) else null
    args = [ctx.ins[0], ctx.ins[1], ctx.ins[bias_i] if bias_i is not None else null,
            ctx.ins[res_i] if res_i is not None else null, ctx.outs[0], scratch]
    ctx.b.call(fn, args)


def _emit(ctx: KernelContext) -> None:
    if ctx.key.packed[1] == PACKED:
        _micro(ctx)
    else:
        _conv(ctx)


@kernel("Conv", pack=_pack_conv, scratch=_scratch)
def emit_conv(ctx: KernelContext) -> None:
    _emit(ctx)


@kernel("FusedConv", pack=_pack_conv, scratch=_scratch)
def emit_fused_conv(ctx: KernelContext) -> None:
    _emit(ctx)


def tunable_convs(graph) -> dict[tuple, int]:
    """Geometry -> multiply-adds of every conv the packed micro-kernels run (constant f32 weights), as
    ``conv_plan``'s arguments; a batch-bound graph."""
    found: dict[tuple, int] = {}
    for node in graph.nodes:
        if node.op not in ("Conv", "FusedConv") or len(node.inputs) < 2 or node.inputs[1] not in graph.constants:
            continue
        key = KernelKey(node.op, node.attrs, tuple(graph.types[i] for i in node.inputs[:2]), (), (), (), ())
        g = geometry(key)
        if g is None:
            continue
        n, c, hh, ww = g["in_shape"]
        oc, cg, kh, kw = g["w_shape"]
        geom = (n, c, hh, ww, oc, kh, kw, g["strides"], g["pads"], g["dilations"], g["group"])
        oh, ow = (hh + g["pads"][0] + g["pads"][2] - g["dilations"][0] * (kh - 1) - 1) // g["strides"][0] + 1, \
            (ww + g["pads"][1] + g["pads"][3] - g["dilations"][1] * (kw - 1) - 1) // g["strides"][1] + 1
        found[geom] = found.get(geom, 0) + n * oc * oh * ow * cg * kh * kw
    return found
