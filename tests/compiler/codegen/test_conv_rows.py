"""The 'rows' conv method (codegen/cpu/conv/rows.py) through emit_conv2d, checked against float64 NumPy."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates
from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan, conv_scratch_bytes
from cuvil.compiler.codegen.cpu.conv.pack import pack_conv_weights
from cuvil.compiler.target import Target
from cuvil.devices.detect import resolve_target

from ...hosts import executable
from .kernel_jit import aligned, passes_in_child, ptr
from .test_conv import HOST, P0, P1, SSE, WIDE16, _emit_all, _geom, _ids, _run


# "rows" (cpu/conv/rows.py): chosen for 3x3 convs over many channels with small outputs; here forced onto
# more shapes: 1x1/3x3/4x4/5x5/7x7/16x16 outputs, stride 2, dilation and asymmetric pads, output rows
# with no valid tap, odd C, OC off the vector width (partial panel, remainder tile), several channel
# blocks, batch, bias/residual/activations.
ROWS = [
    (1, 65, 4, 4, 20, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),
    (2, 13, 5, 5, 20, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "none"),
    (1, 9, 7, 7, 30, 3, 3, (1, 1), P1, (1, 1), 1, False, False, "Sigmoid"),
    (1, 32, 8, 8, 40, 3, 3, (2, 2), P1, (1, 1), 1, True, False, "Relu"),
    (1, 7, 3, 3, 17, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Clip"),
    (1, 5, 9, 8, 11, 3, 3, (2, 2), (2, 0, 1, 1), (2, 1), 1, True, True, "none"),
    (1, 8, 5, 5, 4, 5, 5, (1, 1), P0, (1, 1), 1, True, False, "none"),
    (1, 6, 1, 3, 10, 3, 3, (1, 1), (3, 1, 3, 1), (1, 1), 1, True, True, "none"),
    (2, 40, 6, 6, 100, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "SiLU"),
    (1, 16, 32, 32, 24, 3, 3, (2, 2), P1, (1, 1), 1, False, True, "none"),
]


def rows_anywhere(target: Target) -> Target:
    """``target`` tuned to take the rows method for every group-1 square kernel of 2x2 to 11x11."""
    tuning = target.tuning.replace(rows_widths=(target.vector_floats * 32,), rows_kernels=tuple(range(2, 12)),
                                   rows_min_channels=0, rows_max_pixels=1 << 30)
    return replace(target, tuning=tuning)


RHOST = rows_anywhere(HOST)


@pytest.fixture(scope="module")
def rows_fns():
    return _emit_all(RHOST, ROWS)


@pytest.mark.parametrize("i", range(len(ROWS)), ids=[_ids(c) for c in ROWS])
def test_rows_matches_numpy(rows_fns, i, rng):
    assert conv_plan(RHOST, *_geom(ROWS[i])).method == "rows"
    fn = rows_fns[f"c{i}"]
    Y, ref = _run(fn, RHOST, ROWS[i], rng)
    np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)
    if ROWS[i][12]:
        Y, ref = _run(fn, RHOST, ROWS[i], rng, inplace=True)  # residual aliasing Y
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)

    def check():  # X ending right before a PROT_NONE page (in a child: a fault fails the test)
        Y, ref = _run(fn, RHOST, ROWS[i], rng, x_guard=True)
        return np.allclose(Y, ref, rtol=1e-4, atol=1e-5)

    assert passes_in_child(check)


@pytest.mark.parametrize("target", [SSE, WIDE16], ids=["4-lane", "16-lane"])
def test_rows_other_widths(target, rng):
    if target is WIDE16 and not HOST.has("avx2"):
        pytest.skip("16-lane plans are emulated with AVX2 halves")
    target = rows_anywhere(target)
    cases = [ROWS[i] for i in (0, 1, 3, 5, 7, 8)]
    fns = _emit_all(target, cases)
    for i, case in enumerate(cases):
        assert conv_plan(target, *_geom(case)).method == "rows"
        Y, ref = _run(fns[f"c{i}"], target, case, rng)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def _fmas_executed(target, geom) -> int:
    """Vector FMAs one call of the kernel executes: every llvm.fma call is rerouted through a counter."""
    import llvmlite.binding as llvm

    from .kernel_jit import target_machine

    N, C, H, W, OC, KH, KW, s, p, d, g = geom
    m = ir.Module()
    m.triple = target.triple
    emit_conv2d(m, "c", target, *geom, bias=True)
    vec, vl = f"<{target.vector_floats} x float>", target.vector_floats
    text = str(m).replace(f'call {vec} @"llvm.fma.v{vl}f32"(', f"call {vec} @counted_fma(") + f"""
