"""ONNX translators of ConvTranspose, Resize, Upsample, Tile, GridSample, Col2Im, EyeLike and Pad: every
size, scale and pad resolved to static attributes."""

from __future__ import annotations

import math

import numpy as np

from ..ir.types import Batch
from .builder import Unsupported
from .onnx_node import NodeCtx, OnnxImportError, onnx_dtype
from .onnx_ops import check_size, translates


@translates(ConvTranspose=(1, 11, 22))
def _conv_transpose(ctx: NodeCtx) -> list:
    """auto_pad and output_shape become explicit pads (ONNX's rule: the odd pad goes to the end for
    SAME_UPPER, to the start otherwise); an output larger than the full result adds output_padding."""
    x, w = ctx.type(0), ctx.type(1)
    nd = x.rank - 2
    spatial = x.shape[2:]
    if any(isinstance(d, Batch) for d in spatial):
        ctx.batch_dependent("a spatial size")
    kernel = list(w.shape[2:])
    if list(ctx.attr("kernel_shape", kernel)) != kernel:
        raise Unsupported("kernel_shape other than W's")
    strides = list(ctx.attr("strides", [1] * nd))
    dil = list(ctx.attr("dilations", [1] * nd))
    extra = list(ctx.attr("output_padding", [0] * nd))
    mode, shape = ctx.attr("auto_pad", "NOTSET"), ctx.attr("output_shape", None)
    if mode not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise OnnxImportError(f"node {ctx.name!r}: unknown auto_pad {mode!r}")
    if len(strides) != nd or len(dil) != nd or len(extra) != nd:
        raise OnnxImportError(f"node {ctx.name!r}: strides, dilations and output_padding need {nd} values each")
    full = [s * (n - 1) + e + (k - 1) * d + 1 for n, k, s, d, e in zip(spatial, kernel, strides, dil, extra)]
    if shape is None and mode in ("SAME_UPPER", "SAME_LOWER"):
        shape = [n * s for n, s in zip(spatial, strides)]
    if shape is None:
        pads = [0] * 2 * nd if mode == "VALID" else list(ctx.attr("pads", [0] * 2 * nd))
    else:
        total = [f - o for f, o in zip(full, list(shape)[-nd:])]
        begins = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total]
        ends = [t - b for t, b in zip(total, begins)]
        if any(b < 0 for b in begins):
            raise Unsupported(f"output_shape {list(shape)} larger than the convolution reaches")
        extra = [e - min(end, 0) for e, end in zip(extra, ends)]
        pads = begins + [max(end, 0) for end in ends]
    return [ctx.emit("ConvTranspose", ctx.xs(), strides=strides, dilations=dil, pads=pads, output_padding=extra,
                     group=ctx.attr("group", 1))]


def _optional(ctx: NodeCtx, i: int):
    if not ctx.has(i):
        return None
    value = ctx.const(i).reshape(-1)
    return value if value.size else None


@translates(Resize=(11, 13, 18, 19))
def _resize(ctx: NodeCtx) -> list:
    t = ctx.type(0)
    rank = t.rank
    axes = [int(a) % rank for a in ctx.attr("axes", range(rank))]
    roi, scales, sizes = _optional(ctx, 1), _optional(ctx, 2), _optional(ctx, 3)
    if (scales is None) == (sizes is None):
        raise OnnxImportError(f"node {ctx.name!r} (Resize): give exactly one of scales and sizes")
    if any(isinstance(t.shape[a], Batch) for a in axes) and (
            sizes is not None or any(float(scales[i]) != 1.0 for i, a in enumerate(axes) if isinstance(t.shape[a], Batch))):
        ctx.batch_dependent("resizing the batch dimension")
    full_scales, full_sizes = [1.0] * rank, [-1] * rank
    if scales is not None:
        for i, a in enumerate(axes):
            full_scales[a] = float(scales[i])
            if float(scales[i]) != 1.0:
                full_sizes[a] = math.floor(float(scales[i]) * t.shape[a])
    else:
        ratios = {a: int(sizes[i]) / t.shape[a] for i, a in enumerate(axes)}
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise OnnxImportError(f"node {ctx.name!r}: unknown keep_aspect_ratio_policy {policy!r}")
        if policy != "stretch":
            common = (min if policy == "not_larger" else max)(ratios.values())
            ratios = {a: common for a in ratios}
            sizes = [int(common * t.shape[a] + 0.5) for a in axes]
        for i, a in enumerate(axes):
            full_scales[a], full_sizes[a] = ratios[a], int(sizes[i])
    full_roi = ()
    if roi is not None and ctx.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        lo, hi = [0.0] * rank, [1.0] * rank
        for i, a in enumerate(axes):
            lo[a], hi[a] = float(roi[i]), float(roi[len(axes) + i])
        full_roi = tuple(lo + hi)
    if any(s < 0 for s in full_sizes if s != -1) or any(not math.isfinite(s) or s <= 0 for s in full_scales):
        raise OnnxImportError(f"node {ctx.name!r} (Resize): scales {full_scales} and sizes {full_sizes} must be positive")
    return [ctx.emit("Resize", [ctx.x(0)], sizes=full_sizes, scales=full_scales, roi=full_roi,
                     mode=ctx.attr("mode", "nearest"),
                     coordinate_transformation_mode=ctx.attr("coordinate_transformation_mode", "half_pixel"),
                     nearest_mode=ctx.attr("nearest_mode", "round_prefer_floor"),
                     cubic_coeff_a=ctx.attr("cubic_coeff_a", -0.75), exclude_outside=ctx.attr("exclude_outside", 0),
                     extrapolation_value=ctx.attr("extrapolation_value", 0.0), antialias=ctx.attr("antialias", 0))]


