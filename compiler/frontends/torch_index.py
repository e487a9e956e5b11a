"""ATen → Cuvil translators for indexing, selection and windows: ``x[idx]`` (index.Tensor), ``topk``,
``unfold``, ``triu_indices``, ``EmbeddingBag`` (_embedding_bag).

Registered into :data:`~cuvil.compiler.frontends.torch_ops.TABLE` on import (``torch.py`` imports it).
Each is a Gather of the indices torch reads (a table, the index tensors, or a constant), so the
values and torch's negative-index rule are kept exactly.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from .builder import Unsupported
from .torch_ops import op


@op("index")
def _index(c, a):
    """``x[..., i0, i1, ...]`` with integer index tensors on consecutive dimensions (torch places their
    broadcast shape there): a Gather of the flat index over those dimensions. Boolean masks select a
    data-dependent number of elements; separated index tensors move their dimensions to the front."""
    x, given = a["self"], list(a["indices"])
    used = [d for d, i in enumerate(given) if i is not None]
    if not used or used != list(range(used[0], used[-1] + 1)):
        raise Unsupported("indexing with index tensors on dimensions that are not consecutive")
    if any(c.dtype(given[d]) is DType.BOOL for d in used):
        raise Unsupported("indexing with a boolean mask (its result's size depends on the data)")
    shape, first, last = c.shape(x), used[0], used[-1] + 1
    flat = None
    for d in used:  # row-major over the indexed dimensions; each index wrapped as torch wraps a negative one
        i = c.cast(given[d], DType.I64)
        n = c.const(shape[d], DType.I64)
        i = c.op("Where", [c.op("Less", [i, c.const(0, DType.I64)]), c.op("Add", [i, n]), i])
        flat = i if flat is None else c.op("Add", [c.op("Mul", [flat, n]), i])
    if last - first > 1:
        x = c.op("Reshape", [x], shape=[*shape[:first], -1, *shape[last:]])
    return c.op("Gather", [x, flat], axis=first)


@op("unfold")
def _unfold(c, a):
    """Windows of ``size`` every ``step`` along ``dim``: a Gather of the (windows, size) index table, its
    size axis then moved last, where torch puts it."""
    x, size, step = a["self"], a["size"], a["step"]
    shape = c.shape(x)
    dim = a["dimension"] % len(shape) if shape else 0
    count = (shape[dim] - size) // step + 1 if shape else 1
    table = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    y = c.op("Gather", [x, c.const(table, DType.I64)], axis=dim)
    if dim == len(shape) - 1:
        return y
    perm = [d for d in range(len(shape) + 1) if d != dim + 1] + [dim + 1]
    return c.op("Transpose", [y], perm=perm)


@op("triu_indices", "tril_indices")
def _triangle_indices(c, a):
    """A constant: torch's own indices for the shape (they depend on no tensor)."""
    upper = c.node.target.__name__.startswith("triu")
    rows, cols = (np.triu_indices if upper else np.tril_indices)(a["row"], a["offset"], a["col"])
    return c.const(np.stack([rows, cols]).astype(np.int64), DType.I64)


@op("topk")
def _topk(c, a):
    """TopKIndices, then the values gathered there (equal values in index order, NaN above every number)."""
    x = a["self"]
    if c.rank(x) == 0:
        raise Unsupported("topk of a 0-d tensor")
    axis = a.get("dim", -1) % c.rank(x)
    index = c.op("TopKIndices", [x], axis=axis, k=a["k"], largest=int(a.get("largest", True)))
    return c.op("GatherElements", [x, index], axis=axis), index


_BAG_MODES = ("sum", "mean", "max")  # ATen's mode numbers