@fma_calls = global i64 0
define {vec} @counted_fma({vec} %a, {vec} %b, {vec} %c) noinline {{
  %n = load i64, i64* @fma_calls
  %n1 = add i64 %n, 1
  store i64 %n1, i64* @fma_calls
  %r = call {vec} @"llvm.fma.v{vl}f32"({vec} %a, {vec} %b, {vec} %c)
  ret {vec} %r
}}
"""
    tm = target_machine(target)
    mod = llvm.parse_assembly(text)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    f = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 6)(engine.get_function_address("c"))
    X, bias = aligned(np.zeros((N, C, H, W))), aligned(np.zeros(OC))
    Wp = aligned(pack_conv_weights(np.zeros((OC, C // g, KH, KW), np.float32), target, (N, C, H, W), s, p, d, g))
    plan = conv_plan(target, *geom)
    Y = aligned(np.zeros((N, OC, plan.OH, plan.OW)))
    scratch = aligned(np.zeros(max(1, conv_scratch_bytes(target, *geom) // 4)))
    f(ptr(X), ptr(Wp), ptr(bias), None, ptr(Y), ptr(scratch))
    return ctypes.c_int64.from_address(engine.get_global_value_address("fma_calls")).value


def test_rows_skips_the_padding_products():
    """ResNet-18's 512x4x4 3x3 pad-1 layers take the rows kernel, which multiplies no padding: 100 of
    im2col's 144 (pixel, tap) products, counted as executed vector FMAs."""
    from cuvil.compiler.codegen.cpu.conv import rows as rows_mod

    target = executable("x86-avx2")  # the rows kernel is chosen where it was measured: 256-bit vectors
    geom = (1, 512, 4, 4, 512, 3, 3, (1, 1), P1, (1, 1), 1)
    plan = conv_plan(target, *geom)
    assert plan.method == "rows" and plan.mr * plan.nv == 12
    rows = _fmas_executed(target, geom)
    assert rows == rows_mod.fma_count(plan) == 512 * 64 * 100
    target = replace(target, tuning=target.tuning.replace(rows_widths=()))
    assert conv_plan(target, *geom).method == "im2col"
    im2col = _fmas_executed(target, geom)
    assert im2col >= 512 * 64 * 144 and rows < 0.7 * im2col


def test_a_rows_tile_takes_the_whole_output_row_at_512_bits():
    """x86 at 512 bits: a rows conv whose output rows are at most ``rows_whole_row_max`` wide takes whole rows
    (ResNet-18's 128->256 stride-2 layer at 8x8: 8x2, where 4-pixel pieces took 4x6 and a second column-tile
    body); at 256 bits, with the setting at 0, or on wider rows, tiles keep to 4 pixels or more."""
    geom = (1, 128, 16, 16, 256, 3, 3, (2, 2), P1, (1, 1), 1)
    avx512, avx2 = resolve_target("x86-avx512"), resolve_target("x86-avx2")
    p = conv_plan(avx512, *geom)
    assert (p.method, p.OW, p.mr, p.nv) == ("rows", 8, 8, 2)
    assert [(c.mr, c.nv) for c in conv_candidates(avx512, geom) if c.method == "rows"] == [(8, 2)]  # the tuner's too
    assert (conv_plan(avx2, *geom).method, conv_plan(avx2, *geom).mr) == ("rows", 4)
    off = replace(avx512, tuning=avx512.tuning.replace(rows_whole_row_max=0))
    assert conv_plan(off, *geom).mr == 4
    wide = (1, 32, 8, 32, 64, 3, 3, (2, 2), P1, (1, 1), 1)  # 4x16 outputs, 16 > 8 wide
    q = conv_plan(rows_anywhere(avx512), *wide)
    assert q.method == "rows" and 4 <= q.mr < 16


def test_whole_row_tiles_match_numpy(rng):
    """The whole-row tiles of the 512-bit profile (8, 7 and 6 wide, stride 1 and 2), run where the host can."""
    target = executable("x86-avx512")
    cases = [(1, 128, 16, 16, 40, 3, 3, (2, 2), P1, (1, 1), 1, True, True, "Relu"),
             (1, 24, 7, 7, 70, 3, 3, (1, 1), P1, (1, 1), 1, True, False, "none"),
             (1, 48, 6, 6, 192, 3, 3, (1, 1), P1, (1, 1), 1, False, True, "Relu")]
    fns = _emit_all(target, cases)
    for i, case in enumerate(cases):
        p = conv_plan(target, *_geom(case))
        assert p.method == "rows" and p.mr == p.OW, case
        Y, ref = _run(fns[f"c{i}"], target, case, rng)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_same_shape_rows_convs_share_their_sums():
    """Two rows convs of one shape that differ only in their epilogue (ResNet-18's 512x4x4 layers with and
    without a residual) call one helper for their sums; another shape gets its own."""
    target = resolve_target("x86-avx512")
    geom = (1, 512, 4, 4, 512, 3, 3, (1, 1), P1, (1, 1), 1)
    assert conv_plan(target, *geom).method == "rows"
    m = ir.Module()
    m.triple = target.triple
    emit_conv2d(m, "plain", target, *geom, bias=True, activation="Relu")
    emit_conv2d(m, "res", target, *geom, bias=True, residual=True, activation="Relu")
    sums = [f for f in m.functions if f.name.startswith("rows_sums_") and f.blocks]
    assert len(sums) == 1
    for kernel in ("plain", "res"):
        assert sums[0].name in str(m.get_global(kernel))
    emit_conv2d(m, "other", target, 1, 256, 8, 8, 512, 3, 3, (2, 2), P1, (1, 1), 1, bias=True)
    assert len([f for f in m.functions if f.name.startswith("rows_sums_") and f.blocks]) == 2
