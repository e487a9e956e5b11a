"""The ATen → Cuvil translation table of the PyTorch frontend.

One entry per ATen op packet (``"add"`` covers ``add.Tensor`` and ``add.Scalar``). A translator
gets a :class:`~cuvil.compiler.frontends.torch.Ctx` and the node's arguments bound by name from the
op's schema (tensors are Cuvil value names, everything else is a plain Python value) and returns a
value name, a tuple of them (``None`` for an output Cuvil does not produce), or ``None``.
Configurations Cuvil cannot express raise :class:`~cuvil.compiler.frontends.builder.Unsupported`,
which the driver reports with all other unsupported ops at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..ir.dtypes import DType
from .builder import Unsupported

TORCH_DTYPES = {
    torch.float32: DType.F32, torch.float64: DType.F64, torch.float16: DType.F16, torch.int8: DType.I8,
    torch.uint8: DType.U8, torch.int32: DType.I32, torch.int64: DType.I64, torch.bool: DType.BOOL,
}
_TO_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def to_dtype(dtype: Any) -> DType:
    if dtype not in TORCH_DTYPES:
        raise Unsupported(f"dtype {dtype}")
    return TORCH_DTYPES[dtype]


Translator = Callable[[Any, dict[str, Any]], Any]
TABLE: dict[str, Translator] = {}


def op(*names: str):
    def deco(fn: Translator) -> Translator:
        for n in names:
            TABLE[n] = fn
        return fn
    return deco


def pair(v, n: int = 2) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * n if len(v) == 1 else v


# --- elementwise ----------------------------------------------------------------------------------
def _unary(cuvil_op: str, attrs: Callable[[dict], dict] = lambda a: {}) -> Translator:
    return lambda c, a: c.op(cuvil_op, [c.cast(a["self"], c.out_dtype)], **attrs(a))


for _name, _op, _attrs in (
    ("relu", "Relu", None), ("sigmoid", "Sigmoid", None), ("tanh", "Tanh", None), ("erf", "Erf", None),
    ("sqrt", "Sqrt", None), ("exp", "Exp", None), ("log", "Log", None), ("neg", "Neg", None),
    ("abs", "Abs", None), ("reciprocal", "Reciprocal", None), ("silu", "SiLU", None),
    ("hardswish", "HardSwish", None), ("hardsigmoid", "HardSigmoid", lambda a: {"alpha": 1 / 6, "beta": 0.5}),
    ("relu6", "Clip", lambda a: {"min": 0.0, "max": 6.0}),
    ("hardtanh", "Clip", lambda a: {"min": a["min_val"], "max": a["max_val"]}),
    ("gelu", "Gelu", lambda a: {"approximate": a["approximate"]}),
    ("leaky_relu", "LeakyRelu", lambda a: {"alpha": a["negative_slope"]}),
):
    op(_name)(_unary(_op, _attrs) if _attrs else _unary(_op))
op("rsqrt")(lambda c, a: c.op("Reciprocal", [c.op("Sqrt", [c.cast(a["self"], c.out_dtype)])]))
op("square")(lambda c, a: c.op("Mul", [a["self"], a["self"]]))


@op("clamp", "clamp_min", "clamp_max")
def _clamp(c, a):
    lo, hi = a.get("min"), a.get("max")
    if isinstance(lo, str) or isinstance(hi, str):  # clamp.Tensor: bounds are tensors
        x = a["self"]
        x = x if lo is None else c.op("Max", c.promote(x, lo))
        return x if hi is None else c.op("Min", c.promote(x, hi))
    if not c.out_dtype.is_float:
        raise Unsupported("integer clamp")
    return c.op("Clip", [a["self"]], min=-math.inf if lo is None else lo, max=math.inf if hi is None else hi)


_OPMATH = {"Mul", "Div"}  # torch's CPU kernels that keep a scalar second operand of an f16 op in f32


def _binary(cuvil_op: str) -> Translator:
    def fn(c, a):
        if cuvil_op in _OPMATH and a.get("rounding_mode") is None and _opmath_scalar(c, a["other"]):
            return _in_f32(c, cuvil_op, a["self"], a["other"])
        x, y = c.promote(a["self"], a["other"])
        alpha = a.get("alpha", 1)
        if alpha != 1:
            y = c.op("Mul", [y, c.const(alpha, c.dtype(y))])
        if cuvil_op == "Div" and a.get("rounding_mode") is not None:
            if a["rounding_mode"] != "trunc" or c.dtype(x).is_float:
                raise Unsupported(f"rounding_mode={a['rounding_mode']!r}")
        elif cuvil_op == "Div":  # true division: integers divide as floats
            x, y = c.cast(x, c.out_dtype), c.cast(y, c.out_dtype)
        return c.op(cuvil_op, [x, y])
    return fn


def _opmath_scalar(c, other) -> bool:
    """An f16 product or quotient by a Python number or a 0-d tensor of another dtype: torch computes
    it in f32 with the scalar's f32 value and rounds once (``x / 65535.0`` is not ``x / inf``)."""
    if c.out_dtype is not DType.F16:
        return False
    return not isinstance(other, str) or (c.rank(other) == 0 and c.dtype(other) is not DType.F16)


