"""ONNX ops that are a few ops of the op table: Hardmax, OneHot, LpNormalization, Instance- and
GroupNormalization, Einsum, TopK, Compress, MaxUnpool, ReverseSequence, Det.

Each keeps ONNX's meaning exactly (ties, negative indices, the opset's axis rule) by composing ops
that already have references and native kernels on every backend, so no new kernel is needed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..ir.dtypes import DType
from . import norm_compose
from .builder import Unsupported
from .onnx_node import NodeCtx, OnnxImportError
from .onnx_ops import check_size, translates


def _axis(ctx: NodeCtx, rank: int, default: int) -> int:
    axis = ctx.attr("axis", default)
    if not -rank <= axis < rank:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _positions(ctx: NodeCtx, n: int, axis: int, rank: int, dtype) -> str:
    """The constant 0..n-1 laid along ``axis`` of a rank-``rank`` tensor (1 elsewhere)."""
    check_size(ctx, [n])
    shape = [1] * rank
    shape[axis] = n
    return ctx.constant(np.arange(n, dtype=dtype).reshape(shape), f"{ctx.name}/positions")


@translates(Hardmax=(1, 11, 13))
def _hardmax(ctx: NodeCtx) -> list:
    """1 at the first largest element along the axis, 0 elsewhere: ArgMax compared with positions."""
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise Unsupported(f"Hardmax of {t.dtype.value}")
    shape = list(t.shape)
    if any(not isinstance(d, int) for d in shape):
        ctx.batch_dependent("Hardmax's shape")
    if 0 in shape:  # nothing to mark (ArgMax refuses an empty axis)
        return [ctx.emit("Identity", [ctx.x(0)])]
    x = ctx.x(0)
    if ctx.opset < 13:  # the input is coerced to 2-D at the axis (default 1)
        axis = _axis(ctx, max(t.rank, 1), 1)
        x = ctx.tmp("Reshape", [x], "2d", shape=[math.prod(shape[:axis]), math.prod(shape[axis:])])
        rank, axis, n = 2, 1, math.prod(shape[axis:])
    else:
        rank = t.rank
        axis = _axis(ctx, rank, -1)
        n = shape[axis]
    best = ctx.tmp("ArgMax", [x], "argmax", axis=axis, keepdims=1, select_last_index=0)
    hit = ctx.tmp("Equal", [best, _positions(ctx, n, axis, rank, np.int64)], "hit")
    y = ctx.tmp("Cast", [hit], "cast", to=t.dtype)
    return [ctx.emit("Reshape", [y], shape=shape)]


@translates(OneHot=(9, 11, 28))
def _one_hot(ctx: NodeCtx) -> list:
    """values[1] where the (wrapped) index equals the position along the new axis, values[0] elsewhere."""
    t = ctx.type(0)
    depth = ctx.scalar(1, None)
    if not isinstance(depth, (int, float)) or not math.isfinite(depth) or depth < 1:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): depth must be a positive number")
    depth = int(depth)
    check_size(ctx, [*(d if isinstance(d, int) else 1 for d in t.shape), depth])
    rank = t.rank + 1
    axis = _axis(ctx, rank, -1)
    idx = ctx.x(0)
    if t.dtype != DType.I64:  # ONNX casts the indices to int64 (floats truncate)
        idx = ctx.tmp("Cast", [idx], "i64", to=DType.I64)
    if ctx.opset >= 11:  # negative indices count from the end
        wrapped = ctx.tmp("Add", [idx, ctx.constant(np.array(depth, np.int64), f"{ctx.name}/depth")], "wrapped")
        negative = ctx.tmp("Less", [idx, ctx.constant(np.array(0, np.int64), f"{ctx.name}/zero")], "negative")
        idx = ctx.tmp("Where", [negative, wrapped, idx], "index")
    idx = ctx.tmp("Reshape", [idx], "unsqueezed", shape=_unsqueezed(t.shape, axis))
    hit = ctx.tmp("Equal", [idx, _positions(ctx, depth, axis, rank, np.int64)], "hit")
    values = ctx.const(2).reshape(-1)
    if values.size != 2:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): values must hold [off, on]")
    off = ctx.constant(values[0], f"{ctx.name}/off")
    on = ctx.constant(values[1], f"{ctx.name}/on")
    return [ctx.emit("Where", [hit, on, off])]


def _unsqueezed(shape, axis: int) -> list[int]:
    dims = [d if isinstance(d, int) else -1 for d in shape]
    return dims[:axis] + [1] + dims[axis:]


@translates(LpNormalization=(1, 22))
def _lp_normalization(ctx: NodeCtx) -> list:
    """x / ||x||_p along the axis, p in {1, 2}; a line of zeros stays zeros."""
    t = ctx.type(0)
    if not t.dtype.is_float:
        raise Unsupported(f"LpNormalization of {t.dtype.value}")
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): p must be 1 or 2, not {p}")
    axis = _axis(ctx, t.rank, -1)
    x = ctx.x(0)
    mag = ctx.tmp("Abs", [x], "abs") if p == 1 else ctx.tmp("Mul", [x, x], "square")
    norm = ctx.tmp("ReduceSum", [mag], "sum", axes=[axis], keepdims=1)
    if p == 2:
        norm = ctx.tmp("Sqrt", [norm], "norm")
    # a zero norm means a zero line, which stays 0 (ONNX's own case): divide it by 1, not by 0
    zero = ctx.tmp("Equal", [norm, ctx.constant(np.zeros((), t.dtype.numpy), f"{ctx.name}/zero")], "zero")
    norm = ctx.tmp("Where", [zero, ctx.constant(np.ones((), t.dtype.numpy), f"{ctx.name}/one"), norm], "safe")
    return [ctx.emit("Div", [x, norm])]


def _composers(ctx: NodeCtx) -> tuple:
    """The emitters :mod:`norm_compose` builds with: intermediates, the node's own output, constants."""
    return (lambda op, inputs, suffix, **attrs: ctx.tmp(op, inputs, suffix, **attrs), ctx.emit,
            lambda value, suffix: ctx.constant(value, f"{ctx.name}/{suffix}"))


