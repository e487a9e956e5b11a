"""ONNX op_type -> translator: one small function per ONNX op, found through :data:`TABLE`.

A translator gets a :class:`~cuvil.compiler.frontends.onnx.NodeCtx` (the node's attributes with
bytes decoded, its inputs as Cuvil values, the opset) and returns one entry per ONNX output: a
Cuvil value name, ``None`` (not produced: an error later only if something uses it) or a
:class:`Probe` (a batch-dependent shape value, see the ``onnx`` module docstring). Everything ONNX
passes as a constant input becomes a static attribute here, with the opset deciding where it lives.
Raising :class:`~cuvil.compiler.frontends.builder.Unsupported` records the node in the one error
listing everything unsupported. Every op of the op table with the ``same_as_onnx`` trait imports as it
is (:func:`_direct`); ONNX ops outside the op set that exporters use for shape arithmetic are
:func:`evaluated` over known inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx.defs

from ..errors import CuvilError
from ..ir.dtypes import DType
from ..ir.types import Batch
from ..ops import OP_TABLE, REQUIRED
from .builder import MAX_FOLDED_ELEMENTS, Unsupported
from .onnx_node import NodeCtx, OnnxImportError, onnx_dtype


def check_size(ctx: NodeCtx, shape: list[int]) -> None:
    if any(d < 0 for d in shape) or math.prod(shape) > MAX_FOLDED_ELEMENTS:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): shape {shape} is negative or too large to build")


def evaluate_foreign(node, opset: int, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """One :func:`evaluated` node over constant inputs, by ONNX's own reference implementation."""
    from onnx.reference import ReferenceEvaluator  # slow to import: only models that need it pay

    count = max((v.size for v in values.values()), default=1)
    if node.op_type == "Range":
        start, limit, delta = (float(values[i].reshape(-1)[0]) for i in node.input[:3])
        count = math.ceil((limit - start) / delta) if delta else math.inf
    if count > MAX_FOLDED_ELEMENTS:
        raise OnnxImportError(f"node {node.name!r} ({node.op_type}) would build {count} elements")
    outs = [np.asarray(o) for o in ReferenceEvaluator(node, opsets={"": opset}).run(None, values)]
    for o in outs:
        try:
            DType.from_numpy(o.dtype)
        except CuvilError:
            raise Unsupported(f"dtype {o.dtype}") from None
    return outs


Translator = Callable[[NodeCtx], list]
TABLE: dict[str, Translator] = {}


VERSIONS: dict[str, tuple[int, ...]] = {}
"""ONNX op -> the op versions (``since_version`` of its ``onnx.defs`` schemas) whose meaning its
translator implements; a node of another version is unsupported (or expanded, see ``onnx``)."""


def translates(**versions: tuple[int, ...]):
    """Register a translator for each op named, with the op versions it implements."""

    def register(fn: Translator) -> Translator:
        for name, implemented in versions.items():
            if name in TABLE:
                raise RuntimeError(f"ONNX op {name} translated twice")
            TABLE[name] = fn
            VERSIONS[name] = tuple(implemented)
        return fn

    return register


def every_version(op: str) -> tuple[int, ...]:
    """All versions ONNX defines of ``op`` (for ops ONNX's own reference implementation evaluates)."""
    return tuple(sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                         if s.name == op and s.domain == ""}))


# --- ops of the op table that ONNX defines alike, and ONNX ops evaluated at import ---------------