@translates(Upsample=(7, 9, 10))
def _upsample(ctx: NodeCtx) -> list:
    """Resize's forerunner: output i reads input i / scale (asymmetric), nearest rounding down."""
    t = ctx.type(0)
    scales = [float(v) for v in (ctx.attr("scales") if ctx.opset < 9 else ctx.const(1).reshape(-1))]
    if len(scales) != t.rank or any(not math.isfinite(s) or s < 1 for s in scales):
        raise OnnxImportError(f"node {ctx.name!r} (Upsample): scales {scales} must be >= 1, one per dimension")
    if any(isinstance(d, Batch) and s != 1.0 for d, s in zip(t.shape, scales)):
        ctx.batch_dependent("upsampling the batch dimension")
    sizes = [-1 if s == 1.0 else math.floor(s * d) for s, d in zip(scales, t.shape)]
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise Unsupported(f"mode={mode}")
    return [ctx.emit("Resize", [ctx.x(0)], sizes=sizes, scales=scales, mode=mode,
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")]


@translates(Tile=(6, 13))
def _tile(ctx: NodeCtx) -> list:
    """x viewed as (1, d0, 1, d1, ...), expanded to (r0, d0, r1, d1, ...), merged to (r0 d0, r1 d1, ...)."""
    t = ctx.type(0)
    repeats = [int(r) for r in ctx.const(1).reshape(-1)]
    if len(repeats) != t.rank or any(r < 0 for r in repeats):
        raise OnnxImportError(f"node {ctx.name!r} (Tile): repeats {repeats} must be {t.rank} values >= 0")
    if not t.is_static:
        ctx.batch_dependent("tiling a batch-sized tensor")
    dims = list(t.shape)
    shape = [r * d for r, d in zip(repeats, dims)]
    check_size(ctx, shape)
    if 0 in shape:  # nothing to tile (Reshape would read a 0 as "keep this dimension")
        return [ctx.constant(np.zeros(shape, t.dtype.numpy), ctx.outputs[0])]
    spread = ctx.tmp("Reshape", [ctx.x(0)], "spread", shape=[v for d in dims for v in (1, d)])
    wide = ctx.tmp("Expand", [spread], "wide", shape=[v for r, d in zip(repeats, dims) for v in (r, d)])
    return [ctx.emit("Reshape", [wide], shape=shape)]


@translates(GridSample=(16, 20, 22))
def _grid_sample(ctx: NodeCtx) -> list:
    """Version 16's mode names (bilinear, bicubic) are version 20's linear and cubic."""
    mode = ctx.attr("mode", "bilinear" if ctx.opset < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return [ctx.emit("GridSample", ctx.xs(), mode=mode, padding_mode=ctx.attr("padding_mode", "zeros"),
                     align_corners=ctx.attr("align_corners", 0))]


@translates(Col2Im=(18,))
def _col2im(ctx: NodeCtx) -> list:
    """A ConvTranspose: column c * K + t of each block adds at tap t of channel c, so the weight is
    one-hot per group of K = prod(block) columns; output_padding fills the image's remainder."""
    t = ctx.type(0)
    image, block = [int(v) for v in ctx.const(1).reshape(-1)], [int(v) for v in ctx.const(2).reshape(-1)]
    nd = len(image)
    strides = list(ctx.attr("strides", [1] * nd))
    dil, pads = list(ctx.attr("dilations", [1] * nd)), list(ctx.attr("pads", [0] * 2 * nd))
    k = math.prod(block)
    if t.rank != 3 or not isinstance(t.shape[1], int) or not isinstance(t.shape[2], int) or len(block) != nd \
            or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd or min(block + strides + dil, default=1) < 1 \
            or k == 0 or t.shape[1] % k:
        raise OnnxImportError(f"node {ctx.name!r} (Col2Im): input {t}, image_shape {image} and block_shape {block} "
                              "do not agree with the strides, dilations and pads")
    grid = [(n + pb + pe - d * (b - 1) - 1) // s + 1 for n, b, s, d, pb, pe in zip(image, block, strides, dil, pads, pads[nd:])]
    extra = [n + pb + pe - (s * (g - 1) + (b - 1) * d + 1) for n, b, s, d, g, pb, pe in
             zip(image, block, strides, dil, grid, pads, pads[nd:])]
    if min(grid, default=1) < 1 or math.prod(grid) != t.shape[2] or min(extra, default=0) < 0:
        raise OnnxImportError(f"node {ctx.name!r} (Col2Im): {t.shape[2]} blocks, but the image holds {grid}")
    c = t.shape[1] // k
    check_size(ctx, [c * k, k])
    w = np.tile(np.eye(k, dtype=t.dtype.numpy), (c, 1)).reshape(c * k, 1, *block)
    x = ctx.tmp("Reshape", [ctx.x(0)], "blocks", shape=[0 if isinstance(t.shape[0], Batch) else t.shape[0], c * k, *grid])
    return [ctx.emit("ConvTranspose", [x, ctx.constant(w, f"{ctx.name}/taps")], strides=strides, dilations=dil,
                     pads=pads, output_padding=extra, group=c)]


@translates(EyeLike=(9, 22))
def _eye_like(ctx: NodeCtx) -> list:
    """A constant: only the input's shape matters."""
    t = ctx.type(0)
    if t.rank != 2 or not all(isinstance(d, int) for d in t.shape):
        raise OnnxImportError(f"node {ctx.name!r} (EyeLike): input {t} must be 2-D and static")
    dtype = onnx_dtype(ctx.attr("dtype")) if ctx.attr("dtype", None) is not None else t.dtype
    check_size(ctx, list(t.shape))
    return [ctx.emit("Identity", [ctx.constant(np.eye(*t.shape, k=ctx.attr("k", 0), dtype=dtype.numpy), ctx.name)])]


@translates(Pad=(2, 11, 13, 18, 19, 21, 23, 24, 25))
def _pad(ctx: NodeCtx) -> list:
    mode, rank = ctx.attr("mode", "constant"), ctx.type(0).rank
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise Unsupported(f"mode={mode}")
    if ctx.opset < 11:
        pads, value = list(ctx.attr("pads")), ctx.attr("value", 0.0)
    else:
        pads = [int(v) for v in ctx.const(1).reshape(-1)]
        value = ctx.scalar(2, 0.0)
        if ctx.has(3):  # opset 18: pads only for the listed axes
            axes = [int(a) % rank for a in ctx.const(3).reshape(-1)]
            full = [0] * 2 * rank
            for j, ax in enumerate(axes):
                full[ax], full[ax + rank] = pads[j], pads[j + len(axes)]
            pads = full
    if mode == "wrap":
        return [_wrap(ctx, pads)]
    return [ctx.emit("Pad", [ctx.x(0)], pads=pads, mode=mode, value=value)]


def _wrap(ctx: NodeCtx, pads: list[int]) -> str:
    """Wrap padding: along each padded axis, its last ``begin`` elements, itself, its first ``end``."""
    t, x = ctx.type(0), ctx.x(0)
    rank = t.rank
    for axis, (lo, hi) in enumerate(zip(pads[:rank], pads[rank:])):
        n = t.shape[axis]
        if not lo and not hi:
            continue
        if not isinstance(n, int) or not 0 <= lo <= n or not 0 <= hi <= n:
            raise Unsupported("mode=wrap with pads beyond the axis, negative, or along the batch")
        part = lambda start, end, tag: ctx.tmp("Slice", [x], f"{tag}{axis}", starts=[start], ends=[end],  # noqa: E731
                                               axes=[axis], steps=[1])
        parts = ([part(n - lo, n, "head")] if lo else []) + [x] + ([part(0, hi, "tail")] if hi else [])
        x = ctx.tmp("Concat", parts, f"wrap{axis}", axis=axis)
    return ctx.emit("Identity", [x])