def _static_channels(ctx: NodeCtx, what: str) -> list:
    t = ctx.type(0)
    if t.rank < 3 or not t.dtype.is_float:
        raise Unsupported(f"{ctx.op} of a rank-{t.rank} {t.dtype.value} tensor")
    if any(not isinstance(d, int) for d in t.shape[1:]):
        ctx.batch_dependent(what)
    return list(t.shape)


@translates(InstanceNormalization=(6, 22))
def _instance_norm(ctx: NodeCtx) -> list:
    """Normalized over each sample's channel plane, then scale and B per channel."""
    shape = _static_channels(ctx, "InstanceNormalization's channels")
    eps = ctx.attr("epsilon", 1e-5)
    return [norm_compose.instance_norm(*_composers(ctx), ctx.x(0), ctx.x(1), ctx.x(2), shape, ctx.type(0).dtype, eps)]


@translates(GroupNormalization=(18, 21))
def _group_norm(ctx: NodeCtx) -> list:
    """Normalized over each sample's group of channels; scale and bias per channel (version 21) or
    per group (version 18, which ONNX deprecated for that reason)."""
    t = ctx.type(0)
    shape = _static_channels(ctx, "GroupNormalization's groups")
    groups = ctx.attr("num_groups")
    if groups < 1 or shape[1] % groups:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): {shape[1]} channels do not split into {groups} groups")
    batch = shape[0] if isinstance(shape[0], int) else -1
    emit, final, const = _composers(ctx)
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.opset >= 21:
        return [norm_compose.group_norm(emit, final, const, ctx.x(0), ctx.x(1), ctx.x(2), batch, groups, shape[1:],
                                        t.dtype, eps)]
    y = norm_compose.grouped_normalize(emit, const, ctx.x(0), batch, groups, shape[1:], t.dtype, eps)
    scale = ctx.tmp("Reshape", [ctx.x(1)], "scale", shape=[groups, 1])
    bias = ctx.tmp("Reshape", [ctx.x(2)], "bias", shape=[groups, 1])
    y = ctx.tmp("Add", [ctx.tmp("Mul", [y, scale], "scaled"), bias], "affine")
    return [ctx.emit("Reshape", [y], shape=[batch, *shape[1:]])]