_UNARY = (6, 13)  # v6 dropped the legacy consumed_inputs; later versions add types only
_BINARY = (7, 13, 14)  # v7 replaced the legacy broadcast/axis attributes with NumPy broadcasting
DIRECT_VERSIONS = {
    "Relu": (6, 13, 14), "Sigmoid": _UNARY, "Tanh": _UNARY, "Erf": (9, 13), "Sqrt": _UNARY, "Exp": _UNARY,
    "Log": _UNARY, "Neg": _UNARY, "Abs": _UNARY, "Reciprocal": _UNARY, "Identity": (1, 13, 14, 16, 19, 21, 23, 24, 25),
    "Add": _BINARY, "Sub": _BINARY, "Mul": _BINARY, "Div": _BINARY, "Sum": (8, 13), "Max": (8, 12, 13),
    "Min": (8, 12, 13), "Equal": (7, 11, 13, 19), "Less": (7, 9, 13), "Greater": (7, 9, 13), "Where": (9, 16),
    "HardSwish": (14, 22), "GlobalAveragePool": (1, 22), "MatMul": (1, 9, 13),
    "LeakyRelu": (6, 16), "HardSigmoid": (6, 22), "Gelu": (20,), "LRN": (1, 13), "Gemm": (7, 9, 11, 13),
    "Flatten": (1, 9, 11, 13, 21, 23, 24, 25), "Concat": (4, 11, 13), "Gather": (1, 11, 13),
    "And": (7,), "Or": (7,), "Xor": (7,), "Not": (1,), "BitwiseAnd": (18,), "BitwiseOr": (18,),
    "BitwiseXor": (18,), "BitwiseNot": (18,), "BitShift": (11, 28), "GreaterOrEqual": (12, 16),
    "LessOrEqual": (12, 16), "ArgMax": (1, 11, 12, 13), "ArgMin": (1, 11, 12, 13), "IsNaN": (9, 13, 20), "IsInf": (10, 20), "Floor": _UNARY, "Ceil": _UNARY,
    "Round": (11, 22), "Sign": (9, 13), "Mod": (10, 13, 28), "Mean": (8, 13), "GatherElements": (11, 13),
    "ScatterElements": (11, 13, 16, 18), "ScatterND": (11, 13, 16, 18), "GatherND": (11, 12, 13),
    **{op: (7, 22) for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan")},
    **{op: (9, 22) for op in ("Sinh", "Cosh", "Asinh", "Acosh", "Atanh")},
}
"""The op versions each ``same_as_onnx`` op of the op table implements (every such op needs one)."""


@translates(**{name: DIRECT_VERSIONS[name] for name, op in OP_TABLE.items() if op.same_as_onnx})
def _direct(ctx: NodeCtx) -> list:
    """The op itself, its attributes copied with the op table's defaults (which are ONNX's)."""
    spec = OP_TABLE[ctx.op].attrs
    attrs = {k: ctx.attr(k) if s.default is REQUIRED else ctx.attr(k, s.default) for k, s in spec.items()}
    return [ctx.emit(ctx.op, ctx.xs(), **attrs)]


@translates(**{op: every_version(op) for op in ("Range",)})
def evaluated(ctx: NodeCtx) -> list:
    """ONNX ops outside op set v1 that exporters use for shape arithmetic: the importer evaluates them
    (:func:`evaluate_foreign`) when every input is known, and reports them unsupported otherwise;
    it never calls this translator."""
    raise Unsupported("not evaluated over known inputs")


@translates(Scatter=(9, 11))
def _scatter(ctx: NodeCtx) -> list:
    """Scatter is ScatterElements' name before opset 11."""
    return [ctx.emit("ScatterElements", ctx.xs(), axis=ctx.attr("axis", 0))]


@translates(Trilu=(14,))
def _trilu(ctx: NodeCtx) -> list:
    return [ctx.emit("Trilu", [ctx.x(0)], upper=ctx.attr("upper", 1), k=int(ctx.scalar(1, 0)))]


@translates(CumSum=(11, 14), CumProd=(26,))
def _cumulative(ctx: NodeCtx) -> list:
    return [ctx.emit(ctx.op, [ctx.x(0)], axis=int(ctx.scalar(1, 0)), exclusive=ctx.attr("exclusive", 0),
                     reverse=ctx.attr("reverse", 0))]


@translates(Pow=(7, 12, 13, 15))
def _pow(ctx: NodeCtx) -> list:
    base, exp = ctx.x(0), ctx.x(1)
    if ctx.type(1).dtype != ctx.type(0).dtype:  # ONNX allows a differently typed exponent
        exp = ctx.tmp("Cast", [exp], "exp_cast", to=ctx.type(0).dtype)
    return [ctx.emit("Pow", [base, exp])]


@translates(PRelu=(7, 9, 16))
def _prelu(ctx: NodeCtx) -> list:
    x, slope, t, st = ctx.x(0), ctx.x(1), ctx.type(0), ctx.type(1)
    if st.rank == 1 and t.rank > 2 and st.shape[0] not in (1, t.shape[-1]) and st.shape[0] == t.shape[1]:
        # a per-channel slope as opsets before 7 wrote it (lifted models keep it so)
        slope = ctx.tmp("Reshape", [slope], "slope", shape=[-1] + [1] * (t.rank - 2))
    zero = ctx.constant(np.zeros((), t.dtype.numpy), "zero")
    negative = ctx.tmp("Less", [x, zero], "negative")
    scaled = ctx.tmp("Mul", [x, slope], "scaled")
    return [ctx.emit("Where", [negative, scaled, x])]


@translates(Cast=(6, 9, 13, 19, 21, 23, 24, 25, 28), CastLike=(15, 19, 21, 23, 24, 25))
def _cast(ctx: NodeCtx) -> list:
    to = ctx.type(1).dtype if ctx.op == "CastLike" else onnx_dtype(ctx.attr("to"))
    return [ctx.emit("Cast", [ctx.x(0)], to=to, saturate=ctx.attr("saturate", 1),
                     round_mode=ctx.attr("round_mode", "up"))]


@translates(BitCast=(26,))
def _bitcast(ctx: NodeCtx) -> list:
    return [ctx.emit("BitCast", [ctx.x(0)], to=onnx_dtype(ctx.attr("to")))]


@translates(Clip=(6, 11, 12, 13))
def _clip(ctx: NodeCtx) -> list:
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", -math.inf), ctx.attr("max", math.inf)
    elif not ctx.type(0).dtype.is_float:  # Cuvil's Clip is float-only; integer bounds are Max then Min
        y = ctx.x(0)
        for i, op in ((1, "Max"), (2, "Min")):
            if ctx.has(i):
                y = ctx.tmp(op, [y, ctx.x(i)], op.lower())
        return [ctx.emit("Identity", [y])]
    else:
        lo, hi = ctx.scalar(1, -math.inf), ctx.scalar(2, math.inf)
    return [ctx.emit("Clip", [ctx.x(0)], min=lo, max=hi)]


@translates(Dropout=(7, 10, 12, 13, 22))
def _dropout(ctx: NodeCtx) -> list:
    """Inference, or training with ratio 0, drops nothing: the mask is all true."""
    ratio = ctx.attr("ratio", 0.5) if ctx.opset < 12 else ctx.scalar(1, 0.5)
    if ctx.opset >= 12 and ctx.scalar(2, False) and ratio != 0:
        raise Unsupported("training_mode=1")
    y = ctx.emit("Dropout", [ctx.x(0)], ratio=ratio)
    t = ctx.type(0)
    if len(ctx.outputs) < 2 or not ctx.outputs[1] or not t.is_static:
        return [y]
    check_size(ctx, list(t.shape))
    return [y, ctx.constant(np.ones(t.shape, bool), f"{ctx.name}/mask")]


# --- convolution, pooling, normalisation ---------------------------------------------------------


def window(ctx: NodeCtx, kernel: list[int], dilations: list[int]) -> tuple[list[int], list[int]]:
    """Default strides, and auto_pad resolved into explicit pads (begins then ends)."""
    nd = len(kernel)
    strides = list(ctx.attr("strides", [1] * nd))
    mode = ctx.attr("auto_pad", "NOTSET")
    if mode == "NOTSET":
        return strides, list(ctx.attr("pads", [0] * 2 * nd))
    if mode == "VALID":
        return strides, [0] * 2 * nd
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise OnnxImportError(f"node {ctx.name!r}: unknown auto_pad {mode!r}")
    begins, ends = [], []
    for size, k, s, d in zip(ctx.type(0).shape[2:], kernel, strides, dilations):
        if isinstance(size, Batch):
            ctx.batch_dependent("auto_pad over the batch dimension")
        total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else big)
        ends.append(big if mode == "SAME_UPPER" else small)
    return strides, begins + ends


