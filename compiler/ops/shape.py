"""Shape ops: Reshape, Flatten, Transpose, Concat, Split, Slice, Squeeze, Unsqueeze, Pad, Gather,
Expand, Shape.

Every rule is one function over plain integer shapes; the NumPy reference calls the same function
with the array's actual shape, so the rule and the reference cannot drift apart. Rules compute
from the input shape and never store it, so the batch probing of ``ir/infer.py`` sees a batch
dimension flow through (a Reshape to ``[-1, 64]`` of ``[N, 4, 16]`` gives ``[N, 64]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType
from .common import broadcast_shapes, norm_axis, same_dtype
from .registry import AttrKind, AttrSpec, OpDef, no_flops, register, require

INT, INTS, STR, FLOAT = AttrKind.INT, AttrKind.INTS, AttrKind.STRING, AttrKind.FLOAT
Shape = tuple[int, ...]


def _axes(op: str, axes: Sequence[int], rank: int) -> list[int]:
    """Normalise a list of axes against ``rank``; duplicates are an error, as in ONNX."""
    out = [norm_axis(op, a, rank) for a in axes]
    require(len(set(out)) == len(out), f"{op}: repeated axis in {list(axes)}")
    return out


def _same(fn):
    """A shape rule whose single output keeps the input's dtype and takes the shape ``fn`` computes."""

    def infer(ts, a):
        return [TensorType(ts[0].dtype, fn(ts[0].shape, a))]

    return infer


# --- Reshape, Flatten, Squeeze, Unsqueeze: same elements, new shape --------------------------------


def reshape_shape(shape: Shape, a) -> Shape:
    """ONNX Reshape with allowzero=0: 0 copies the input's dimension, one -1 takes the rest."""
    spec = a["shape"]
    require(all(s >= -1 for s in spec), f"Reshape: bad target shape {list(spec)}")
    require(spec.count(-1) <= 1, f"Reshape: more than one -1 in {list(spec)}")
    require(all(i < len(shape) for i, s in enumerate(spec) if s == 0),
            f"Reshape: 0 in {list(spec)} copies a dimension the rank-{len(shape)} input lacks")
    dims = [shape[i] if s == 0 else s for i, s in enumerate(spec)]
    total = math.prod(shape)
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        require(known > 0 and total % known == 0, f"Reshape: cannot reshape {list(shape)} to {list(spec)}")
        dims[dims.index(-1)] = total // known
    require(math.prod(dims) == total, f"Reshape: cannot reshape {list(shape)} to {list(spec)}")
    return tuple(dims)


def flatten_shape(shape: Shape, a) -> Shape:
    axis = a["axis"]
    require(-len(shape) <= axis <= len(shape), f"Flatten: axis {axis} out of range for rank {len(shape)}")
    axis += len(shape) if axis < 0 else 0
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


def squeeze_shape(shape: Shape, a) -> Shape:
    require(len(a["axes"]) > 0, "Squeeze: axes must be explicit (the frontend resolves ONNX's default)")
    axes = _axes("Squeeze", a["axes"], len(shape))
    require(all(shape[i] == 1 for i in axes), f"Squeeze: axes {list(a['axes'])} of {list(shape)} are not all 1")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def unsqueeze_shape(shape: Shape, a) -> Shape:
    """Axes are positions in the output, so negative axes count from the output's rank."""
    rank = len(shape) + len(a["axes"])
    axes = _axes("Unsqueeze", a["axes"], rank)
    rest = iter(shape)
    return tuple(1 if i in axes else next(rest) for i in range(rank))


def _reshaper(fn):
    return lambda xs, a: [xs[0].reshape(fn(xs[0].shape, a)).copy()]


# --- Transpose, Expand, Shape ---------------------------------------------------------------------


def transpose_shape(shape: Shape, a) -> Shape:
    perm = a["perm"]
    require(sorted(perm) == list(range(len(shape))), f"Transpose: perm {list(perm)} is not a permutation of rank {len(shape)}")
    return tuple(shape[p] for p in perm)


def expand_shape(shape: Shape, a) -> Shape:
    require(all(s >= 0 for s in a["shape"]), f"Expand: bad shape {list(a['shape'])}")
    return broadcast_shapes("Expand", shape, tuple(a["shape"]))


def _shape_infer(ts, a):
    return [TensorType(DType.I64, (ts[0].rank,))]


# --- Slice ----------------------------------------------------------------------------------------