def _in_f32(c, cuvil_op: str, x: str, other) -> str:
    x = c.cast(c.cast(x, DType.F16), DType.F32)
    y = c.cast(other, DType.F32) if isinstance(other, str) else c.const(other, DType.F32)
    return c.op("Cast", [c.op(cuvil_op, [x, y])], to=DType.F16)


for _name, _op in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("maximum", "Max"),
                   ("minimum", "Min"), ("eq", "Equal"), ("lt", "Less"), ("gt", "Greater")):
    op(_name)(_binary(_op))


def _not(c, cond: str) -> str:
    return c.op("Where", [cond, c.const(False, DType.BOOL), c.const(True, DType.BOOL)])


def _or_equal(cuvil_op: str) -> Translator:
    """le, ge as Where(strict, true, Equal): exact for NaN too (Cuvil has no Or or Not)."""
    def fn(c, a):
        x, y = c.promote(a["self"], a["other"])
        return c.op("Where", [c.op(cuvil_op, [x, y]), c.const(True, DType.BOOL), c.op("Equal", [x, y])])
    return fn


op("le")(_or_equal("Less"))
op("ge")(_or_equal("Greater"))
op("ne")(lambda c, a: _not(c, c.op("Equal", c.promote(a["self"], a["other"]))))
op("logical_not")(lambda c, a: _not(c, c.cast(a["self"], DType.BOOL)))


@op("rsub")
def _rsub(c, a):
    x, y = c.promote(a["self"], a["other"])
    if a.get("alpha", 1) != 1:
        x = c.op("Mul", [x, c.const(a["alpha"], c.dtype(x))])
    return c.op("Sub", [y, x])


op("pow")(lambda c, a: c.op("Pow", c.promote(a["self"], a["exponent"])))
op("where")(lambda c, a: c.op("Where", [c.cast(a["condition"], DType.BOOL), *c.promote(a["self"], a["other"])]))
op("masked_fill")(lambda c, a: c.op(
    "Where", [a["mask"], *(c.cast(t, c.out_dtype) for t in c.promote(a["value"], a["self"]))]))
op("_to_copy", "to", "type_as")(lambda c, a: c.cast(a["self"], c.out_dtype))
op("clone", "alias", "detach", "contiguous", "lift_fresh_copy", "_assert_tensor_metadata", "_assert_scalar")(
    lambda c, a: a.get("self"))


@op("dropout", "feature_dropout", "alpha_dropout")
def _dropout(c, a):
    if a["train"] and a["p"] > 0:
        raise Unsupported("training-mode dropout")
    return a["input"]


@op("full", "zeros", "ones", "scalar_tensor", "arange", "full_like", "zeros_like", "ones_like")
def _creation(c, a):
    """Static shapes make creation ops constants; the value comes from torch itself."""
    meta = c.node.meta["val"]
    if c.node.target.__name__.split(".")[0].endswith("_like"):
        fill = {"zeros_like": 0, "ones_like": 1}.get(c.node.target.__name__.split(".")[0])
        value = np.full(tuple(meta.shape), a["fill_value"] if fill is None else fill)
    else:
        value = c.node.target(*c.node.args, **{k: v for k, v in c.node.kwargs.items() if k != "device"}).numpy()
    return c.const(value, c.out_dtype, hint=c.node.name)


def _softmax_like(cuvil_op: str) -> Translator:
    """A 0-d input is a row of one (torch gives 1 and 0)."""
    def fn(c, a):
        x = c.cast(a["self"], c.out_dtype)
        if c.rank(x) == 0:
            return c.op("Squeeze", [c.op(cuvil_op, [c.op("Unsqueeze", [x], axes=[0])], axis=0)], axes=[0])
        return c.op(cuvil_op, [x], axis=a["dim"])
    return fn