def conv_window(ctx: NodeCtx, weight_spatial) -> dict:
    """Conv's (and QLinearConv's) window attributes: strides, pads, dilations, group."""
    kernel = list(ctx.attr("kernel_shape", weight_spatial))
    dilations = list(ctx.attr("dilations", [1] * len(kernel)))
    strides, pads = window(ctx, kernel, dilations)
    return dict(strides=strides, pads=pads, dilations=dilations, group=ctx.attr("group", 1))


@translates(Conv=(1, 11, 22))
def _conv(ctx: NodeCtx) -> list:
    return [ctx.emit("Conv", ctx.xs(), **conv_window(ctx, ctx.type(1).shape[2:]))]


@translates(GlobalMaxPool=(1, 22))
def _global_max_pool(ctx: NodeCtx) -> list:
    return [ctx.emit("ReduceMax", [ctx.x(0)], axes=list(range(2, ctx.type(0).rank)), keepdims=1)]


@translates(BatchNormalization=(9, 14, 15))
def _batch_norm(ctx: NodeCtx) -> list:
    if ctx.attr("training_mode", 0):
        raise Unsupported("training_mode=1")
    return [ctx.emit("BatchNormalization", ctx.xs()[:5], epsilon=ctx.attr("epsilon", 1e-5))]


