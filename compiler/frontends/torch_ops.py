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


def _pair(v, n: int = 2) -> list[int]:
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
op("rsqrt")(lambda c, a: c.op("Reciprocal", [c.op("Sqrt", [a["self"]])]))
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


def _binary(cuvil_op: str) -> Translator:
    def fn(c, a):
        x, y = c.promote(a["self"], a["other"])
        alpha = a.get("alpha", 1)
        if alpha != 1:
            y = c.op("Mul", [y, c.const(alpha, c.dtype(y))])
        if cuvil_op == "Div" and a.get("rounding_mode") is not None:
            if a["rounding_mode"] != "trunc" or c.dtype(x).is_float:
                raise Unsupported(f"rounding_mode={a['rounding_mode']!r}")
        return c.op(cuvil_op, [x, y])
    return fn


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


# --- linear algebra ---------------------------------------------------------------------------------
@op("linear")
def _linear(c, a):
    x, w, b = a["input"], a["weight"], a.get("bias")
    if c.rank(x) == 2:
        return c.op("Gemm", [x, w] + ([b] if b else []), transB=1)
    y = c.op("MatMul", [x, c.b.add1("Transpose", [w], name=f"{w}.T", perm=(1, 0))])
    return c.op("Add", [y, b]) if b else y


op("addmm")(lambda c, a: c.op("Gemm", [a["mat1"], a["mat2"], a["self"]], alpha=a["alpha"], beta=a["beta"]))
op("mm", "bmm", "matmul")(lambda c, a: c.op("MatMul", [a["self"], a.get("mat2", a.get("other"))]))