op("_softmax", "softmax")(_softmax_like("Softmax"))
op("_log_softmax", "log_softmax")(_softmax_like("LogSoftmax"))


# --- reductions ------------------------------------------------------------------------------------
def _reduce(cuvil_op: str) -> Translator:
    def fn(c, a):
        x = c.cast(a["self"], c.out_dtype)
        rank, dims = c.rank(x), a.get("dim")
        if rank == 0:  # dim 0 or -1 of a 0-d tensor: torch reduces nothing
            return x
        axes = sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims or []))
        keep = int(a.get("keepdim", False))
        if cuvil_op == "ReduceMean" and rank == 4 and axes == [2, 3] and keep and c.out_dtype.is_float:
            return c.op("GlobalAveragePool", [x])
        return c.op(cuvil_op, [x], axes=axes, keepdims=keep)
    return fn


@op("var", "std")
def _variance(c, a):
    """The mean square deviation over ``dim`` divided by (count - correction); std its square root."""
    x = c.cast(a["self"], c.out_dtype)
    rank, dims = c.rank(x), a.get("dim")
    axes = sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims or range(rank)))
    count = math.prod(c.shape(x)[d] for d in axes)
    correction = a.get("correction")
    correction = int(a.get("unbiased", True)) if correction is None else correction
    dev = c.op("Sub", [x, c.op("ReduceMean", [x], axes=axes, keepdims=1)])
    total = c.op("ReduceSum", [c.op("Mul", [dev, dev])], axes=axes, keepdims=int(a.get("keepdim", False)))
    var = c.op("Div", [total, c.const(max(count - correction, 0), c.out_dtype)])
    return c.op("Sqrt", [var]) if c.node.target.__name__.startswith("std") else var


op("fmod")(lambda c, a: c.op("Mod", c.promote(a["self"], a["other"]), fmod=1))
op("mean")(_reduce("ReduceMean"))
op("sum")(_reduce("ReduceSum"))
op("amax")(_reduce("ReduceMax"))
op("amin")(_reduce("ReduceMin"))


def _extreme(reduce_op: str, elementwise: str, arg_op: str) -> Translator:
    """max/min: of all elements, elementwise with ``other``, or along ``dim`` with the first index."""
    def fn(c, a):
        x = a["self"]
        if "other" in a:
            return c.op(elementwise, c.promote(x, a["other"]))
        if "dim" not in a:
            return c.op(reduce_op, [x], axes=[], keepdims=0)
        values = _reduce(reduce_op)(c, {"self": x, "dim": a["dim"], "keepdim": a["keepdim"]})
        return values, _arg(arg_op)(c, a)
    return fn


def _arg(arg_op: str) -> Translator:
    """argmax/argmin: the first extreme (NaN counts as the largest, as in torch); no dim: of all elements."""
    def fn(c, a):
        x, dim = a["self"], a.get("dim")
        if dim is None or c.rank(x) == 0:
            flat = c.op("Reshape", [x], shape=[-1])
            return c.op("Reshape", [c.op(arg_op, [flat], axis=0, keepdims=0)], shape=list(c.out_shape))
        return c.op(arg_op, [x], axis=dim % c.rank(x), keepdims=int(a.get("keepdim", False)), select_last_index=0)
    return fn


op("max")(_extreme("ReduceMax", "Max", "ArgMax"))
op("min")(_extreme("ReduceMin", "Min", "ArgMin"))
op("argmax")(_arg("ArgMax"))
op("argmin")(_arg("ArgMin"))


# --- shapes -----------------------------------------------------------------------------------------
@op("view", "reshape", "_unsafe_view", "flatten", "unflatten", "view_as", "reshape_as")
def _reshape(c, a):
    """The target comes from torch's own result shape; the leading dimension is written 0 (copy)
    when it is unchanged, so the batch does not get baked into the attribute."""
    x = a["self"]
    src, target = c.shape(x), list(c.out_shape)
    if src == tuple(target):
        return x
    if 0 in target:  # nothing to copy: a Reshape attribute reads 0 as "keep the input's dimension"
        return c.const(np.zeros(target), c.out_dtype)
    if src and len(target) > 1 and target[0] == src[0]:
        target[0] = 0
    return c.op("Reshape", [x], shape=target)


op("permute")(lambda c, a: c.op("Transpose", [a["self"]], perm=[d % c.rank(a["self"]) for d in a["dims"]]))


