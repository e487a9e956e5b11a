"""Elementwise kernels: one broadcasting loop nest, one scalar function per op from a table.

Broadcast dimensions get stride 0, adjacent dimensions that every operand walks contiguously are
merged, so the innermost loop is as long as possible and each operand is either contiguous or
loop-invariant there: the shape LLVM's loop vectorizer turns into full-width vector code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from llvmlite import ir

from ...ir.dtypes import DType
from ...ops.fused import parse_program
from .. import activations as act
from .. import irhelpers as h
from .. import mathfns as m
from .base import KernelContext, kernel, unsupported

Scalar = Callable[[ir.IRBuilder, Sequence[ir.Value], Mapping, DType], ir.Value]


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a contiguous ``shape`` read at ``out_shape`` positions (0: broadcast)."""
    pad = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = h.contiguous_strides(pad)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(pad, out_shape, strides))


def collapse(out_shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dimensions every operand walks as one; drop size-1 dimensions."""
    dims = [i for i, d in enumerate(out_shape) if d != 1]
    shape: list[int] = []
    cols: list[list[int]] = [[] for _ in strides]
    for i in dims:
        d = out_shape[i]
        if shape and all(col[-1] == st[i] * d for col, st in zip(cols, strides)):
            shape[-1] *= d
            for col, st in zip(cols, strides):
                col[-1] = st[i]
            continue
        shape.append(d)
        for col, st in zip(cols, strides):
            col.append(st[i])
    return tuple(shape), [tuple(c) for c in cols]


def emit_map(ctx: KernelContext, fn: Callable[[list[ir.Value]], ir.Value], inputs: Sequence[int]) -> None:
    """out[i] = fn(in_k[broadcast(i)] for k in inputs) over the output's shape."""
    out_shape = ctx.out_shape
    strides = [broadcast_strides(ctx.out_shape, out_shape)] + [broadcast_strides(ctx.shape(i), out_shape) for i in inputs]
    shape, cols = collapse(out_shape, strides)
    b = ctx.b
    with h.loop_nest(b, shape) as idx:
        vals = [ctx.read(i, h.linear(b, idx, col)) for i, col in zip(inputs, cols[1:])]
        h.store(b, fn(vals), ctx.outs[0], h.linear(b, idx, cols[0]))


# ------------------------------------------------------------------------------- scalar table ---
def _fl(fn: Callable[..., ir.Value]) -> Scalar:
    """A float-only scalar function of (builder, *args, attrs)."""
    return lambda b, xs, a, dt: fn(b, *xs, a)


def _by_kind(flt: Scalar, sint: Scalar, uint: Scalar | None = None) -> Scalar:
    def pick(b, xs, a, dt):
        if dt.is_float:
            return flt(b, xs, a, dt)
        return (sint if dt in h.SIGNED or uint is None else uint)(b, xs, a, dt)

    return pick


def _safe_sdiv(b, x, y):
    zero = ir.Constant(y.type, 0)
    return b.sdiv(x, b.select(b.icmp_signed("==", y, zero), ir.Constant(y.type, 1), y))


def _safe_udiv(b, x, y):
    zero = ir.Constant(y.type, 0)
    return b.udiv(x, b.select(b.icmp_unsigned("==", y, zero), ir.Constant(y.type, 1), y))


def _cmp(fop: str, sop: str) -> Scalar:
    def fn(b, xs, a, dt):
        x, y = xs
        if dt.is_float:
            c = b.fcmp_ordered(fop, x, y) if fop != "!=" else b.fcmp_unordered(fop, x, y)
        elif dt in h.SIGNED:
            c = b.icmp_signed(sop, x, y)
        else:
            c = b.icmp_unsigned(sop, x, y)
        return b.zext(c, h.I8)

    return fn


def _minmax(pred: str, intrinsic: str) -> Scalar:
    def fn(b, xs, a, dt):
        acc = xs[0]
        for y in xs[1:]:
            if dt.is_float:
                acc = h.call_intrinsic(b, intrinsic, acc, y)
            else:
                cmp = b.icmp_signed if dt in h.SIGNED else b.icmp_unsigned
                acc = b.select(cmp(pred, acc, y), acc, y)
        return acc

    return fn


def _fold(fop: str, iop: str) -> Scalar:
    def fn(b, xs, a, dt):
        acc = xs[0]
        for y in xs[1:]:
            acc = getattr(b, fop if dt.is_float else iop)(acc, y)
        return acc

    return fn


SCALAR: dict[str, Scalar] = {
    "Relu": _by_kind(_fl(lambda b, x, a: act.relu(b, x)), lambda b, xs, a, dt: b.select(b.icmp_signed("<", xs[0], ir.Constant(xs[0].type, 0)), ir.Constant(xs[0].type, 0), xs[0]),
                     lambda b, xs, a, dt: xs[0]),
    "Clip": _fl(lambda b, x, a: m.clamp(b, x, a["min"], a["max"])),
    "LeakyRelu": _fl(lambda b, x, a: act.leaky_relu(b, x, a["alpha"])),
    "Sigmoid": _fl(lambda b, x, a: m.sigmoid(b, x)),
    "Tanh": _fl(lambda b, x, a: m.tanh(b, x)),
    "SiLU": _fl(lambda b, x, a: act.silu(b, x)),
    "HardSigmoid": _fl(lambda b, x, a: act.hard_sigmoid(b, x, a["alpha"], a["beta"])),
    "HardSwish": _fl(lambda b, x, a: act.hard_swish(b, x)),
    "Gelu": _fl(lambda b, x, a: (act.gelu_tanh if a["approximate"] == "tanh" else act.gelu)(b, x)),
    "Erf": _fl(lambda b, x, a: m.erf(b, x)),
    "Sqrt": _fl(lambda b, x, a: h.call_intrinsic(b, "llvm.sqrt", x)),
    "Exp": _fl(lambda b, x, a: m.exp(b, x)),
    "Log": _fl(lambda b, x, a: m.log(b, x)),
    "Reciprocal": _fl(lambda b, x, a: b.fdiv(m.fconst(x, 1.0), x)),
    "Neg": _by_kind(_fl(lambda b, x, a: b.fneg(x)), lambda b, xs, a, dt: b.sub(ir.Constant(xs[0].type, 0), xs[0])),
    "Abs": _by_kind(_fl(lambda b, x, a: h.call_intrinsic(b, "llvm.fabs", x)),
                    lambda b, xs, a, dt: b.select(b.icmp_signed("<", xs[0], ir.Constant(xs[0].type, 0)), b.sub(ir.Constant(xs[0].type, 0), xs[0]), xs[0]),
                    lambda b, xs, a, dt: xs[0]),
    "Expand": lambda b, xs, a, dt: xs[0],
    "Add": _fold("fadd", "add"),
    "Sum": _fold("fadd", "add"),
    "Sub": _fold("fsub", "sub"),
    "Mul": _fold("fmul", "mul"),
    "Div": _by_kind(_fl(lambda b, x, y, a: b.fdiv(x, y)), lambda b, xs, a, dt: _safe_sdiv(b, *xs),
                    lambda b, xs, a, dt: _safe_udiv(b, *xs)),
    "Pow": _fl(lambda b, x, y, a: m.pow_(b, x, y)),
    "Max": _minmax(">", "llvm.maximum"),
    "Min": _minmax("<", "llvm.minimum"),
    "Equal": _cmp("==", "=="),
    "Less": _cmp("<", "<"),
    "Greater": _cmp(">", ">"),
}
FLOAT_ONLY = frozenset({"Clip", "LeakyRelu", "Sigmoid", "Tanh", "SiLU", "HardSigmoid", "HardSwish", "Gelu", "Erf",
                        "Sqrt", "Exp", "Log", "Reciprocal", "Pow"})


def check_dtype(op: str, dtype: DType) -> None:
    if op in FLOAT_ONLY and dtype not in (DType.F32, DType.F64):
        raise unsupported(op, f"native kernel supports f32/f64 only, got {dtype.value}")


def scalar_fn(op: str, attrs: Mapping, dtype: DType) -> Callable[[ir.IRBuilder, list[ir.Value]], ir.Value]:
    check_dtype(op, dtype)
    fn = SCALAR[op]
    return lambda b, xs: fn(b, xs, attrs, dtype)


@kernel(*SCALAR, scalars=True, inplace=True)
def emit_elementwise(ctx: KernelContext) -> None:
    fn = scalar_fn(ctx.key.op, ctx.attrs, ctx.in_types[0].dtype)
    emit_map(ctx, lambda xs: fn(ctx.b, xs), range(len(ctx.in_types)))


@kernel("Where", scalars=True, inplace=True)
def emit_where(ctx: KernelContext) -> None:
    b = ctx.b
    emit_map(ctx, lambda xs: b.select(b.icmp_unsigned("!=", xs[0], ir.Constant(h.I8, 0)), xs[1], xs[2]), range(3))


@kernel("FusedElementwise", scalars=True, inplace=True)
def emit_fused_elementwise(ctx: KernelContext) -> None:
    steps = parse_program(ctx.attrs["program"])
    dtype = ctx.in_types[0].dtype
    fns = [scalar_fn(s.op, dict(s.attrs), dtype) for s in steps]

    def run(xs: list[ir.Value]) -> ir.Value:
        slots = list(xs)
        for s, fn in zip(steps, fns):
            slots.append(fn(ctx.b, [slots[i] for i in s.args]))
        return slots[-1]

    emit_map(ctx, run, range(len(ctx.in_types)))


# ---------------------------------------------------------------------------------------- Cast ---
def _cast(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """NumPy ``astype`` semantics (float->int truncates; anything->bool is != 0)."""
    st, dt = h.LLTYPE[src], h.LLTYPE[dst]
    if dst is DType.BOOL:
        nz = b.fcmp_unordered("!=", x, h.const(st, 0)) if src.is_float else b.icmp_unsigned("!=", x, ir.Constant(st, 0))
        return b.zext(nz, h.I8)
    if src.is_float and dst.is_float:
        if st == dt:
            return x
        return b.fpext(x, dt) if _width(st) < _width(dt) else b.fptrunc(x, dt)
    if src.is_float:
        return b.fptosi(x, dt) if dst in h.SIGNED else b.fptoui(x, dt)
    if dst.is_float:
        return b.sitofp(x, dt) if src in h.SIGNED else b.uitofp(x, dt)
    if st.width == dt.width:
        return x
    if st.width > dt.width:
        return b.trunc(x, dt)
    return b.sext(x, dt) if src in h.SIGNED else b.zext(x, dt)


def _width(t: ir.Type) -> int:
    return {"half": 16, "float": 32, "double": 64}[str(t)]


@kernel("Cast", scalars=True)
def emit_cast(ctx: KernelContext) -> None:
    src, dst = ctx.in_types[0].dtype, ctx.out_types[0].dtype
    emit_map(ctx, lambda xs: _cast(ctx.b, xs[0], src, dst), [0])
