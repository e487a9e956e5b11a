"""Per-op GPU element code: each op gives the grid-stride loops of its kernel (``module.Loop``).

One thread computes one output element from static shapes: elementwise ops through the element
emitters both backends share (``scalar_ops``; the polynomial math of ``mathfns`` needs no libm, so it runs on NVPTX
too), windowed ops (Conv, pools, LRN) and reductions (Gemm, MatMul, Softmax, LayerNorm, Reduce*)
with a loop per element. Out-of-range taps read a clamped index and are masked with ``select``, so
no thread diverges on a bounds branch. Concat and Split get one loop per operand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from llvmlite import ir

from ...ops.fused import parse_program
from ...ops.shape import slice_bounds
from .. import irhelpers as h
from ..gathers import PER_ELEMENT
from ..sequential import SEQUENTIAL
from ..scalar_ops import ELEMENT_EMITTERS, cast_value, scalar_fn
from .common import all_of, in_range, lin, masked_load, store_at
from .context import Loop, OpContext
from .quant import EMITTERS as QUANT_EMITTERS
from .windows import pool, conv, gemm, global_avg, layernorm, lrn, matmul, reduce, softmax

Emit = Callable[[OpContext], list[Loop]]


# --- elementwise family ---------------------------------------------------------------------------
def _map(ctx: OpContext, fn: Callable[[ir.IRBuilder, list[ir.Value]], ir.Value]) -> list[Loop]:
    out = ctx.out_shape
    strides = [h.broadcast_strides(ctx.shape(k), out) for k in range(len(ctx.in_types))]

    def body(b, idx, i):
        vals = [ctx.load(k, lin(b, idx, st)) for k, st in enumerate(strides)]
        h.store(b, fn(b, vals), ctx.outs[0], i)

    return [Loop(out, body)]


def elementwise(ctx: OpContext) -> list[Loop]:
    fn = scalar_fn(ctx.node_op, ctx.attrs, ctx.in_types[0].dtype)
    return _map(ctx, lambda b, xs: fn(b, xs))


def where(ctx: OpContext) -> list[Loop]:
    return _map(ctx, lambda b, xs: b.select(b.icmp_unsigned("!=", xs[0], ir.Constant(h.I8, 0)), xs[1], xs[2]))


def cast(ctx: OpContext) -> list[Loop]:
    src, dst = ctx.in_types[0].dtype, ctx.out_types[0].dtype
    return _map(ctx, lambda b, xs: cast_value(b, xs[0], src, dst, bool(ctx.attrs["saturate"]), ctx.attrs["round_mode"]))


def fused_elementwise(ctx: OpContext) -> list[Loop]:
    steps = parse_program(ctx.attrs["program"])
    fns = [scalar_fn(s.op, dict(s.attrs), ctx.in_types[0].dtype) for s in steps]

    def run(b, xs):
        slots = list(xs)
        for s, fn in zip(steps, fns):
            slots.append(fn(b, [slots[k] for k in s.args]))
        return slots[-1]

    return _map(ctx, run)


def copy(ctx: OpContext) -> list[Loop]:
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout, BitCast: the same bytes, relabelled."""
    to = h.LLTYPE[ctx.out_types[0].dtype]

    def move(b, idx, i):
        x = ctx.load(0, i)
        h.store(b, x if x.type == to else b.bitcast(x, to), ctx.outs[0], i)

    return [Loop(ctx.out_shape, move)]


def batchnorm(ctx: OpContext) -> list[Loop]:
    eps = ctx.attrs["epsilon"]
    xs = ctx.shape(0)

    def value(b, idx):
        c = idx[1] if len(xs) > 1 else h.i64(0)
        x, scale, bias, mean, var = (ctx.load(k, lin(b, idx, h.contiguous_strides(xs))) if k == 0 else ctx.load(k, c)
                                     for k in range(5))
        inv = b.fdiv(h.const(x.type, 1.0), h.call_intrinsic(b, "llvm.sqrt", b.fadd(var, h.const(x.type, eps))))
        return b.fadd(b.fmul(b.fsub(x, mean), b.fmul(scale, inv)), bias)

    return [store_at(ctx, 0, value)]


