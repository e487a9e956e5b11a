"""Typed llvmlite.ir builder helpers: loops, intrinsics by name, pointer arithmetic, attributes.

Pure ``llvmlite.ir`` (no ``llvmlite.binding``): the compiler builds IR text, the edge runtime
compiles it. Loops are emitted in the canonical form LLVM's vectorizer likes best: an i64 induction
variable from a constant start with a constant trip count, one latch, no side exits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache

from llvmlite import ir

from ..ir.dtypes import NARROW, DType
from ..target import Target, TargetKind

F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
VOID = ir.VoidType()
I8P = I8.as_pointer()

# Storage type of each IR dtype (bool is one byte holding 0 or 1, as NumPy stores it).
LLTYPE: Mapping[DType, ir.Type] = {
    DType.F32: F32, DType.F64: F64, DType.F16: F16, DType.I8: I8, DType.U8: I8, DType.I16: I16,
    DType.U16: I16, DType.I32: I32, DType.U32: I32, DType.I64: I64, DType.U64: I64, DType.BOOL: I8,
    **{d: I16 if d.itemsize == 2 else I8 for d in NARROW},  # raw bits, converted by codegen.narrow
}
SIGNED = frozenset({DType.I8, DType.I16, DType.I32, DType.I64})
ALIGN = 64  # bytes: every arena tensor, weight block and scratch region starts on a cache line
FAST = ("reassoc", "nsz", "contract")  # flags that let the vectorizer reorder float reductions


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def const(t: ir.Type, v: float) -> ir.Constant:
    """Constant ``v`` of type ``t`` (in every lane when ``t`` is a vector)."""
    if isinstance(t, ir.VectorType):
        return vector(t, (float(v) if is_float(t.element) else int(v),) * t.count)
    return ir.Constant(t, float(v) if isinstance(t, (ir.FloatType, ir.DoubleType, ir.HalfType)) else int(v))


class _Printed(ir.Constant):
    """A vector constant whose text is made once: llvmlite formats a vector constant element by
    element at every use, which was a third of a ResNet-50's IR printing (its splats and masks).
    ``.constant`` keeps the elements (llvmlite checks shuffle masks by them)."""

    def __init__(self, t: ir.Type, elements, text: str):
        super().__init__(t, elements)
        self.text = text

    def _get_reference(self) -> str:
        return self.text


def vector(t: ir.VectorType, values: Sequence[float | int | bool] | None) -> ir.Constant:
    """The vector constant of ``values`` (None: all zero), printed as ``zeroinitializer`` when it is."""
    if values is None:
        return _vector(t, None)
    return _vector(t, tuple(values), tuple(map(repr, values)))  # repr tells -0.0 from 0.0 (they compare equal)


def undef(t: ir.Type) -> ir.Constant:
    """``undef`` of ``t``, printed as one word (a vector's would be printed lane by lane)."""
    return _undef(t)


@lru_cache(maxsize=4096)
def _vector(t: ir.VectorType, values: tuple | None, spelled: tuple = ()) -> ir.Constant:
    if values is None or all(s in ("0", "0.0", "False") for s in spelled):
        return _Printed(t, None, "zeroinitializer")
    c = ir.Constant(t, [ir.Constant(t.element, v) for v in values])
    return _Printed(t, c.constant, c.get_reference())


@lru_cache(maxsize=256)
def _undef(t: ir.Type) -> ir.Constant:
    return _Printed(t, ir.Undefined, "undef") if isinstance(t, ir.VectorType) else ir.Constant(t, ir.Undefined)


def is_float(t: ir.Type) -> bool:
    return isinstance(t, (ir.FloatType, ir.DoubleType, ir.HalfType))


# ---------------------------------------------------------------------------------------- loops ---
@contextmanager
def for_range(b: ir.IRBuilder, count: int | ir.Value, start: int | ir.Value = 0, step: int = 1,
              name: str = "i") -> Iterator[ir.Value]:
    """``for (i = start; i < count; i += step)``; the body is emitted inside the ``with`` block."""
    start_v = i64(start) if isinstance(start, int) else start
    stop_v = i64(count) if isinstance(count, int) else count
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    idx = b.phi(I64, name=name)
    idx.add_incoming(start_v, pre)
    b.cbranch(b.icmp_signed("<", idx, stop_v), body, done)
    b.position_at_end(body)
    yield idx
    nxt = b.add(idx, i64(step), name=f"{name}.next", flags=("nsw", "nuw"))
    idx.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


@contextmanager
def loop_nest(b: ir.IRBuilder, counts: Sequence[int], name: str = "d") -> Iterator[tuple[ir.Value, ...]]:
    """Nested ``for_range`` loops, outermost first; yields one index per count."""
    if not counts:
        yield ()
        return
    with for_range(b, counts[0], name=f"{name}{len(counts)}") as i, loop_nest(b, counts[1:], name) as rest:
        yield (i, *rest)


def linear(b: ir.IRBuilder, indices: Sequence[ir.Value], strides: Sequence[int], base: ir.Value | int = 0) -> ir.Value:
    """``base + sum(index * stride)`` in i64, skipping zero strides (broadcast dimensions)."""
    acc = i64(base) if isinstance(base, int) else base
    for idx, st in zip(indices, strides):
        if st == 1:
            acc = b.add(acc, idx, flags=("nsw",))
        elif st:
            acc = b.add(acc, b.mul(idx, i64(st), flags=("nsw",)), flags=("nsw",))
    return acc


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a contiguous ``shape`` read at ``out_shape`` positions (0: broadcast)."""
    pad = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = contiguous_strides(pad)
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


# -------------------------------------------------------------------------------------- memory ---
def gep(b: ir.IRBuilder, base: ir.Value, index: ir.Value | int) -> ir.Value:
    """``&base[index]`` (``base`` itself for a constant 0)."""
    if isinstance(index, int):
        return base if index == 0 else b.gep(base, [i64(index)], inbounds=True)
    return b.gep(base, [index], inbounds=True)


def load(b: ir.IRBuilder, base: ir.Value, index: ir.Value | int) -> ir.Value:
    return b.load(gep(b, base, index))


def store(b: ir.IRBuilder, value: ir.Value, base: ir.Value, index: ir.Value | int) -> None:
    b.store(value, gep(b, base, index))


def byte_ptr(b: ir.IRBuilder, base: ir.Value, offset: int, elem: ir.Type) -> ir.Value:
    """A typed pointer ``offset`` bytes past an ``i8*`` base."""
    return b.bitcast(b.gep(base, [i64(offset)], inbounds=True), elem.as_pointer())


def memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, nbytes: int) -> None:
    call_named(b, "llvm.memcpy.p0.p0.i64", VOID, [b.bitcast(dst, I8P), b.bitcast(src, I8P), i64(nbytes), ir.Constant(I1, 0)])


def memset(b: ir.IRBuilder, dst: ir.Value, byte: int, nbytes: int) -> None:
    call_named(b, "llvm.memset.p0.i64", VOID, [b.bitcast(dst, I8P), ir.Constant(I8, byte), i64(nbytes), ir.Constant(I1, 0)])


def memset0(b: ir.IRBuilder, dst: ir.Value, nbytes: int) -> None:
    memset(b, dst, 0, nbytes)


def prefetch(b: ir.IRBuilder, ptr: ir.Value, locality: int = 3) -> None:
    """A read prefetch hint of the line at ``ptr`` (locality 3: keep in L1 ... 0: no reuse)."""
    args = [ptr if ptr.type == I8P else b.bitcast(ptr, I8P), ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)]
    call_named(b, "llvm.prefetch.p0", VOID, args)


# ---------------------------------------------------------------------------------- intrinsics ---
def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """Declare (once) and return the function ``name``."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(ret, list(args)), name)


def call_named(b: ir.IRBuilder, name: str, ret: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
    """Call ``name``, declaring it once per module. A declaration made elsewhere with other
    pointer types (``float*`` where this passes ``<8 x float>*``) is reused: pointers are cast."""
    fn = intrinsic(b.module, name, ret, [a.type for a in args])
    params = fn.function_type.args
    args = [b.bitcast(a, t) if isinstance(t, ir.PointerType) and a.type != t else a for a, t in zip(args, params)]
    return b.call(fn, args)


_SUFFIX = {"float": "f32", "double": "f64", "half": "f16", "i8": "i8", "i32": "i32", "i64": "i64"}


def type_suffix(t: ir.Type) -> str:
    """The overloaded-intrinsic suffix of ``t``: ``f32``, ``v8f32``..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{type_suffix(t.element)}"
    return _SUFFIX[str(t)]


def masked_load(b: ir.IRBuilder, ptr: ir.Value, t: ir.VectorType, mask: ir.Value, align: int,
                pad: ir.Value | None = None) -> ir.Value:
    """A ``t`` at ``ptr`` reading only the lanes ``mask`` holds; the others ``pad`` (undefined without one)."""
    args = [b.bitcast(ptr, t.as_pointer()), ir.Constant(I32, align), mask, vector(t, None) if pad is None else pad]
    return call_named(b, f"llvm.masked.load.{type_suffix(t)}.p0", t, args)


def masked_store(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, mask: ir.Value, align: int) -> None:
    """The lanes of ``v`` that ``mask`` holds, stored at ``ptr``."""
    call_named(b, f"llvm.masked.store.{type_suffix(v.type)}.p0", ir.VoidType(),
               [v, b.bitcast(ptr, v.type.as_pointer()), ir.Constant(I32, align), mask])


def call_intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """Call an overloaded same-type intrinsic by base name on scalars or vectors:
    ``call_intrinsic(b, "llvm.fma", x, y, z)``."""
    return call_named(b, f"{name}.{type_suffix(args[0].type)}", args[0].type, args)


def compiler_barrier(b: ir.IRBuilder) -> None:
    """An empty asm statement that clobbers memory: no load, store or call moves across it."""
    b.call(ir.InlineAsm(ir.FunctionType(VOID, []), "", "~{memory}", side_effect=True), [])


def cycle_counter(b: ir.IRBuilder) -> ir.Value:
    """``llvm.readcyclecounter`` fenced so LLVM cannot move argmem-only kernel calls across it."""
    compiler_barrier(b)
    t = call_named(b, "llvm.readcyclecounter", I64, [])
    compiler_barrier(b)
    return t


# ---------------------------------------------------------------------------------- attributes ---
def target_attrs(target: Target) -> dict[str, str]:
    """String attributes every CPU function gets, so LLVM selects and costs for the real target."""
    attrs: dict[str, str] = {}
    if target.kind is TargetKind.CPU:
        attrs["target-cpu"] = target.cpu
        if target.features:
            attrs["target-features"] = target.feature_string
        if target.vector_bits:
            attrs["prefer-vector-width"] = str(target.vector_bits)
            if target.triple.startswith("x86_64") and target.vector_bits >= 512:
                attrs["min-legal-vector-width"] = "512"
    return attrs


PREVECTORIZED = "cuvil-prevectorized"
"""String attribute of a function whose emitter already vectorized, unrolled and scheduled its IR
(the conv micro-kernels): LLVM's module optimizer makes no faster code of it, only a slower compile
(ResNet-18: 0.6 of its 1.1 CPU-s), so the edge runtime gives such kernels code generation alone."""


SLOTTED = "cuvil-prevectorized-slots"
"""String attribute of a prevectorized function whose sums live in stack slots (``entry_alloca``): it
needs them promoted to registers, not the module optimizer (the edge runtime's ``SLOTS_LEVEL``)."""


class _StringFnAttrs(ir.values.FunctionAttributes):
    """FunctionAttributes that also accept ``"key"="value"`` string attributes."""

    def add(self, name: str) -> None:
        if name.startswith('"'):
            set.add(self, name)
        else:
            super().add(name)


def set_fn_attrs(fn: ir.Function, flags: Sequence[str] = (), strings: Mapping[str, str] | None = None) -> None:
    """Set enum attributes (``nounwind``...) and string attributes (``"target-cpu"``...) on ``fn``."""
    attrs = _StringFnAttrs()
    for a in fn.attributes:
        attrs.add(a)
    for a in flags:
        attrs.add(a)
    for k, v in (strings or {}).items():
        attrs.add(f'"{k}"="{v}"')
    fn.attributes = attrs


def mark_pointer_args(fn: ir.Function, noalias: Sequence[bool], align: int = ALIGN, aligns: Sequence[int] = ()) -> None:
    """Attach ``noalias``, ``align`` and ``nocapture``-style facts the vectorizer uses; ``aligns``: the
    first arguments' own alignments where they have less than ``align`` (a split layer's part)."""
    for i, (arg, na) in enumerate(zip(fn.args, noalias)):
        if isinstance(arg.type, ir.PointerType):
            if na:
                arg.add_attribute("noalias")
            arg.attributes.align = aligns[i] if i < len(aligns) else align
            arg.add_attribute("nonnull")


# ------------------------------------------------------------------------------- accumulators ---
def entry_alloca(b: ir.IRBuilder, ty: ir.Type, name: str = "acc") -> ir.Value:
    """A stack slot in the entry block (where SROA promotes it to a register).

    When ``b`` is itself in the entry block the slot goes where ``b`` stands: an instruction put
    at the block's start by another builder would shift ``b``'s insertion point (llvmlite keeps
    it as an index), and ``b``'s next instructions would land out of order."""
    entry = b.function.entry_basic_block
    if b.block is entry:
        return b.alloca(ty, name=name)
    tmp = ir.IRBuilder(entry)
    tmp.position_at_start(entry)
    return tmp.alloca(ty, name=name)


def reduce_range(b: ir.IRBuilder, count: int, init: ir.Value, step, name: str = "r") -> ir.Value:
    """``acc = init; for i < count: acc = step(acc, i)``; returns the final ``acc``."""
    slot = entry_alloca(b, init.type, name=f"{name}.acc")
    b.store(init, slot)
    with for_range(b, count, name=name) as i:
        b.store(step(b.load(slot), i), slot)
    return b.load(slot)
