"""The fast IR printer writes llvmlite's text, character for character (so LLVM gets the same module),
for kernels compiled for named profiles, for whole lowered models and for the instructions it leaves
to llvmlite."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, emit_choice, timing_weights
from cuvil.compiler.codegen.irtext import drop_body, function_text, module_text, take_instructions
from cuvil.compiler.codegen.lower import lower
from cuvil.devices.detect import resolve_target

from .test_conv_choices import GEOMETRIES

PROFILES = ["x86-avx2", "x86-avx512", "graviton3"]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_conv_candidate_prints_as_llvmlite_prints_it(profile):
    target = resolve_target(profile)
    for geom in GEOMETRIES:
        for choice in conv_candidates(target, geom):
            module = ir.Module(name="k")
            module.triple = target.triple
            emit_choice(module, "k", target, geom, choice, timing_weights(geom))
            text = module_text(module)
            assert text == str(module), (profile, geom, choice)
            llvm.parse_assembly(text).verify()


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_a_whole_lowered_model_prints_as_llvmlite_prints_it(profile):
    torch = pytest.importorskip("torch")
    from cuvil.compiler.frontends.torch import import_torch
    from tests.zoo import ZOO

    model, example = ZOO["small_cnn"]()
    with torch.no_grad():
        graph = import_torch(model, example)
    seen: list[ir.Module] = []
    lower(graph, resolve_target(profile), stream=seen.append)  # the last call sees the finished module
    module = seen[-1]
    assert module_text(module) == str(module)
    assert len(module.functions) > 5


def test_instructions_left_to_llvmlite_print_the_same():
    """Metadata, fast-math flags, call attributes, allocas, extractelement and a returned value."""
    module = ir.Module(name="m")
    f32, i32 = ir.FloatType(), ir.IntType(32)
    vec = ir.VectorType(f32, 4)
    callee = ir.Function(module, ir.FunctionType(f32, [f32]), name="g")
    fn = ir.Function(module, ir.FunctionType(f32, [vec, f32]), name="f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    v, x = fn.args
    slot = b.alloca(f32, name="slot")
    b.store(x, slot, align=4)
    e = b.extract_element(v, ir.Constant(i32, 2), name="e")
    s = b.fadd(e, b.load(slot, name="l", align=4), name="s", flags=("fast",))
    c = b.call(callee, [s], name="c", fastmath=("nnan",), attrs=("nounwind",))
    c.set_metadata("tag", module.add_metadata([ir.Constant(i32, 7)]))
    q = b.select(b.fcmp_ordered("<", c, x, name="lt"), c, x, name="q")
    w = b.shuffle_vector(v, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(i32, 4), [3, 2, 1, 0]), name="w")
    b.ret(b.fmul(q, b.extract_element(w, ir.Constant(i32, 0)), name="r"))
    assert function_text(fn) == str(fn)
    assert module_text(module) == str(module)
    llvm.parse_assembly(module_text(module)).verify()


def test_a_dropped_body_is_freed_without_the_cyclic_collector():
    """A conv kernel (loops: phis, blocks whose terminators branch to themselves), printed then dropped:
    with the collector off every block goes at once; the declaration stays, as a call to it needs."""
    import gc
    import weakref

    module = ir.Module("m")
    target = resolve_target("x86-avx2")
    geom = GEOMETRIES[0]
    emit_choice(module, "k", target, geom, conv_candidates(target, geom)[0], timing_weights(geom))
    was = gc.isenabled()
    gc.disable()
    try:
        blocks = [weakref.ref(blk) for fn in module.functions for blk in fn.blocks]
        assert len(blocks) > 3
        for fn in module.functions:
            function_text(fn)
            drop_body(fn)
        assert all(ref() is None for ref in blocks)
        assert "declare" in module_text(module)
    finally:
        if was:
            gc.enable()


def test_instructions_taken_as_a_function_grows_print_as_the_whole_function():
    """A function printed in parts (:func:`take_instructions` between appends, the builder put back at the
    block's end) prints as the same function built at once; each taken instruction goes at once."""
    import gc
    import weakref

    def build(take: bool) -> tuple[str, str]:
        module = ir.Module(name="m")
        i8p = ir.IntType(8).as_pointer()
        callee = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p]), name="k")
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p]), name="f")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        taken, made = [], []
        for step in range(20):
            p = b.gep(fn.args[0], [ir.Constant(ir.IntType(64), 64 * step)], inbounds=True)
            made.append(weakref.ref(b.call(callee, [b.bitcast(p, i8p)])))
            if take and step % 3 == 2:
                taken.append(take_instructions(fn))
                b.position_at_end(b.block)
                assert not fn.blocks[0].instructions and all(ref() is None for ref in made)
        b.ret_void()
        return function_text(fn, "".join(taken)), str(fn)

    whole, llvmlite_text = build(take=False)
    assert whole == llvmlite_text
    was = gc.isenabled()
    gc.disable()
    try:
        assert build(take=True)[0] == whole
    finally:
        if was:
            gc.enable()
