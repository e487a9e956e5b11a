"""ONNX MaxPool, AveragePool and LpPool.

MaxPool's Indices output is an ArgMax over each window's elements gathered by a constant table (the
padding masked to the lowest value). A dilated AveragePool and every LpPool are a window sum: a
depthwise Conv with a kernel of ones (zeros in the padding, extra end padding for ceil_mode's
overhang) over X (LpPool: |X|^p), then divided by the constant count of counted elements per window
(LpPool: the p-th root). The window's geometry is MaxPool's, so the output shape rule is the op
table's.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.infer import infer_op
from ..ops import get_op
from .builder import Unsupported
from .onnx_node import NodeCtx
from .onnx_ops import check_size, translates, window


def _geometry(ctx: NodeCtx) -> dict:
    kernel = list(ctx.attr("kernel_shape"))
    dilations = list(ctx.attr("dilations", [1] * len(kernel)))
    strides, pads = window(ctx, kernel, dilations)
    return dict(kernel_shape=kernel, strides=strides, pads=pads, dilations=dilations, ceil_mode=ctx.attr("ceil_mode", 0))


def _window_sum(ctx: NodeCtx, x: str, g: dict) -> tuple[str, tuple[int, ...]]:
    """(sum over each window of ``x``, the output's spatial shape)."""
    t = ctx.type(0)
    if not all(isinstance(d, int) for d in t.shape[1:]):
        ctx.batch_dependent(f"{ctx.op}'s channels and spatial dims")
    out = infer_op("MaxPool", [t], get_op("MaxPool").normalize_attrs(g))[0].shape[2:]
    nd, spatial, c = len(out), t.shape[2:], t.shape[1]
    k, s, p, d = g["kernel_shape"], g["strides"], g["pads"], g["dilations"]
    overhang = [max(0, (o - 1) * si + (ki - 1) * di + 1 - (n + p[i] + p[nd + i]))
                for i, (o, si, ki, di, n) in enumerate(zip(out, s, k, d, spatial))]
    check_size(ctx, [c, *k])
    ones = ctx.constant(np.ones((c, 1, *k), t.dtype.numpy), f"{ctx.name}/ones")
    total = ctx.tmp("Conv", [x, ones], "sum", strides=s, dilations=d, group=c,
                    pads=list(p[:nd]) + [e + q for e, q in zip(overhang, p[nd:])])
    return total, out


def _counts(g: dict, spatial, out, include_pad: int) -> np.ndarray:
    """Elements of each window inside the input (include_pad: inside the input and its pads)."""
    nd, k, s, p, d = len(out), g["kernel_shape"], g["strides"], g["pads"], g["dilations"]
    count = np.ones(())
    for i, n in enumerate(spatial):
        lo, hi = (-p[i], n + p[nd + i]) if include_pad else (0, n)
        taps = np.arange(out[i])[:, None] * s[i] - p[i] + np.arange(k[i])[None, :] * d[i]
        count = np.multiply.outer(count, ((taps >= lo) & (taps < hi)).sum(axis=1))
    return count


@translates(AveragePool=(7, 10, 11, 19, 22))
def _average_pool(ctx: NodeCtx) -> list:
    g = _geometry(ctx)
    include_pad = ctx.attr("count_include_pad", 0)
    if all(d == 1 for d in g["dilations"]):
        del g["dilations"]
        return [ctx.emit("AveragePool", [ctx.x(0)], count_include_pad=include_pad, **g)]
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise Unsupported(f"AveragePool of {t.dtype.value}")
    total, out = _window_sum(ctx, ctx.x(0), g)
    count = _counts(g, t.shape[2:], out, include_pad).astype(t.dtype.numpy)
    return [ctx.emit("Div", [total, ctx.constant(count.reshape((1, 1, *out)), f"{ctx.name}/count")])]


@translates(LpPool=(2, 11, 18, 22))
def _lp_pool(ctx: NodeCtx) -> list:
    t, p = ctx.type(0), ctx.attr("p", 2)
    if not t.dtype.is_float or p < 1:
        raise Unsupported(f"LpPool of {t.dtype.value} with p={p}")
    g = _geometry(ctx)
    scalar = lambda v, hint: ctx.constant(np.array(v, t.dtype.numpy), f"{ctx.name}/{hint}")  # noqa: E731
    x = ctx.tmp("Abs", [ctx.x(0)], "abs")
    if p == 2:
        x = ctx.tmp("Mul", [x, x], "square")
    elif p != 1:
        x = ctx.tmp("Pow", [x, scalar(float(p), "p")], "pow")
    total, _ = _window_sum(ctx, x, g)
    if p == 1:
        return [ctx.emit("Identity", [total])]
    if p == 2:
        return [ctx.emit("Sqrt", [total])]
    return [ctx.emit("Pow", [total, scalar(1.0 / p, "root")])]


@translates(MaxPool=(8, 10, 11, 12, 22))
def _max_pool(ctx: NodeCtx) -> list:
    g = _geometry(ctx)
    y = ctx.emit("MaxPool", [ctx.x(0)], **g)
    if len(ctx.outputs) < 2 or not ctx.outputs[1]:
        return [y]
    return [y, _max_indices(ctx, g, ctx.attr("storage_order", 0))]


def _max_indices(ctx: NodeCtx, g: dict, column_major: int) -> str:
    """The flat index in X (row-major, or column-major within each plane) of each window's first
    largest element, padding excluded."""
    t = ctx.type(0)
    if not all(isinstance(d, int) for d in t.shape):
        ctx.batch_dependent("MaxPool's Indices")
    out = infer_op("MaxPool", [t], get_op("MaxPool").normalize_attrs(g))[0].shape[2:]
    spatial, nd = t.shape[2:], len(out)
    k, s, p, d = g["kernel_shape"], g["strides"], g["pads"], g["dilations"]
    check_size(ctx, [math.prod(out), math.prod(k), *t.shape[:2]])
    grids = np.meshgrid(*(np.arange(o) for o in out), *(np.arange(kk) for kk in k), indexing="ij")
    coords = [grids[i] * s[i] - p[i] + grids[nd + i] * d[i] for i in range(nd)]
    inside = np.logical_and.reduce([(c >= 0) & (c < n) for c, n in zip(coords, spatial)]).reshape(math.prod(out), -1)
    coords = [np.clip(c, 0, n - 1) for c, n in zip(coords, spatial)]
    order = reversed(range(nd)) if not column_major else range(nd)
    read, place, unit = 0, 0, 1
    for i in reversed(range(nd)):
        read = read + coords[i] * math.prod(spatial[i + 1:])
    for i in order:
        place, unit = place + coords[i] * unit, unit * spatial[i]
    read, place = read.reshape(math.prod(out), -1), place.reshape(math.prod(out), -1)
    n, c = t.shape[:2]
    flat = ctx.tmp("Reshape", [ctx.x(0)], "flat", shape=[n, c, math.prod(spatial)])
    taps = ctx.tmp("Gather", [flat, ctx.constant(read.astype(np.int64), f"{ctx.name}/read")], "taps", axis=2)
    lowest = np.array(-np.inf if t.dtype.is_float else np.iinfo(t.dtype.numpy).min, t.dtype.numpy)
    taps = ctx.tmp("Where", [ctx.constant(inside, f"{ctx.name}/inside"), taps, ctx.constant(lowest, f"{ctx.name}/low")],
                   "masked")
    best = ctx.tmp("ArgMax", [taps], "best", axis=3, keepdims=1, select_last_index=0)
    table = ctx.tmp("Expand", [ctx.constant(place.astype(np.int64)[None, None], f"{ctx.name}/place")], "table",
                    shape=[n, c, *place.shape])
    at = ctx.tmp("GatherElements", [table, best], "at", axis=3)
    planes = (np.arange(n * c, dtype=np.int64) * math.prod(spatial)).reshape(n, c, 1, 1)
    at = ctx.tmp("Add", [at, ctx.constant(planes, f"{ctx.name}/planes")], "flat_at")
    named = ctx.outputs[1]
    return ctx.b.add("Reshape", [at], name=ctx.name, output_names=[named], shape=[n, c, *out])[0]