def _einsum_terms(ctx: NodeCtx, ranks: list[int]) -> tuple[list[str], str]:
    """The equation's operand terms and output term, '...' spelled out as digits (right-aligned)."""
    eq = str(ctx.attr("equation")).replace(" ", "")
    if not all(c.isascii() and (c.isalpha() or c in ",.->") for c in eq):  # digits are ours, for '...'
        raise OnnxImportError(f"node {ctx.name!r} (Einsum): the equation may hold letters, ',', '...' and '->' only")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise OnnxImportError(f"node {ctx.name!r} (Einsum): {len(terms)} terms for {len(ranks)} inputs")
    spans = [rank - len(term.replace("...", "")) for term, rank in zip(terms, ranks)]
    width = max([s for s, term in zip(spans, terms) if "..." in term], default=0)
    dots = "".join(str(k) for k in range(width))
    spelled = [term.replace("...", dots[width - s:]) for term, s in zip(terms, spans)]
    for term, rank in zip(spelled, ranks):
        if len(term) != rank or not all(c.isalpha() or c.isdigit() for c in term):
            raise OnnxImportError(f"node {ctx.name!r} (Einsum): a term does not match its input's rank")
    if arrow:
        out = out.replace("...", dots)
    else:  # implicit output: the broadcast dims, then the letters seen once, alphabetically
        letters = "".join(spelled)
        out = dots + "".join(sorted(c for c in set(letters) if c.isalpha() and letters.count(c) == 1))
    if len(set(out)) != len(out) or any(c not in "".join(spelled) for c in out):
        raise OnnxImportError(f"node {ctx.name!r} (Einsum): bad output term")
    return spelled, out


@translates(Einsum=(12, 28))  # 28 adds bfloat16 only
def _einsum(ctx: NodeCtx) -> list:
    """Every operand laid along all indices (output ones first), multiplied, summed over the rest."""
    types = [ctx.type(i) for i in range(len(ctx.xs()))]
    if any(not isinstance(d, int) for t in types for d in t.shape):
        ctx.batch_dependent("Einsum's shape")
    terms, out = _einsum_terms(ctx, [t.rank for t in types])
    operands = [_diagonal(ctx, i, ctx.x(i), term, list(t.shape)) for i, (term, t) in enumerate(zip(terms, types))]
    terms = [term for _, term, _ in operands]
    order = out + "".join(sorted({c for term in terms for c in term} - set(out)))
    sizes = {c: d for _, term, shape in operands for c, d in zip(term, shape) if d != 1}
    check_size(ctx, [sizes.get(c, 1) for c in order])
    product = None
    for i, (x, term, shape) in enumerate(operands):
        perm = sorted(range(len(term)), key=lambda k: order.index(term[k]))
        if perm != sorted(perm):
            x = ctx.tmp("Transpose", [x], f"t{i}", perm=perm)
        x = ctx.tmp("Reshape", [x], f"r{i}", shape=[shape[term.index(c)] if c in term else 1 for c in order])
        product = x if product is None else ctx.tmp("Mul", [product, x], f"m{i}")
    if len(order) > len(out):
        product = ctx.tmp("ReduceSum", [product], "sum", axes=list(range(len(out), len(order))), keepdims=0)
    return [ctx.emit("Identity", [product])]


def _diagonal(ctx: NodeCtx, i: int, x: str, term: str, shape: list[int]) -> tuple[str, str, list[int]]:
    """An operand whose term repeats an index, reduced to that index's diagonal: the elements off it
    replaced by 0 (Where: an infinity off the diagonal stays out) and the second axis summed away."""
    while len(set(term)) != len(term):
        p = next(k for k, c in enumerate(term) if term.count(c) > 1)
        q = term.index(term[p], p + 1)
        if shape[p] != shape[q]:
            raise OnnxImportError(f"node {ctx.name!r} (Einsum): index {term[p]!r} spans {shape[p]} and {shape[q]}")
        check_size(ctx, [shape[p], shape[q]])
        eye = np.eye(shape[p], dtype=bool).reshape([n if k in (p, q) else 1 for k, n in enumerate(shape)])
        zero = ctx.constant(np.zeros((), ctx.type(i).dtype.numpy), f"{ctx.name}/zero{i}")
        x = ctx.tmp("Where", [ctx.constant(eye, f"{ctx.name}/eye{i}{q}"), x, zero], f"offdiag{i}{q}")
        x = ctx.tmp("ReduceSum", [x], f"diag{i}{q}", axes=[q], keepdims=0)
        term, shape = term[:q] + term[q + 1:], shape[:q] + shape[q + 1:]
    return x, term, shape


