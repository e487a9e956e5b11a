"""Layers that split along their output's rows rather than their weights' output channels.

* An elementwise op of batch one (``elementwise_parts``) splits over its output's axis 1 (channels,
  tokens): each element is computed from its own operands' elements alone, so any ranges give the same
  bits. Each operand is cut the way it broadcasts: one that spans axis 1 is sliced, one of size 1 there
  (a per-token scale, a scalar) is read whole by every part. Its cost model reads the output's
  elements at ``Tuning.elementwise_elements_per_us``.
* A GEMM of several rows by constant weights (``gemm_row_parts``: a transformer's MatMul of [1, T, K]
  tokens by [K, N]; a Gemm of an [M, K] A) splits into ranges of rows: the micro-kernel sums each
  output over K in order in one accumulator, whatever the rows around it, and every part reads the
  same packed weights (the lowering stores them once). Its cost model, and attention's below, reads
  the multiply-adds at ``Tuning.gemm_macs_per_us``.
* A pool of batch one (``pool_parts``), and a Resize that keeps axis 1 (``resize_parts``), splits by
  channels: each plane is pooled or resized alone. Its cost model reads the elements read or written,
  whichever are more, at ``Tuning.pool_elements_per_us``.
* A MatMul of two computed operands with batch axes (``heads_parts``: attention's [1, H, T, d] by
  [1, H, d, T]) splits over axis 1, its heads: each head's product is computed alone. So does a
  softmax or layer norm over later axes (``rowwise_parts``): each of its lines is computed alone.

Ranges over axis 1 are what a following elementwise op, pool or depthwise conv can share (one job for
both); a 2-D GEMM's rows are axis 0 (``Part.axis``), which nothing joins.
"""

from __future__ import annotations

import dataclasses
import math

from ....ir.dtypes import DType
from ....ir.types import TensorType
from ....target import Target
from ..tiles import gemm_tile
from .base import KernelKey
from .parts import Part, cost_model_ranges, covers, even_ranges

LINE_BYTES = 64
"""Parts of an elementwise op start on a cache line where axis 1's rows are shorter than one, so
two threads never write one line."""