@op("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag")
def _embedding_bag(c, a):
    """Bags of rows reduced: the indices gathered into a (bags, longest bag) layout (a Reshape when the bags
    are equal and in order: a 2-D input), the table's rows gathered from them as ``embedding`` does, then
    a reduction over the bag axis with a constant mask for the shorter bags and ``padding_idx`` masked at
    run time. Needs the offsets at import (a buffer, or the ``arange`` a 2-D input makes): the layout is
    their shape. Empty bags give zeros, as torch's do."""
    weight, indices, mode = a["weight"], a["indices"], _BAG_MODES[a["mode"]]
    offsets = c.b.value_of(a["offsets"])
    if offsets is None:
        raise Unsupported("offsets known only at run time (the bag sizes must be known at import)")
    starts, lengths = _bags(offsets, c.shape(indices)[0], a["include_last_offset"])
    out_dtype, longest = c.out_dtype, int(lengths.max(initial=0))
    if longest == 0:
        return c.const(np.zeros(c.out_shape), out_dtype), None, None, None
    slot = np.arange(longest)[None, :]
    valid = slot < lengths[:, None]
    positions = np.where(valid, starts[:, None] + slot, 0)

    def layout(v):  # a per-index value in the (bags, longest) layout
        if valid.all() and np.array_equal(positions.ravel(), np.arange(c.shape(v)[0])):
            return c.op("Reshape", [v], shape=list(positions.shape))
        return c.op("Gather", [v, c.const(positions, DType.I64)], axis=0)

    idx = layout(indices)
    rows = c.op("Gather", [weight, idx], axis=0)
    if a.get("per_sample_weights") is not None:
        rows = c.op("Mul", [rows, c.op("Unsqueeze", [layout(a["per_sample_weights"])], axes=[2])])
    keep, count = (None if valid.all() else c.const(valid, DType.BOOL)), c.const(lengths[:, None], out_dtype)
    pad = a.get("padding_idx")
    if pad is not None and pad >= 0:  # ATen's -1: none (the module has made a negative one positive)
        kept = c.op("Not", [c.op("Equal", [idx, c.const(pad, c.dtype(idx))])])
        keep = kept if keep is None else c.op("And", [keep, kept])
        count = c.op("ReduceSum", [c.cast(keep, out_dtype)], axes=[1], keepdims=1)
    if keep is not None:
        filler = c.const(-np.inf if mode == "max" else 0, out_dtype)
        rows = c.op("Where", [c.op("Unsqueeze", [keep], axes=[2]), rows, filler])
    if mode == "max":
        y = c.op("ReduceMax", [rows], axes=[1], keepdims=0)
        y = c.op("Where", [c.op("Greater", [count, c.const(0, out_dtype)]), y, c.const(0, out_dtype)])
    else:
        y = c.op("ReduceSum", [rows], axes=[1], keepdims=0)
    if mode == "mean":
        y = c.op("Div", [y, c.op("Max", [count, c.const(1, out_dtype)])])
    return y, None, None, None


def _bags(offsets: np.ndarray, n: int, include_last_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each bag's start and length. Torch refuses offsets that do not start at 0 or pass the input, and
    reads out of bounds on decreasing ones: refused here too. With include_last_offset, indices past the
    last offset are read by no bag, or by the last one with ``padding_idx`` in sum and mean: refused."""
    offsets = np.asarray(offsets, dtype=np.int64).ravel()
    if offsets.size == 0 or offsets[0] != 0 or offsets[-1] > n or np.any(np.diff(offsets) < 0):
        raise Unsupported(f"offsets {offsets.tolist()[:8]} are not non-decreasing from 0 to at most {n}")
    if include_last_offset and offsets[-1] != n:
        raise Unsupported(f"include_last_offset with indices past the last offset ({offsets[-1]} of {n}): "
                          "torch's kernels disagree on which bag reads them")
    ends = offsets[1:] if include_last_offset else np.append(offsets[1:], n)
    starts = offsets[:-1] if include_last_offset else offsets
    return starts, ends - starts


@op("embedding_renorm")
def _embedding_renorm(c, a):
    """``max_norm``: torch rescales the table's rows in place at every call, a write into a weight."""
    raise Unsupported("max_norm (Embedding/EmbeddingBag renormalise their weight in place at every call)")
