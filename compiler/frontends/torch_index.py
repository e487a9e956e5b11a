"""ATen → Cuvil translators for indexing, selection and windows: ``x[idx]`` (index.Tensor), ``topk``,
``unfold``, ``triu_indices``.

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
