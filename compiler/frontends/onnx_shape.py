"""ONNX shape ops (Reshape, Expand, Transpose, Squeeze/Unsqueeze, Slice, Split, DepthToSpace and
SpaceToDepth) and the values known at import time (Constant, ConstantOfShape, Shape, Size): their
translators, registered in :data:`~cuvil.compiler.frontends.onnx_ops.TABLE` like every other. Most of
these carry ints that ONNX moved from an attribute to a constant input at some opset (:func:`_ints`).
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.types import Batch
from ..passes.fold_constants import swells
from .builder import Unsupported
from .onnx_node import NodeCtx, Probe, tensor_value
from .onnx_ops import check_size, translates


# --- shape ops -----------------------------------------------------------------------------------


def _ints(ctx: NodeCtx, i: int, attr: str, from_opset: int, default: list[int] | None = None) -> list[int] | None:
    """An int list that moved from an attribute to an input at ``from_opset``."""
    if ctx.opset >= from_opset:
        return [int(v) for v in ctx.const(i).reshape(-1)] if ctx.has(i) else default
    value = ctx.attr(attr, default)
    return None if value is None else list(value)


@translates(Reshape=(5, 13, 14, 19, 21, 23, 24, 25))
def _reshape(ctx: NodeCtx) -> list:
    dims, t = ctx.dims(1), ctx.type(0)
    if ctx.attr("allowzero", 0) and 0 in dims:
        raise Unsupported("allowzero=1 with a 0 in the shape")
    return [ctx.emit("Reshape", [ctx.x(0)], shape=ctx.reshape_attr(dims, t, zero_copies=True))]


@translates(Expand=(8, 13))
def _expand(ctx: NodeCtx) -> list:
    dims, t = ctx.dims(1), ctx.type(0)
    shape = []
    for i, d in enumerate(dims):  # right-aligned: a 1 keeps the input's (batch) dimension
        j = i - len(dims) + t.rank
        if isinstance(d, Batch):
            if j < 0 or t.shape[j] != d:
                ctx.batch_dependent("Expand to a batch-sized shape")
            d = 1
        shape.append(d)
    check_size(ctx, shape)
    return [ctx.emit("Expand", [ctx.x(0)], shape=shape)]


@translates(Transpose=(1, 13, 21, 23, 24, 25))
def _transpose(ctx: NodeCtx) -> list:
    perm = ctx.attr("perm", list(reversed(range(ctx.type(0).rank))))
    return [ctx.emit("Transpose", [ctx.x(0)], perm=perm)]


@translates(Squeeze=(1, 11, 13, 21, 23, 24, 25))
def _squeeze(ctx: NodeCtx) -> list:
    t = ctx.type(0)
    axes = _ints(ctx, 1, "axes", 13)
    if not axes:
        axes = [i for i, d in enumerate(t.shape) if d == 1]
    if not axes:
        return [ctx.emit("Identity", [ctx.x(0)])]
    return [ctx.emit("Squeeze", [ctx.x(0)], axes=axes)]


@translates(Unsqueeze=(1, 11, 13, 21, 23, 24, 25))
def _unsqueeze(ctx: NodeCtx) -> list:
    return [ctx.emit("Unsqueeze", [ctx.x(0)], axes=_ints(ctx, 1, "axes", 13))]


@translates(Slice=(1, 10, 11, 13))
def _slice(ctx: NodeCtx) -> list:
    if ctx.opset < 10:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(ctx, 1, "", 10), _ints(ctx, 2, "", 10)
        axes = _ints(ctx, 3, "", 10, list(range(len(starts))))
        steps = _ints(ctx, 4, "", 10, [1] * len(starts))
    return [ctx.emit("Slice", [ctx.x(0)], starts=starts, ends=ends, axes=axes, steps=steps)]


@translates(Split=(2, 11, 13, 18))
def _split(ctx: NodeCtx) -> list:
    t, n = ctx.type(0), len(ctx.outputs)
    axis = ctx.attr("axis", 0)
    sizes = _ints(ctx, 1, "split", 13)
    if not sizes:
        dim = t.shape[axis]
        if isinstance(dim, Batch):
            ctx.batch_dependent("Split along the batch dimension")
        parts = ctx.attr("num_outputs", n)
        chunk = math.ceil(dim / parts) if ctx.attr("num_outputs", 0) else dim // parts
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    return ctx.emit_many("Split", [ctx.x(0)], len(sizes), axis=axis, split=sizes)


@translates(DepthToSpace=(1, 11, 13, 28), SpaceToDepth=(1, 13, 28))
def _depth_space(ctx: NodeCtx) -> list:
    """The spec's own definition: a Reshape to rank 6, a Transpose, a Reshape back (ESPCN's pixel
    shuffle, YOLO's reorg). DCR (the default) and CRD order the channels' blocks differently."""
    t, b = ctx.type(0), int(ctx.attr("blocksize"))
    if t.rank != 4 or b < 1:
        raise Unsupported(f"{ctx.op} needs a rank-4 input and blocksize >= 1, got rank {t.rank}, blocksize {b}")
    _, c, h, w = t.shape
    if not all(isinstance(d, int) for d in (c, h, w)):
        ctx.batch_dependent(f"{ctx.op} over a batch-sized C, H or W")
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise Unsupported(f"{ctx.op}: mode must be DCR or CRD, got {mode!r}")
    crd = mode == "CRD"
    if ctx.op == "SpaceToDepth":  # mode since opset 28
        if h % b or w % b:
            raise Unsupported(f"SpaceToDepth: blocksize {b} must divide H={h} and W={w}")
        split, out = [0, c, h // b, b, w // b, b], [0, c * b * b, h // b, w // b]
        perm = [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4]
    else:
        if c % (b * b):
            raise Unsupported(f"DepthToSpace: blocksize^2 = {b * b} must divide C={c}")
        split = [0, c // (b * b), b, b, h, w] if crd else [0, b, b, c // (b * b), h, w]
        perm = [0, 1, 4, 2, 5, 3] if crd else [0, 3, 4, 1, 5, 2]
        out = [0, c // (b * b), h * b, w * b]
    x = ctx.tmp("Reshape", [ctx.x(0)], "blocks", shape=split)
    x = ctx.tmp("Transpose", [x], "moved", perm=perm)
    return [ctx.emit("Reshape", [x], shape=out)]


# --- values known at import time: constants, shapes --------------------------------------------


@translates(Constant=(9, 11, 12, 13, 19, 21, 23, 24, 25))
def _constant(ctx: NodeCtx) -> list:
    attrs = ctx.raw_attrs()
    if "value" in attrs:
        value = tensor_value(attrs["value"])
    elif "value_float" in attrs or "value_floats" in attrs:
        value = np.asarray(attrs.get("value_float", attrs.get("value_floats")), np.float32)
    elif "value_int" in attrs or "value_ints" in attrs:
        value = np.asarray(attrs.get("value_int", attrs.get("value_ints")), np.int64)
    else:
        raise Unsupported(f"{'/'.join(sorted(attrs)) or 'no'} value")
    return [ctx.constant(value, ctx.outputs[0])]


@translates(ConstantOfShape=(9, 20, 21, 23, 24, 25))
def _constant_of_shape(ctx: NodeCtx) -> list:
    fill = ctx.raw_attrs().get("value")
    fill = tensor_value(fill).reshape(-1)[0] if fill is not None else np.float32(0)
    shape = [int(d) for d in ctx.const(0).reshape(-1)]
    check_size(ctx, shape)
    if swells(math.prod(shape) * fill.dtype.itemsize, fill.dtype.itemsize):  # a fill at run time, not stored
        return [ctx.emit("Expand", [ctx.constant(np.array([fill], dtype=fill.dtype), f"{ctx.outputs[0]}_fill")], shape=shape)]
    return [ctx.constant(np.full(shape, fill, dtype=fill.dtype), ctx.outputs[0])]


@translates(Shape=(1, 13, 15, 19, 21, 23, 24, 25), Size=(1, 13, 19, 21, 23, 24, 25))
def _shape(ctx: NodeCtx) -> list:
    """A constant when static; with the batch symbol, a Probe for the shape arithmetic that follows."""
    t = ctx.type(0)
    start, end = ctx.attr("start", 0), ctx.attr("end", t.rank)

    def at(batch: int) -> np.ndarray:
        shape = np.array(t.bind(batch).shape, np.int64)
        return np.array(shape.prod(), np.int64) if ctx.op == "Size" else shape[start:end]

    if t.is_static:
        return [ctx.constant(at(1), ctx.outputs[0])]
    return [Probe(tuple(at(p) for p in ctx.probe_sizes))]
