"""Op family: bounded results — NonMaxSuppression and NonZero, whose length depends on the data.

Each result has a bounded type (``ir.types.TensorType.bounded_axis``): NonMaxSuppression's at most
``batches * classes * min(max_output_boxes_per_class, boxes)`` rows of (batch, class, box), the
limit an attribute (ONNX's constant input); NonZero's at most one column per element of X. The
kernel writes the valid length after the elements. Neither folds: a constant's type is exact.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .registry import AttrKind, AttrSpec, OpDef, register, require

I = AttrKind.INT


def nms_rows(boxes: TensorType, scores: TensorType, a) -> int:
    """The bound: every class of every batch keeps at most min(max_output_boxes_per_class, boxes)."""
    return boxes.shape[0] * scores.shape[1] * min(a["max_output_boxes_per_class"], boxes.shape[1])


def _nms_infer(ts, a):
    boxes, scores = ts[0], ts[1]
    require(boxes.dtype is DType.F32 and scores.dtype is DType.F32,
            f"NonMaxSuppression: boxes {boxes} and scores {scores} must be f32")
    require(boxes.rank == 3 and boxes.shape[2] == 4, f"NonMaxSuppression: boxes {boxes} must be [batches, boxes, 4]")
    require(scores.rank == 3 and scores.shape[0] == boxes.shape[0] and scores.shape[2] == boxes.shape[1],
            f"NonMaxSuppression: scores {scores} must be [batches, classes, boxes] for boxes {boxes}")
    for t in ts[2:]:
        require(t.dtype is DType.F32 and t.rank <= 1 and math.prod(t.shape) == 1,
                f"NonMaxSuppression: a threshold must be one f32, got {t}")
    require(a["center_point_box"] in (0, 1), f"NonMaxSuppression: center_point_box must be 0 or 1")
    require(a["max_output_boxes_per_class"] >= 0, "NonMaxSuppression: max_output_boxes_per_class must be >= 0")
    return [TensorType(DType.I64, (nms_rows(boxes, scores, a), 3), bounded_axis=0)]


def corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(x_min, x_max, y_min, y_max) of each box, in f32, as ONNX's reference computes them."""
    if center_point_box:
        xc, yc, w, h = (boxes[..., k] for k in range(4))
        half_w, half_h = w / np.float32(2), h / np.float32(2)
        return xc - half_w, xc + half_w, yc - half_h, yc + half_h
    y1, x1, y2, x2 = (boxes[..., k] for k in range(4))
    x_ge, y_ge = x1 >= x2, y1 >= y2  # ONNX's max_min, also for NaN
    return np.where(x_ge, x2, x1), np.where(x_ge, x1, x2), np.where(y_ge, y2, y1), np.where(y_ge, y1, y2)


def suppresses(box: np.ndarray, kept: np.ndarray, center_point_box: int, iou_threshold: np.float32) -> np.ndarray:
    """Whether each of ``kept`` suppresses ``box``: IoU > threshold, in ONNX's f32 steps (a box of
    no area, no overlap or a NaN coordinate suppresses nothing)."""
    ax0, ax1, ay0, ay1 = corners(box, center_point_box)
    bx0, bx1, by0, by1 = corners(kept, center_point_box)
    ix0, ix1 = np.where(bx0 > ax0, bx0, ax0), np.where(bx1 < ax1, bx1, ax1)  # Python's max, min
    iy0, iy1 = np.where(by0 > ay0, by0, ay0), np.where(by1 < ay1, by1, ay1)
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    ok = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area_a > 0) & (area_b > 0) & (union > 0)
    return ok & (inter / np.where(ok, union, np.float32(1)) > iou_threshold)


def order(scores: np.ndarray, score_threshold: np.float32 | None) -> np.ndarray:
    """The candidates of one class, best first: score descending, then box index ascending (ONNX's
    reference); scores not above the threshold, and NaN scores, are not candidates."""
    keep = scores > score_threshold if score_threshold is not None else ~np.isnan(scores)
    idx = np.flatnonzero(keep)
    return idx[np.lexsort((idx, -scores[idx]))]


def _nms(xs, a):
    boxes, scores = xs[0], xs[1]
    iou = np.float32(xs[2].reshape(-1)[0])
    score_threshold = np.float32(xs[3].reshape(-1)[0]) if len(xs) > 3 else None
    limit, cpb = a["max_output_boxes_per_class"], a["center_point_box"]
    rows = []
    with np.errstate(all="ignore"):
        for n in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                kept: list[int] = []
                for i in order(scores[n, c], score_threshold):
                    if len(kept) == limit:
                        break
                    if not suppresses(boxes[n, i], boxes[n, kept], cpb, iou).any():
                        kept.append(int(i))
                rows += [(n, c, i) for i in kept]
    return [np.array(rows, dtype=np.int64).reshape(-1, 3)]


def _nms_flops(a, ins, outs):
    n = ins[0].shape[1]
    return ins[1].shape[0] * ins[1].shape[1] * n * (n + min(a["max_output_boxes_per_class"], n))


def _non_zero_infer(ts, a):
    require(ts[0].rank >= 1, f"NonZero: X {ts[0]} needs rank >= 1")
    return [TensorType(DType.I64, (ts[0].rank, math.prod(ts[0].shape)), bounded_axis=1)]


def _non_zero(xs, a):
    return [np.array(np.nonzero(xs[0]), dtype=np.int64).reshape(xs[0].ndim, -1)]


register(
    OpDef("NonZero", _non_zero_infer, _non_zero, foldable=False,
          doc="X -> i64[rank, <=numel]: the coordinates of X's nonzero elements (NaN is nonzero), row-major order"),
    OpDef("NonMaxSuppression", _nms_infer, _nms, min_inputs=3, max_inputs=4,
          attrs={"center_point_box": AttrSpec(I, 0), "max_output_boxes_per_class": AttrSpec(I)},
          flops=_nms_flops, foldable=False, float_only=True,
          doc="(boxes, scores, iou_threshold[, score_threshold]) -> i64[<=bound,3] (batch, class, box) rows "
              "selected greedily per batch and class; the bound is an attribute"),
)