def elementwise_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The axis-1 ranges of an elementwise op of batch one, or None when it stays on one thread.
    ``rows``: exactly these ranges (the op joins its producer's job), or None when they do not fit."""
    out_t = key.out_types[0]
    shape = out_t.shape
    if target.threads < 2 or len(key.out_types) != 1 or len(shape) < 2 or shape[0] != 1:
        return None
    inner = math.prod(shape[2:]) * out_t.dtype.itemsize
    unit = 1 if inner >= LINE_BYTES or inner == 0 else -(-LINE_BYTES // inner)
    if rows is None:
        rows = cost_model_ranges(target, shape[1], unit, math.prod(shape), target.tuning.elementwise_elements_per_us)
    elif not covers(rows, shape[1], 1, target.threads):
        return None
    if not rows:
        return None
    return [axis_one_part(key, target, lo, hi) for lo, hi in rows]


ROWWISE = ("Softmax", "LogSoftmax", "LayerNormalization")
"""Ops that compute each line along their ``axis`` (and, a norm, the axes after it) alone."""


def rowwise_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """A softmax or layer norm whose axis comes after axis 1 (attention's scores, a transformer's
    tokens) splits over axis 1 as an elementwise op does: each of its lines lies in one part."""
    rank = len(key.out_types[0].shape)
    if rank < 3 or dict(key.attrs)["axis"] % rank < 2:
        return None
    return elementwise_parts(key, target, rows)


def heads_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The ranges of axis 1 of an f32 MatMul of two computed operands whose output has batch axes
    ([1, H, M, N]), or None when it stays on one thread. ``rows``: as for ``elementwise_parts``."""
    out_t = key.out_types[0]
    shape = out_t.shape
    if target.threads < 2 or out_t.dtype is not DType.F32 or len(shape) < 4 or shape[0] != 1 or "const" in key.packed:
        return None
    if rows is not None:
        found = rows if covers(rows, shape[1], 1, target.threads) else None
    else:
        found = cost_model_ranges(target, shape[1], 1, math.prod(shape) * key.in_types[0].shape[-1],
                                  target.tuning.gemm_macs_per_us)
    return [axis_one_part(key, target, lo, hi, batch_only=True) for lo, hi in found] if found else None


def gemm_row_parts(key: KernelKey, target: Target) -> list[Part] | None:
    """The row ranges of an f32 GEMM of several rows by constant packed weights: a MatMul of A
    [..., M, K] by B [K, N], or a Gemm (FusedGemm) of A [M, K] (no ``transA``), its bias per column or
    per row, its residual shaped as the output; None when it stays on one thread or is another form.
    Each part holds a register tile of rows or more (fewer would each stream all of B for little work); the
    ranges are as even as rows go, each part tiling its own rows: a part's time goes with its rows, not its
    tiles (a 128x384 MatMul on Zen 4, 0.85-0.87 us a row from 26 to 65 rows), so ViT-tiny's 65 tokens split
    33 and 32, where whole 13-row tiles made 39 and 26 (its qkv projection 1.63 -> 1.90x at 2 threads)."""
    a_t, out_t = key.in_types[0], key.out_types[0]
    if target.threads < 2 or a_t.dtype is not DType.F32 or key.packed[1] != "const" or len(key.in_types[1].shape) != 2:
        return None
    if key.op in ("Gemm", "FusedGemm"):
        a = dict(key.attrs)
        has_bias = a.get("has_bias", 1) and len(key.in_types) > 2
        if a["transA"] or (has_bias and key.packed[2] != "const"):  # a computed bias: not the micro-kernel's
            return None
    m, k, n = math.prod(a_t.shape[:-1]), a_t.shape[-1], out_t.shape[-1]
    found = cost_model_ranges(target, m, gemm_tile(target, m, n)[0], m * n * k, target.tuning.gemm_macs_per_us)
    found = even_ranges(m, len(found), 1) if found else None
    if not found or any(hi - lo < 2 for lo, hi in found):  # one row is a GEMV: its weights in another layout
        return None
    rows_axis = 1 if len(out_t.shape) > 2 and out_t.shape[0] == 1 and math.prod(out_t.shape[2:-1]) == 1 else 0
    parts = []
    for lo, hi in found:
        ins, offs, axes = [], [], []
        for i, t in enumerate(key.in_types):
            whole = key.packed[i] == "const" and (i == 1 or len(t.shape) < 2 or t.shape[-2] == 1)
            if whole:  # the weights, a bias per column: every part reads all of it
                ins.append(t)
                offs.append(0)
                axes.append(None)
            elif i == 0 or t.shape[-2:] == (m, n) or (key.packed[i] == "const" and t.shape == (m, 1)):
                width = t.shape[-1]  # A's rows, a residual's or a bias's [M, N] or [M, 1] rows
                ins.append(TensorType(t.dtype, (hi - lo, width)))
                offs.append(lo * width * t.dtype.itemsize)
                axes.append(0 if key.packed[i] == "const" else None)
            else:
                return None
        outs = (TensorType(out_t.dtype, (hi - lo, n)),)
        sub = KernelKey(key.op, key.attrs, tuple(ins), outs, key.alias, key.scalars, key.packed)
        parts.append(Part(sub, target, tuple(offs), lo * n * out_t.dtype.itemsize, (lo, hi), tuple(axes), rows_axis))
    return parts


def axis_one_part(key: KernelKey, target: Target, lo: int, hi: int, batch_only: bool = False) -> Part:
    """The part of ``key`` over ``lo:hi`` of its output's axis 1, each operand cut where it spans that
    axis under broadcasting and read whole where it does not (``batch_only``: a MatMul, whose last two
    axes are its matrices'). Pools split this way too (``pool_parts``)."""
    out_t = key.out_types[0]
    rank = len(out_t.shape)
    ins, offs, axes = [], [], []
    for t, packed in zip(key.in_types, key.packed):
        at = 1 - (rank - len(t.shape))  # axis 1 of the output, in this operand's axes
        spans = 0 <= at < len(t.shape) - (2 if batch_only else 0) and t.shape[at] == out_t.shape[1] != 1
        if spans:
            ins.append(TensorType(t.dtype, t.shape[:at] + (hi - lo,) + t.shape[at + 1:]))
            offs.append(lo * math.prod(t.shape[at + 1:]) * t.dtype.itemsize)
            axes.append(at if packed == "const" else None)
        else:
            ins.append(t)
            offs.append(0)
            axes.append(None)
    outs = (TensorType(out_t.dtype, out_t.shape[:1] + (hi - lo,) + out_t.shape[2:]),)
    sub = KernelKey(key.op, key.attrs, tuple(ins), outs, key.alias, key.scalars, key.packed)
    return Part(sub, target, tuple(offs), lo * math.prod(out_t.shape[2:]) * out_t.dtype.itemsize, (lo, hi), tuple(axes))


def pool_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """The channel ranges of a pool of batch one (MaxPool, AveragePool: any rank), or None when it stays
    on one thread. Each channel's plane is pooled alone, so any ranges give the same bits (the cost model:
    the module's docstring). ``rows``: as for ``split.conv_parts``
    (a pool right after a split conv runs in its job, part by part: no handoff of its own)."""
    x_t = key.in_types[0]
    if target.threads < 2 or len(key.in_types) != 1 or len(key.out_types) != 1 or len(x_t.shape) < 3 or x_t.shape[0] != 1:
        return None
    c = x_t.shape[1]
    if rows is None:  # elements read, or written where more (a Resize growing its planes)
        work = max(math.prod(x_t.shape), math.prod(key.out_types[0].shape))
        rows = cost_model_ranges(target, c, 1, work, target.tuning.pool_elements_per_us)
    elif not covers(rows, c, 1, target.threads):
        return None
    if not rows:
        return None
    return [axis_one_part(key, target, lo, hi) for lo, hi in rows]


def resize_parts(key: KernelKey, target: Target, rows: list[tuple[int, int]] | None = None) -> list[Part] | None:
    """A Resize keeping axis 1 splits by channels as a pool does, each plane resized alone; its parts' size of
    axis 1 is -1 (their own), where the torch frontend gives the whole layer's."""
    a, c = dict(key.attrs), key.in_types[0].shape[1]
    if a["sizes"][1] not in (-1, c) or a["scales"][1] != 1.0 or a["coordinate_transformation_mode"] == "tf_crop_and_resize":
        return None
    a["sizes"] = (a["sizes"][0], -1, *a["sizes"][2:])
    return pool_parts(dataclasses.replace(key, attrs=tuple(sorted(a.items()))), target, rows)