def slice_bounds(shape: Shape, a) -> list[slice]:
    """One Python slice per axis, clamped exactly as ONNX clamps (INT64 sentinels included)."""
    starts, ends, axes, steps = a["starts"], a["ends"], a["axes"], a["steps"]
    require(len(starts) == len(ends) == len(axes) == len(steps),
            "Slice: starts, ends, axes and steps must have one entry each")
    require(all(s != 0 for s in steps), "Slice: steps must be nonzero")
    out = [slice(None)] * len(shape)
    for axis, start, end, step in zip(_axes("Slice", axes, len(shape)), starts, ends, steps):
        dim = shape[axis]
        start += dim if start < 0 else 0
        end += dim if end < 0 else 0
        lo, hi = (0, dim) if step > 0 else (0, dim - 1)
        start = min(max(start, lo), hi)
        end = min(max(end, lo if step > 0 else -1), hi)
        out[axis] = slice(start, None if end < 0 else end, step)
    return out


def slice_shape(shape: Shape, a) -> Shape:
    return tuple(len(range(*s.indices(d))) for s, d in zip(slice_bounds(shape, a), shape))


# --- Pad ------------------------------------------------------------------------------------------

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge"}


def pad_shape(shape: Shape, a) -> Shape:
    """Pads are all begins then all ends; negative pads crop (constant mode only, as in ONNX)."""
    pads, rank, mode = a["pads"], len(shape), a["mode"]
    require(mode in _PAD_MODES, f"Pad: mode must be one of {sorted(_PAD_MODES)}, got {mode!r}")
    require(len(pads) == 2 * rank, f"Pad: needs {2 * rank} pads for rank {rank}, got {len(pads)}")
    begins, ends = pads[:rank], pads[rank:]
    out = tuple(d + b + e for d, b, e in zip(shape, begins, ends))
    # Crops apply before pads, so a crop past a dimension is refused even where pads would refill it.
    require(all(d + min(b, 0) + min(e, 0) >= 0 for d, b, e in zip(shape, begins, ends)),
            f"Pad: pads {list(pads)} crop {list(shape)} below zero")
    if mode != "constant":
        require(min(pads, default=0) >= 0, f"Pad: negative pads need mode 'constant', got {mode!r}")
    limits = {"reflect": lambda d: d - 1, "edge": lambda d: math.inf if d > 0 else 0}
    if mode in limits:
        require(all(max(b, e) <= limits[mode](d) for d, b, e in zip(shape, begins, ends)),
                f"Pad: {mode} pads {list(pads)} are too large for {list(shape)}")
    return out


def _pad_ref(xs, a):
    x, rank = xs[0], xs[0].ndim
    pad_shape(x.shape, a)
    begins, ends = a["pads"][:rank], a["pads"][rank:]
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, b, e in zip(x.shape, begins, ends))
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    extra = {"constant_values": np.asarray(a["value"]).astype(x.dtype)} if a["mode"] == "constant" else {}
    return [np.pad(x[crop], widths, mode=_PAD_MODES[a["mode"]], **extra)]


# --- Concat, Split, Gather: several operands or results --------------------------------------------


def _concat_infer(ts, a):
    dtype = same_dtype("Concat", ts)
    rank = ts[0].rank
    require(rank >= 1 and all(t.rank == rank for t in ts), f"Concat: operands need one rank >= 1, got {[str(t) for t in ts]}")
    axis = norm_axis("Concat", a["axis"], rank)
    rest = {t.shape[:axis] + t.shape[axis + 1:] for t in ts}
    require(len(rest) == 1, f"Concat: shapes {[list(t.shape) for t in ts]} differ off axis {a['axis']}")
    shape = list(ts[0].shape)
    shape[axis] = sum(t.shape[axis] for t in ts)
    return [TensorType(dtype, tuple(shape))]


def _concat_joins(a, ins, out) -> bool:
    """Only ones before the axis: each operand is one contiguous run of the output's bytes."""
    return math.prod(out.shape[:norm_axis("Concat", a["axis"], out.rank)]) == 1


def _split_parts(shape: Shape, a) -> tuple[int, list[int]]:
    axis = norm_axis("Split", a["axis"], len(shape))
    split = a["split"]
    require(len(split) > 0 and min(split) >= 0, f"Split: split sizes {list(split)} must be non-negative")
    require(sum(split) == shape[axis], f"Split: sizes {list(split)} do not add up to {shape[axis]} on axis {a['axis']}")
    return axis, list(split)


