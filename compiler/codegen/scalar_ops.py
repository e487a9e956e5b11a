"""Element emitters: how one element of each elementwise op is computed, shared by both backends.

An emitter ``fn(builder, operands, attrs, dtype) -> value`` builds the IR for one output element
from one element of each operand (``dtype`` is the operands' dtype). The CPU kernels run it inside a
vectorizable loop nest (``kernels/elementwise.py``), the NVPTX kernels once per thread, the fused
epilogues through ``activations.py``. Which ops are elementwise, fusable or float-only is the op
table's business; this table holds only the code, plus one backend fact per emitter: those built on
the polynomial math of ``mathfns`` (:func:`_fl`) exist for f32 and f64 only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llvmlite import ir

from ..errors import CompileError
from ..ir.dtypes import DType
from . import irhelpers as h
from . import mathfns as m
from .halfprec import float_convert

Scalar = Callable[[ir.IRBuilder, Sequence[ir.Value], Mapping, DType], ir.Value]


@dataclass(frozen=True)
class _FloatMath:
    """An emitter of f32/f64 math: f16 and integer operands have no native code."""

    fn: Callable[..., ir.Value]

    def __call__(self, b: ir.IRBuilder, xs: Sequence[ir.Value], a: Mapping, dt: DType) -> ir.Value:
        return self.fn(b, *xs, a)


def _fl(fn: Callable[..., ir.Value]) -> Scalar:
    """A float-only emitter of (builder, *args, attrs)."""
    return _FloatMath(fn)


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


ELEMENT_EMITTERS: Mapping[str, Scalar] = {
    "Relu": _by_kind(_fl(lambda b, x, a: m.relu(b, x)), lambda b, xs, a, dt: b.select(b.icmp_signed("<", xs[0], ir.Constant(xs[0].type, 0)), ir.Constant(xs[0].type, 0), xs[0]),
                     lambda b, xs, a, dt: xs[0]),
    "Clip": _fl(lambda b, x, a: m.clamp(b, x, a["min"], a["max"])),
    "LeakyRelu": _fl(lambda b, x, a: m.leaky_relu(b, x, a["alpha"])),
    "Sigmoid": _fl(lambda b, x, a: m.sigmoid(b, x)),
    "Tanh": _fl(lambda b, x, a: m.tanh(b, x)),
    "SiLU": _fl(lambda b, x, a: m.silu(b, x)),
    "HardSigmoid": _fl(lambda b, x, a: m.hard_sigmoid(b, x, a["alpha"], a["beta"])),
    "HardSwish": _fl(lambda b, x, a: m.hard_swish(b, x)),
    "Gelu": _fl(lambda b, x, a: (m.gelu_tanh if a["approximate"] == "tanh" else m.gelu)(b, x)),
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
"""op -> element emitter. Every op listed gets the generic elementwise kernel in both backends."""


def scalar_fn(op: str, attrs: Mapping, dtype: DType) -> Callable[[ir.IRBuilder, list[ir.Value]], ir.Value]:
    """``fn(builder, operands)`` for one element of ``op``; CompileError where no native code exists.

    f16 is computed in f32 and rounded once (for one +, -, *, / or sqrt that equals half arithmetic:
    f32 has the 2p+2 bits that make the double rounding exact)."""
    fn = ELEMENT_EMITTERS[op]
    if isinstance(fn, _FloatMath) and not dtype.is_float:
        raise CompileError(f"{op}: native kernel supports float types only, got {dtype.value}")
    if dtype is DType.F16:
        def in_f32(b: ir.IRBuilder, xs: list[ir.Value]) -> ir.Value:
            y = fn(b, [b.fpext(x, h.F32) if x.type == h.F16 else x for x in xs], attrs, DType.F32)
            return b.fptrunc(y, h.F16) if y.type == h.F32 else y

        return in_f32
    return lambda b, xs: fn(b, xs, attrs, dtype)


def cast_value(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """NumPy ``astype`` semantics (float->int truncates; anything->bool is != 0)."""
    st, dt = h.LLTYPE[src], h.LLTYPE[dst]
    if dst is DType.BOOL:
        nz = b.fcmp_unordered("!=", x, h.const(st, 0)) if src.is_float else b.icmp_unsigned("!=", x, ir.Constant(st, 0))
        return b.zext(nz, h.I8)
    if src.is_float and dst.is_float:
        return float_convert(b, x, dt)
    if src.is_float:
        return b.fptosi(x, dt) if dst in h.SIGNED else b.fptoui(x, dt)
    if dst.is_float:
        return b.sitofp(x, dt) if src in h.SIGNED else b.uitofp(x, dt)
    if st.width == dt.width:
        return x
    if st.width > dt.width:
        return b.trunc(x, dt)
    return b.sext(x, dt) if src in h.SIGNED else b.zext(x, dt)