@translates(TopK=(1, 10, 11, 24))
def _top_k(ctx: NodeCtx) -> list:
    """TopKIndices (equal values in index order, NaN above every number, as ONNX Runtime), then the values
    gathered there. ``sorted=0`` lets a runtime choose any order; this one is always sorted."""
    t = ctx.type(0)
    if not all(isinstance(d, int) for d in t.shape):
        ctx.batch_dependent("TopK's shape")
    axis = _axis(ctx, t.rank, -1)
    k = ctx.attr("k") if ctx.opset < 10 else int(ctx.scalar(1, 0))
    if not 0 <= k <= t.shape[axis]:
        raise OnnxImportError(f"node {ctx.name!r} (TopK): k={k} outside [0, {t.shape[axis]}] along axis {axis}")
    largest = 1 if ctx.opset < 11 else int(ctx.attr("largest", 1))
    named = (ctx.outputs + ["", ""])[1] or f"{ctx.name}:1"  # Indices keeps its ONNX name
    index = ctx.b.add("TopKIndices", [ctx.x(0)], name=ctx.name, output_names=[named], axis=axis, k=k,
                      largest=largest)[0]
    return [ctx.emit("GatherElements", [ctx.x(0), index], axis=axis), index]


def _static(ctx: NodeCtx, i: int, what: str):
    t = ctx.type(i)
    if not all(isinstance(d, int) for d in t.shape):
        ctx.batch_dependent(what)
    return t


@translates(Compress=(9, 11, 28))
def _compress(ctx: NodeCtx) -> list:
    """A Gather of the condition's true positions: the condition must be a constant (it decides the
    output's shape), like a Reshape's shape."""
    t = _static(ctx, 0, "Compress's shape")
    keep = np.flatnonzero(ctx.const(1).reshape(-1).astype(bool))
    x = ctx.x(0)
    if ctx.attr("axis", None) is None:
        x, axis, n = ctx.tmp("Reshape", [x], "flat", shape=[math.prod(t.shape)]), 0, math.prod(t.shape)
    else:
        axis = _axis(ctx, t.rank, 0)
        n = t.shape[axis]
    if keep.size and keep[-1] >= n:
        raise OnnxImportError(f"node {ctx.name!r} (Compress): the condition selects position {keep[-1]} of {n}")
    return [ctx.emit("Gather", [x, ctx.constant(keep.astype(np.int64), f"{ctx.name}/keep")], axis=axis)]


@translates(MaxUnpool=(9, 11, 22))
def _max_unpool(ctx: NodeCtx) -> list:
    """X's values scattered (ScatterElements) to their flat Indices in zeros of the inferred shape,
    then zero-padded at the end to output_shape, as ONNX's reference does."""
    t = _static(ctx, 0, "MaxUnpool's shape")
    nd = t.rank - 2
    kernel = list(ctx.attr("kernel_shape"))
    strides, pads = list(ctx.attr("strides", [1] * nd)), list(ctx.attr("pads", [0] * 2 * nd))
    if len(kernel) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise OnnxImportError(f"node {ctx.name!r} (MaxUnpool): {nd} spatial dims need as many kernel dims and strides")
    inferred = [*t.shape[:2], *((n - 1) * s - pads[i] - pads[nd + i] + k
                                for i, (n, s, k) in enumerate(zip(t.shape[2:], strides, kernel)))]
    shape = [int(v) for v in ctx.const(2).reshape(-1)] if ctx.has(2) else inferred
    if len(shape) != t.rank or any(o < i for o, i in zip(shape, inferred)) or min(inferred) < 0:
        raise OnnxImportError(f"node {ctx.name!r} (MaxUnpool): output_shape {shape} is smaller than {inferred}")
    check_size(ctx, shape)
    flat = [1, math.prod(t.shape)]
    zeros = ctx.constant(np.zeros((1, math.prod(inferred)), t.dtype.numpy), f"{ctx.name}/zeros")
    y = ctx.tmp("ScatterElements", [zeros, ctx.tmp("Reshape", [ctx.x(1)], "where", shape=flat),
                                    ctx.tmp("Reshape", [ctx.x(0)], "values", shape=flat)], "scatter", axis=1)
    y = ctx.tmp("Reshape", [y], "unflat", shape=inferred)
    return [ctx.emit("Pad", [y], pads=[0] * t.rank + [o - i for o, i in zip(shape, inferred)], mode="constant", value=0.0)]