def _split_infer(ts, a):
    shape = ts[0].shape
    axis, split = _split_parts(shape, a)
    return [TensorType(ts[0].dtype, shape[:axis] + (s,) + shape[axis + 1:]) for s in split]


def _split_ref(xs, a):
    axis, split = _split_parts(xs[0].shape, a)
    return [p.copy() for p in np.split(xs[0], np.cumsum(split)[:-1], axis=axis)]


def _gather_infer(ts, a):
    data, idx = ts
    require(data.rank >= 1, "Gather: data must have rank >= 1")
    require(idx.dtype in (DType.I32, DType.I64), f"Gather: indices must be i32 or i64, got {idx.dtype.value}")
    axis = norm_axis("Gather", a["axis"], data.rank)
    return [TensorType(data.dtype, data.shape[:axis] + idx.shape + data.shape[axis + 1:])]


def _gather_ref(xs, a):
    data, idx = xs
    axis = norm_axis("Gather", a["axis"], data.ndim)
    dim = data.shape[axis]
    require(bool(np.all((idx >= -dim) & (idx < dim))), f"Gather: an index is out of range for axis size {dim}")
    return [np.asarray(np.take(data, idx.astype(np.int64), axis=axis))]  # a 0-d index gives a scalar


def _bitcast_infer(ts, a):
    x, to = ts[0], a["to"]
    require(x.dtype.bits == to.bits,
            f"BitCast: {x.dtype.value} and {to.value} differ in width")
    require(to is not DType.BOOL, "BitCast: to bool is refused (a byte other than 0 or 1 is no bool)")
    return [TensorType(to, x.shape)]


VIEW = {"view": True, "flops": no_flops}
MOVES = {"flops": no_flops}

register(
    OpDef("Reshape", _same(reshape_shape), _reshaper(reshape_shape), attrs={"shape": AttrSpec(INTS)}, **VIEW),
    OpDef("Flatten", _same(flatten_shape), _reshaper(flatten_shape), attrs={"axis": AttrSpec(INT, 1)}, **VIEW,
          same_as_onnx=True),
    OpDef("Squeeze", _same(squeeze_shape), _reshaper(squeeze_shape), attrs={"axes": AttrSpec(INTS)}, **VIEW),
    OpDef("Unsqueeze", _same(unsqueeze_shape), _reshaper(unsqueeze_shape), attrs={"axes": AttrSpec(INTS)}, **VIEW),
    OpDef("BitCast", _bitcast_infer, lambda xs, a: [xs[0].copy().view(a["to"].numpy)],
          attrs={"to": AttrSpec(AttrKind.DTYPE)}, doc="the same bytes as another dtype of their width", **VIEW),
    OpDef("Transpose", _same(transpose_shape),
          lambda xs, a: [np.transpose(xs[0], a["perm"]).copy()],
          attrs={"perm": AttrSpec(INTS)}, **MOVES),
    OpDef("Expand", _same(expand_shape),
          lambda xs, a: [np.broadcast_to(xs[0], expand_shape(xs[0].shape, a)).copy()], attrs={"shape": AttrSpec(INTS)},
          elementwise=True, **MOVES),
    OpDef("Shape", _shape_infer, lambda xs, a: [np.array(xs[0].shape, dtype=np.int64)],
          doc="folded by the frontends when the shape is static", **MOVES),
    OpDef("Slice", _same(slice_shape), lambda xs, a: [xs[0][tuple(slice_bounds(xs[0].shape, a))].copy()],
          attrs={k: AttrSpec(INTS) for k in ("starts", "ends", "axes", "steps")}, **MOVES),
    OpDef("Pad", _same(pad_shape), _pad_ref,
          attrs={"pads": AttrSpec(INTS), "mode": AttrSpec(STR, "constant"), "value": AttrSpec(FLOAT, 0.0)}, **MOVES),
    OpDef("Concat", _concat_infer, lambda xs, a: [np.concatenate(xs, axis=a["axis"])],
          attrs={"axis": AttrSpec(INT)}, max_inputs=None, same_as_onnx=True, joins=_concat_joins, **MOVES),
    OpDef("Split", _split_infer, _split_ref, attrs={"axis": AttrSpec(INT, 0), "split": AttrSpec(INTS)}, **MOVES),
    OpDef("Gather", _gather_infer, _gather_ref, attrs={"axis": AttrSpec(INT, 0)}, min_inputs=2, max_inputs=2,
          same_as_onnx=True, run_time_check=True, **MOVES),
)