# --- shape family ---------------------------------------------------------------------------------
def transpose(ctx: OpContext) -> list[Loop]:
    st = h.contiguous_strides(ctx.shape(0))
    perm = ctx.attrs["perm"]
    return [store_at(ctx, 0, lambda b, idx: ctx.load(0, lin(b, idx, [st[p] for p in perm])))]


def slice_(ctx: OpContext) -> list[Loop]:
    shape = ctx.shape(0)
    bounds = slice_bounds(shape, ctx.attrs)
    st = h.contiguous_strides(shape)
    ranges = [range(*s.indices(d)) for s, d in zip(bounds, shape)]
    base = sum(r.start * s for r, s in zip(ranges, st))
    return [store_at(ctx, 0, lambda b, idx: ctx.load(0, lin(b, idx, [r.step * s for r, s in zip(ranges, st)], base)))]


def pad(ctx: OpContext) -> list[Loop]:
    shape, a = ctx.shape(0), ctx.attrs
    rank, mode = len(shape), a["mode"]
    begins, ends = a["pads"][:rank], a["pads"][rank:]
    st = h.contiguous_strides(shape)
    ty = h.LLTYPE[ctx.in_types[0].dtype]
    fill = h.const(ty, a["value"]) if ctx.in_types[0].dtype.is_float else ir.Constant(ty, int(a["value"]))

    def value(b, idx):
        poss, oks = [], []
        for d, (n, pb, pe) in enumerate(zip(shape, begins, ends)):
            lo, hi = max(-pb, 0), n - max(-pe, 0)  # negative pads crop first, as the reference does
            p = b.add(idx[d], h.i64(lo - max(pb, 0)))
            if mode == "constant":
                oks.append(b.and_(b.icmp_signed(">=", p, h.i64(lo)), b.icmp_signed("<", p, h.i64(hi))))
            elif mode == "edge":
                p = b.select(b.icmp_signed("<", p, h.i64(lo)), h.i64(lo), p)
                p = b.select(b.icmp_signed(">=", p, h.i64(hi)), h.i64(hi - 1), p)
            else:  # reflect, without repeating the edge
                p = b.select(b.icmp_signed("<", p, h.i64(lo)), b.sub(h.i64(2 * lo), p), p)
                p = b.select(b.icmp_signed(">=", p, h.i64(hi)), b.sub(h.i64(2 * (hi - 1)), p), p)
            poss.append(p)
        index = lin(b, poss, st)
        return masked_load(b, ctx.ins[0], index, all_of(b, oks), fill) if oks else ctx.load(0, index)

    return [store_at(ctx, 0, value)]


def gather(ctx: OpContext) -> list[Loop]:
    data, ind = ctx.shape(0), ctx.shape(1)
    axis = ctx.attrs["axis"] % len(data)
    st, ist = h.contiguous_strides(data), h.contiguous_strides(ind)
    k = len(ind)

    def value(b, idx):
        """An index outside the axis reads nothing: it sets the fault word (OpDef.run_time_check), gives 0."""
        j = ctx.load(1, lin(b, idx[axis:axis + k], ist))
        j = b.sext(j, h.I64) if j.type != h.I64 else j
        j = b.select(b.icmp_signed("<", j, h.i64(0)), b.add(j, h.i64(data[axis])), j)
        rest = list(idx[:axis]) + list(idx[axis + k:])
        rest_st = list(st[:axis]) + list(st[axis + 1:])
        with b.if_else(in_range(b, j, data[axis])) as (then, otherwise):
            with then:
                got = ctx.load(0, b.add(lin(b, rest, rest_st), b.mul(j, h.i64(st[axis]))))
                got_at = b.block
            with otherwise:
                h.store(b, ir.Constant(h.I32, 1), ctx.fault, 0)
                none_at = b.block
        v = b.phi(got.type)
        v.add_incoming(got, got_at)
        v.add_incoming(h.const(got.type, 0), none_at)
        return v

    if math.prod(ctx.out_shape):
        return [store_at(ctx, 0, value)]

    def check(b, idx, i):  # no output elements: the indices are still checked, as the reference does
        j = ctx.load(1, i)
        j = b.sext(j, h.I64) if j.type != h.I64 else j
        j = b.select(b.icmp_signed("<", j, h.i64(0)), b.add(j, h.i64(data[axis])), j)
        with b.if_then(b.not_(in_range(b, j, data[axis]))):
            h.store(b, ir.Constant(h.I32, 1), ctx.fault, 0)

    return [Loop(tuple(ind), check)]