@op("transpose", "t")
def _transpose(c, a):
    x, rank = a["self"], c.rank(a["self"])
    if rank < 2:
        return x
    perm = list(range(rank))
    i, j = a.get("dim0", 0) % rank, a.get("dim1", 1) % rank
    perm[i], perm[j] = perm[j], perm[i]
    return c.op("Transpose", [x], perm=perm)


@op("cat", "concat", "concatenate")
def _cat(c, a):
    """torch skips a 1-D empty operand of any other rank (its legacy rule)."""
    rank = len(c.out_shape)
    xs = [c.cast(t, c.out_dtype) for t in a["tensors"] if rank == 1 or c.shape(t) != (0,)]
    return c.op("Concat", xs, axis=a["dim"] % rank)


def _split_into(c, x, sizes: list[int], dim: int) -> tuple[str, ...]:
    return tuple(c.ops("Split", [x], len(sizes), axis=dim % c.rank(x), split=sizes))


@op("split", "split_with_sizes", "chunk")
def _split(c, a):
    x, dim = a["self"], a["dim"]
    sizes = [tuple(t.shape)[dim] for t in c.node.meta["val"]]  # torch's own pieces, every overload alike
    return _split_into(c, x, sizes, dim)


@op("unbind")
def _unbind(c, a):
    x, dim = a["self"], a["dim"] % c.rank(a["self"])
    parts = _split_into(c, x, [1] * c.shape(x)[dim], dim)
    return tuple(c.op("Squeeze", [p], axes=[dim]) for p in parts)


@op("slice")
def _slice(c, a):
    x, dim = a["self"], a["dim"] % c.rank(a["self"])
    size = c.shape(x)[dim]
    start, end, step = a["start"], a["end"], a["step"]
    start = 0 if start is None else min(max(start + size if start < 0 else start, 0), size)
    end = size if end is None else min(max(end + size if end < 0 else end, 0), size)
    if (start, end, step) == (0, size, 1):
        return x
    return c.op("Slice", [x], starts=[start], ends=[end], axes=[dim], steps=[step])


@op("select")
def _select(c, a):
    x, dim = a["self"], a["dim"] % c.rank(a["self"])
    index = a["index"] % c.shape(x)[dim]
    part = c.op("Slice", [x], starts=[index], ends=[index + 1], axes=[dim], steps=[1])
    return c.op("Squeeze", [part], axes=[dim])


@op("squeeze")
def _squeeze(c, a):
    x, shape = a["self"], c.shape(a["self"])
    dims = a.get("dim", list(range(len(shape))))
    dims = [dims] if isinstance(dims, int) else dims
    axes = sorted({d % len(shape) for d in dims if shape[d % len(shape)] == 1}) if shape else []
    return c.op("Squeeze", [x], axes=axes) if axes else x


op("unsqueeze")(lambda c, a: c.op("Unsqueeze", [a["self"]], axes=[a["dim"] % (c.rank(a["self"]) + 1)]))


@op("constant_pad_nd")
def _pad(c, a):
    x, pad = a["self"], list(a["pad"])
    rank = c.rank(x)
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return c.op("Pad", [x], pads=begins + ends, mode="constant", value=a["value"])


@op("index_select")
def _index_select(c, a):
    x = a["self"]
    if c.rank(x) == 0:  # a 0-d tensor selects as a row of one
        return c.op("Reshape", [c.op("Gather", [c.op("Unsqueeze", [x], axes=[0]), a["index"]], axis=0)], shape=[])
    return c.op("Gather", [x, a["index"]], axis=a["dim"] % c.rank(x))
op("embedding")(lambda c, a: c.op("Gather", [a["weight"], a["indices"]], axis=0))


@op("expand", "expand_as", "broadcast_to")
def _expand(c, a):
    """Dimensions that stay as they are are written 1 (ONNX Expand broadcasts), not baked in."""
    x, out = a["self"], list(c.out_shape)
    src = c.shape(x)
    if tuple(out) == src:
        return x
    lead = len(out) - len(src)
    shape = [1 if i >= lead and src[i - lead] == d else d for i, d in enumerate(out)]
    return c.op("Expand", [x], shape=shape)


@op("flip")
def _flip(c, a):
    """A Slice with step -1 along each flipped dimension (of size 2 or more)."""
    x, shape = a["self"], c.shape(a["self"])
    axes = sorted({d % len(shape) for d in a["dims"] if shape[d % len(shape)] > 1}) if shape else []
    if not axes:
        return x
    return c.op("Slice", [x], starts=[-1] * len(axes), ends=[-shape[d] - 1 for d in axes], axes=axes,
                steps=[-1] * len(axes))