@translates(LayerNormalization=(17,))
def _layer_norm(ctx: NodeCtx) -> list:
    return [ctx.emit("LayerNormalization", ctx.xs(), axis=ctx.attr("axis", -1), epsilon=ctx.attr("epsilon", 1e-5))]


@translates(Softmax=(1, 11, 13), LogSoftmax=(1, 11, 13))
def _softmax(ctx: NodeCtx) -> list:
    x, t = ctx.x(0), ctx.type(0)
    axis = ctx.attr("axis", -1 if ctx.opset >= 13 else 1)
    axis += t.rank if axis < 0 else 0
    if ctx.opset >= 13 or axis == t.rank - 1:
        return [ctx.emit(ctx.op, [x], axis=axis)]
    # Before opset 13 the op works on the input coerced to 2-D at `axis`: flatten, normalise, restore.
    flat = ctx.tmp("Flatten", [x], "2d", axis=axis)
    y = ctx.tmp(ctx.op, [flat], "2d_out", axis=-1)
    return [ctx.emit("Reshape", [y], shape=ctx.reshape_attr(list(t.shape), t))]


# --- reductions ----------------------------------------------------------------------------------

_AXES_INPUT_FROM = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18}


def _reduce_axes(ctx: NodeCtx, input_from: int) -> list[int] | None:
    """The axes a reduction reduces (an attribute, an input from opset ``input_from``); None where none are
    given and ``noop_with_empty_axes`` says the reduction is the identity then."""
    if ctx.opset >= input_from:
        axes = [int(a) for a in ctx.const(1).reshape(-1)] if ctx.has(1) else []
    else:
        axes = list(ctx.attr("axes", []))
    return None if not axes and ctx.attr("noop_with_empty_axes", 0) else axes


@translates(ReduceSum=(1, 11, 13), ReduceMean=(1, 11, 13, 18), ReduceMax=(1, 11, 12, 13, 18, 20),
            ReduceMin=(1, 11, 12, 13, 18, 20), ReduceProd=(1, 11, 13, 18))
def _reduce(ctx: NodeCtx) -> list:
    axes = _reduce_axes(ctx, _AXES_INPUT_FROM[ctx.op])
    if axes is None:
        return [ctx.emit("Identity", [ctx.x(0)])]
    return [ctx.emit(ctx.op, [ctx.x(0)], axes=axes, keepdims=ctx.attr("keepdims", 1))]


# op -> (what is summed, what is taken of the sum): as ONNX's function bodies, defined from opset 18 only
_COMPOSED = {"ReduceL1": ("Abs", None), "ReduceL2": ("Square", "Sqrt"), "ReduceSumSquare": ("Square", None),
             "ReduceLogSum": (None, "Log"), "ReduceLogSumExp": ("Exp", "Log")}


@translates(**{op: (1, 11, 13, 18, 28) if op.startswith("ReduceLog") else (1, 11, 13, 18) for op in _COMPOSED})
def _reduce_composed(ctx: NodeCtx) -> list:
    """A sum of |x|, x*x, x or exp(x), then its sqrt or log (``F.normalize``, ``torch.norm`` and ``logsumexp``
    export these at opset 17). LogSumExp takes each slice's finite maximum out first, as ONNX Runtime and
    torch do: exp(x) overflowed from x = 89."""
    axes, keep = _reduce_axes(ctx, 18), ctx.attr("keepdims", 1)
    each, of_sum = _COMPOSED[ctx.op]
    x, shift = ctx.x(0), None
    if ctx.op == "ReduceLogSumExp":
        top = x if axes is None else ctx.tmp("ReduceMax", [x], "max", axes=axes, keepdims=1)
        zero = ctx.constant(np.array(0, ctx.type(0).dtype.numpy), "zero")
        shift = ctx.tmp("Where", [ctx.tmp("IsInf", [top], "max_inf"), zero, top], "shift")
        x = ctx.tmp("Sub", [x, shift], "shifted")
    if each is not None:
        x = ctx.tmp("Mul", [x, x], "square") if each == "Square" else ctx.tmp(each, [x], each.lower())
    total = x if axes is None else ctx.tmp("ReduceSum", [x], "sum", axes=axes, keepdims=keep)
    if of_sum is None:
        return [ctx.emit("Identity", [total])]
    if shift is None:
        return [ctx.emit(of_sum, [total])]
    if axes is not None and not keep:
        shift = ctx.tmp("ReduceMax", [shift], "shift_kept", axes=axes, keepdims=0)
    return [ctx.emit("Add", [ctx.tmp(of_sum, [total], "log"), shift])]
