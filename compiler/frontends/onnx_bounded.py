"""ONNX ops whose result length depends on the data: NonMaxSuppression, NonZero.

The result gets a bounded type (``ir.types.TensorType.bounded``): the op writes into rows sized by
an upper bound known at import, plus the count it selected. The bound comes from a constant input
(``max_output_boxes_per_class``); a model that computes it is unsupported, naming that input.
"""

from __future__ import annotations

import numpy as np

from .onnx_node import NodeCtx, OnnxImportError
from .onnx_ops import translates


@translates(NonMaxSuppression=(10, 11))
def _non_max_suppression(ctx: NodeCtx) -> list:
    """Absent inputs take ONNX's defaults: no boxes kept, IoU threshold 0, no score threshold. A constant IoU
    threshold outside ONNX's range [0, 1] is refused, as ONNX Runtime refuses it when it runs."""
    limit = int(ctx.scalar(2, 0))  # ONNX's reference clamps a negative limit to 0
    cpb = ctx.attr("center_point_box", 0)
    if cpb not in (0, 1):
        raise OnnxImportError(f"node {ctx.name!r} (NonMaxSuppression): center_point_box must be 0 or 1, not {cpb}")
    iou = ctx.x(3) if ctx.has(3) else ctx.constant(np.zeros(1, np.float32), f"{ctx.name}/iou_threshold")
    known = ctx.b.value_of(iou)
    if known is not None and not (known.size == 1 and 0.0 <= float(known.reshape(-1)[0]) <= 1.0):
        raise OnnxImportError(f"node {ctx.name!r} (NonMaxSuppression): iou_threshold must be one value in [0, 1]")
    inputs = [ctx.x(0), ctx.x(1), iou] + ([ctx.x(4)] if ctx.has(4) else [])
    return [ctx.emit("NonMaxSuppression", inputs, center_point_box=cpb, max_output_boxes_per_class=max(limit, 0))]


@translates(NonZero=(9, 13))
def _non_zero(ctx: NodeCtx) -> list:
    """A known X (shape arithmetic in exported models) gives a constant of its exact shape; otherwise
    the op, bounded by X's element count."""
    known = ctx.b.value_of(ctx.x(0))
    if known is not None:
        return [ctx.constant(np.array(np.nonzero(known), dtype=np.int64).reshape(known.ndim, -1), f"{ctx.name}/value")]
    return [ctx.emit("NonZero", [ctx.x(0)])]