def expand(ctx: OpContext) -> list[Loop]:
    return _map(ctx, lambda b, xs: xs[0])


def concat(ctx: OpContext) -> list[Loop]:
    out = ctx.out_shape
    axis = ctx.attrs["axis"] % len(out)
    ost = h.contiguous_strides(out)
    loops, off = [], 0
    for k in range(len(ctx.in_types)):
        def body(b, idx, i, k=k, off=off):
            h.store(b, ctx.load(k, i), ctx.outs[0], lin(b, idx, ost, off * ost[axis]))

        loops.append(Loop(ctx.shape(k), body))
        off += ctx.shape(k)[axis]
    return loops


def split(ctx: OpContext) -> list[Loop]:
    shape = ctx.shape(0)
    axis = ctx.attrs["axis"] % len(shape)
    st = h.contiguous_strides(shape)
    loops, off = [], 0
    for j, t in enumerate(ctx.out_types):
        loops.append(store_at(ctx, j, lambda b, idx, off=off: ctx.load(0, lin(b, idx, st, off * st[axis]))))
        off += t.shape[axis]
    return loops


def shape_op(ctx: OpContext) -> list[Loop]:
    dims = ctx.shape(0)

    def value(b, idx):
        v = h.i64(dims[-1] if dims else 0)
        for d in range(len(dims) - 1):
            v = b.select(b.icmp_unsigned("==", idx[0], h.i64(d)), h.i64(dims[d]), v)
        return v

    return [store_at(ctx, 0, value)]


def per_element(ctx: OpContext) -> list[Loop]:
    """The element code both backends share (``codegen/gathers``), one thread per output element."""
    value = PER_ELEMENT[ctx.node_op](ctx.attrs, ctx.in_types, ctx.out_types)
    ptrs = list(ctx.ins) + ([ctx.fault] if ctx.fault is not None else [])
    return [store_at(ctx, 0, lambda b, idx: value(b, idx, ptrs))]


def sequential(ctx: OpContext) -> list[Loop]:
    """The body both backends share (``codegen/sequential``) on a single thread: the op is small and serial."""
    body = SEQUENTIAL[ctx.node_op]
    return [Loop((1,), lambda b, idx, i: body(b, ctx.attrs, ctx.in_types, ctx.out_types, ctx.ins, ctx.outs[0]))]


EMITTERS: Mapping[str, Emit] = {
    **{op: per_element for op in PER_ELEMENT},
    **{op: sequential for op in SEQUENTIAL},
    **{op: elementwise for op in ELEMENT_EMITTERS if op != "Expand"},
    "Where": where, "Cast": cast, "FusedElementwise": fused_elementwise,
    **{op: copy for op in ("Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "BitCast")},
    "Expand": expand, "Transpose": transpose, "Slice": slice_, "Pad": pad,
    "Gather": gather, "Concat": concat, "Split": split, "Shape": shape_op,
    "BatchNormalization": batchnorm,
    "Conv": conv, "FusedConv": conv,
    "Gemm": gemm, "FusedGemm": gemm, "MatMul": matmul,
    "MaxPool": lambda ctx: pool(ctx, "max"), "AveragePool": lambda ctx: pool(ctx, "avg"),
    "GlobalAveragePool": global_avg, "LRN": lrn,
    "Softmax": softmax, "LogSoftmax": softmax, "LayerNormalization": layernorm,
    **{op: reduce for op in ("ReduceMean", "ReduceSum", "ReduceMax")},
    **QUANT_EMITTERS,
}
"""op -> emitter. Every emitter honours the op's in-place rule (``OpDef.shares``): one thread reads
element i of a shared input before it writes element i of the output, and nothing else of it."""
