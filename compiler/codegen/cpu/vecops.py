"""Vector building blocks shared by the GEMM and Conv emitters (pure ``llvmlite.ir``).

Loads and stores of ``<VL x float>`` (masked ones through ``llvm.masked.*``), broadcasts, lane
masks, the kernel function shell with its target attributes, and the internal helpers that kernels
of the same shape share.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from ...target import Target
from ..irhelpers import F32, I1, I32, gep, masked_load, masked_store, set_fn_attrs, target_attrs, undef, vector

F32P = F32.as_pointer()


def vec_type(vl: int) -> ir.VectorType:
    return ir.VectorType(F32, vl)


def lane_mask(vl: int, n: int) -> ir.Constant:
    """<vl x i1> with the first n lanes on."""
    return vector(ir.VectorType(I1, vl), [int(i < n) for i in range(vl)])


def load_vec(b: ir.IRBuilder, p: ir.Value, vl: int, mask: ir.Value | None = None) -> ir.Value:
    vp = b.bitcast(p, vec_type(vl).as_pointer())
    if mask is None:
        return b.load(vp, align=4)
    return masked_load(b, vp, vec_type(vl), mask, 4)


def store_vec(b: ir.IRBuilder, v: ir.Value, p: ir.Value, mask: ir.Value | None = None,
              scalar_tails: bool = False) -> None:
    vl = v.type.count
    vp = b.bitcast(p, v.type.as_pointer())
    if mask is None:
        b.store(v, vp, align=4)
        return
    if isinstance(mask, ir.Constant) and scalar_tails:
        n = sum(1 for c in mask.constant if c.constant)
        for lane in range(n):
            b.store(b.extract_element(v, ir.Constant(I32, lane)), gep(b, p, lane), align=4)
        return
    masked_store(b, v, vp, mask, 4)


def broadcast(b: ir.IRBuilder, x: ir.Value, vl: int) -> ir.Value:
    vt = vec_type(vl)
    v = b.insert_element(undef(vt), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, undef(vt), vector(ir.VectorType(I32, vl), None))  # lane 0 everywhere


def define_kernel(module: ir.Module, name: str, target: Target, extra: Sequence[ir.Type] = ()) -> ir.Function:
    """``void name(in, weights, bias, residual, out, scratch, *extra)``, the six ``float*``, with the target's
    cpu/features attributes. residual and out carry no ``noalias``: they may be the same buffer."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [F32P] * 6 + list(extra)), name)
    for i, a in enumerate(fn.args[:6]):
        if i not in (3, 4):
            a.add_attribute("noalias")
    set_fn_attrs(fn, ("nounwind",), target_attrs(target))
    return fn


def define_helper(module: ir.Module, name: str, target: Target, argtypes, body) -> ir.Function:
    """A noinline internal ``void name(argtypes)`` with the target's attributes, its pointer arguments
    ``noalias``, defined once per module by ``body(builder, fn)``: the kernels that call it share its
    code (noinline: else LLVM inlines it into each and unrolls loops around it)."""
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), argtypes), name)
        fn.linkage = "internal"
        for arg in fn.args:
            if isinstance(arg.type, ir.PointerType):
                arg.add_attribute("noalias")
        set_fn_attrs(fn, ("nounwind", "noinline"), target_attrs(target))
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        body(b, fn)
        b.ret_void()
    return fn