@op("scaled_dot_product_attention")
def _sdpa(c, a):
    """The math form: softmax(q k^T * scale + mask) v, in MatMul/Softmax ops."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a["dropout_p"] > 0 or a["enable_gqa"]:
        raise Unsupported("dropout_p > 0" if a["dropout_p"] > 0 else "enable_gqa")
    rank, dt = c.rank(k), c.dtype(q)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(c.shape(q)[-1])
    s = c.op("MatMul", [q, c.op("Transpose", [k], perm=perm)])
    s = c.op("Mul", [s, c.const(scale, dt)])
    if a["is_causal"]:
        n, m = c.shape(s)[-2:]
        s = c.op("Where", [c.const(np.tril(np.ones((n, m), dtype=bool)), DType.BOOL), s, c.const(-math.inf, dt)])
    if mask is not None:
        s = (c.op("Where", [mask, s, c.const(-math.inf, dt)]) if c.dtype(mask) is DType.BOOL
             else c.op("Add", c.promote(s, mask)))
    return c.op("MatMul", [c.op("Softmax", [s], axis=-1), v])


# --- nn ---------------------------------------------------------------------------------------------
@op("convolution", "conv1d", "conv2d", "conv3d")
def _conv(c, a):
    if a.get("transposed"):
        raise Unsupported("transposed convolution")
    if isinstance(a["padding"], str):
        raise Unsupported(f"padding={a['padding']!r}")
    n = c.rank(a["input"]) - 2
    pads = _pair(a["padding"], n)
    inputs = [a["input"], a["weight"]] + ([a["bias"]] if a["bias"] else [])
    return c.op("Conv", inputs, strides=_pair(a["stride"], n), pads=pads + pads,
                dilations=_pair(a["dilation"], n), group=a["groups"])


@op("_native_batch_norm_legit_no_training", "native_batch_norm", "batch_norm", "_native_batch_norm_legit")
def _batch_norm(c, a):
    if a.get("training") or a.get("running_mean") is None:
        raise Unsupported("training-mode batch norm")
    x, ch = a["input"], c.shape(a["input"])[1]
    dt = c.dtype(x)
    scale = a["weight"] or c.const(np.ones(ch), dt, hint="bn_scale")
    bias = a["bias"] or c.const(np.zeros(ch), dt, hint="bn_bias")
    y = c.op("BatchNormalization", [x, scale, bias, a["running_mean"], a["running_var"]], epsilon=a["eps"])
    return y if c.node.target.__name__.startswith("batch_norm") else (y, None, None)


@op("native_layer_norm", "layer_norm")
def _layer_norm(c, a):
    x, shape = a["input"], list(a["normalized_shape"])
    scale = a["weight"] or c.const(np.ones(shape), c.dtype(x), hint="ln_scale")
    inputs = [x, scale] + ([a["bias"]] if a["bias"] else [])
    y = c.op("LayerNormalization", inputs, axis=-len(shape), epsilon=a["eps"])
    return y if c.node.target.__name__.startswith("layer_norm") else (y, None, None)


@op("max_pool2d_with_indices", "max_pool2d")
def _max_pool(c, a):
    k = _pair(a["kernel_size"])
    pads = _pair(a["padding"])
    y = c.op("MaxPool", [a["self"]], kernel_shape=k, strides=_pair(a["stride"]) if a["stride"] else k,
             pads=pads + pads, dilations=_pair(a["dilation"]), ceil_mode=int(a["ceil_mode"]))
    return (y, None) if c.node.target.__name__.startswith("max_pool2d_with_indices") else y


@op("avg_pool2d")
def _avg_pool(c, a):
    if a["divisor_override"] is not None:
        raise Unsupported("divisor_override")
    k = _pair(a["kernel_size"])
    pads = _pair(a["padding"])
    return c.op("AveragePool", [a["self"]], kernel_shape=k, strides=_pair(a["stride"]) if a["stride"] else k,
                pads=pads + pads, ceil_mode=int(a["ceil_mode"]), count_include_pad=int(a["count_include_pad"]))


@op("adaptive_avg_pool2d", "_adaptive_avg_pool2d")
def _adaptive_avg_pool(c, a):
    x, out = a["self"], _pair(a["output_size"])
    if out == [1, 1]:
        return c.op("GlobalAveragePool", [x])
    h, w = c.shape(x)[-2:]
    if h % out[0] or w % out[1]:
        raise Unsupported(f"output size {out} does not divide {h}x{w}")
    k = [h // out[0], w // out[1]]
    return c.op("AveragePool", [x], kernel_shape=k, strides=k, pads=[0, 0, 0, 0])


def _softmax_like(cuvil_op: str) -> Translator:
    return lambda c, a: c.op(cuvil_op, [c.cast(a["self"], c.out_dtype)], axis=a["dim"])


op("_softmax", "softmax")(_softmax_like("Softmax"))
op("_log_softmax", "log_softmax")(_softmax_like("LogSoftmax"))


# --- reductions ------------------------------------------------------------------------------------
def _reduce(cuvil_op: str) -> Translator:
    def fn(c, a):
        x = c.cast(a["self"], c.out_dtype)
        rank, dims = c.rank(x), a.get("dim")
        axes = sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims or []))
        keep = int(a.get("keepdim", False))
        if cuvil_op == "ReduceMean" and rank == 4 and axes == [2, 3] and keep and c.out_dtype.is_float:
            return c.op("GlobalAveragePool", [x])
        return c.op(cuvil_op, [x], axes=axes, keepdims=keep)
    return fn


op("mean")(_reduce("ReduceMean"))
op("sum")(_reduce("ReduceSum"))
op("amax")(_reduce("ReduceMax"))


@op("max")
def _max(c, a):
    if "dim" in a:
        raise Unsupported("max with indices (argmax)")
    if "other" in a:
        return c.op("Max", c.promote(a["self"], a["other"]))
    return c.op("ReduceMax", [a["self"]], axes=[], keepdims=0)


# --- shapes -----------------------------------------------------------------------------------------
@op("view", "reshape", "_unsafe_view", "flatten", "unflatten", "view_as", "reshape_as")
def _reshape(c, a):
    """The target comes from torch's own result shape; the leading dimension is written 0 (copy)
    when it is unchanged, so the batch does not get baked into the attribute."""
    x = a["self"]
    src, target = c.shape(x), list(c.out_shape)
    if src == tuple(target):
        return x
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
    xs = [c.cast(t, c.out_dtype) for t in a["tensors"]]
    return c.op("Concat", xs, axis=a["dim"] % c.rank(xs[0]))


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


op("index_select")(lambda c, a: c.op("Gather", [a["self"], a["index"]], axis=a["dim"] % c.rank(a["self"])))
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