@translates(ReverseSequence=(10, 28))
def _reverse_sequence(ctx: NodeCtx) -> list:
    """GatherElements along the time axis at len - 1 - t below each batch row's length, t above."""
    t = _static(ctx, 0, "ReverseSequence's shape")
    time, batch = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    if t.rank < 2 or {time, batch} != {0, 1}:
        raise OnnxImportError(f"node {ctx.name!r} (ReverseSequence): time_axis and batch_axis must be 0 and 1")
    steps = np.arange(t.shape[time], dtype=np.int64).reshape([-1, 1] if time == 0 else [1, -1])
    lens = ctx.tmp("Cast", [ctx.x(1)], "lens", to=DType.I64)
    lens = ctx.tmp("Unsqueeze", [lens], "row", axes=[time])
    pos = ctx.constant(steps, f"{ctx.name}/steps")
    back = ctx.tmp("Sub", [ctx.tmp("Sub", [lens, ctx.constant(np.array(1, np.int64), f"{ctx.name}/one")], "last"), pos],
                   "back")
    where = ctx.tmp("Where", [ctx.tmp("Less", [pos, lens], "inside"), back, pos], "where")
    where = ctx.tmp("Reshape", [where], "lift", shape=list(t.shape[:2]) + [1] * (t.rank - 2))
    where = ctx.tmp("Expand", [where], "spread", shape=list(t.shape))
    return [ctx.emit("GatherElements", [ctx.x(0), where], axis=time)]


MAX_DET = 5  # Leibniz's n! products: 120 at 5


@translates(Det=(11, 22))
def _det(ctx: NodeCtx) -> list:
    """Leibniz's formula: for each permutation the product of the entries it picks (a Gather by a
    constant table, ReduceProd), then the signed sum (MatMul with the signs); square matrices up to
    5 x 5, larger ones unsupported."""
    t = _static(ctx, 0, "Det's shape")
    n = t.shape[-1] if t.rank >= 2 else 0
    if t.rank < 2 or t.shape[-2] != n or not t.dtype.is_float:
        raise OnnxImportError(f"node {ctx.name!r} (Det): input {t} must be float square matrices")
    if n > MAX_DET:
        raise Unsupported(f"Det of {n} x {n} matrices (Leibniz's formula up to {MAX_DET} x {MAX_DET})")
    perms = list(itertools.permutations(range(n)))
    picks = np.array([[i * n + p[i] for i in range(n)] for p in perms], np.int64)
    signs = np.array([(-1) ** sum(p[i] > p[j] for i in range(n) for j in range(i + 1, n)) for p in perms])
    flat = ctx.tmp("Reshape", [ctx.x(0)], "flat", shape=[*t.shape[:-2], n * n])
    terms = ctx.tmp("Gather", [flat, ctx.constant(picks, f"{ctx.name}/picks")], "picks", axis=t.rank - 2)
    terms = ctx.tmp("ReduceProd", [terms], "terms", axes=[t.rank - 1], keepdims=0)
    det = ctx.tmp("MatMul", [terms, ctx.constant(signs.astype(t.dtype.numpy)[:, None], f"{ctx.name}/signs")], "det")
    return [ctx.emit("Reshape", [det], shape=list(t.shape[:-2]))]
