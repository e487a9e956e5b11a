"""The ``dwflat`` depthwise method (each channel's plane read flat, taps as masked loads), compiled for named
x86 profiles and checked against float64 NumPy, with the input between inaccessible pages: a masked-off
lane is never read."""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, with_choices
from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
from cuvil.compiler.codegen.cpu.conv.pack import pack_conv_weights
from cuvil.compiler.codegen.cpu.conv.flat_geometry import flat_applies
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan, conv_scratch_bytes
from cuvil.compiler.target import ConvChoice
from cuvil.devices.detect import resolve_target

from ...hosts import executable
from .kernel_jit import ACT_PARAMS, ACT_REF, aligned, assembly, conv_ref, guarded, jit, passes_in_child, ptr

P1 = (1, 1, 1, 1)
# (N, C, H, W, KH, KW, pads, dilations, bias, residual, activation): KWS DS-CNN's 64x25x5 layer, MobileNetV1's
# 256x8x8, a plane ending mid-vector with a channel count off the lanes, a batch, pads above and below that
# differ, dilation 2, a 5x5 kernel, a 1-row kernel, a plane of one pixel; then planes whose rows loop
CASES = [
    (1, 64, 25, 5, 3, 3, P1, (1, 1), True, False, "Relu"),
    (1, 256, 8, 8, 3, 3, P1, (1, 1), True, True, "Clip"),
    (1, 21, 7, 9, 3, 3, P1, (1, 1), False, True, "none"),
    (2, 5, 6, 6, 3, 3, P1, (1, 1), True, False, "none"),
    (1, 12, 11, 7, 3, 3, (0, 1, 2, 1), (1, 1), True, False, "Relu"),
    (1, 8, 12, 12, 3, 3, (2, 2, 2, 2), (2, 2), True, True, "none"),
    (1, 16, 9, 10, 5, 5, (2, 2, 2, 2), (1, 1), True, False, "none"),
    (1, 6, 13, 3, 3, 1, (1, 0, 1, 0), (1, 1), False, False, "none"),
    (1, 4, 1, 1, 3, 3, P1, (1, 1), True, False, "none"),
    (1, 3, 64, 64, 3, 3, P1, (1, 1), True, True, "Relu"),  # rows loop: a period of one row (4 or 8 vectors)
    (2, 5, 28, 28, 3, 3, P1, (1, 1), True, False, "none"),  # a period of 4 rows (7 vectors at 16 lanes)
    (1, 4, 30, 24, 3, 3, (2, 2, 2, 2), (2, 2), False, True, "none"),  # dilated: the loop starts two rows down
]


def _geom(case):
    N, C, H, W, KH, KW, p, d = case[:8]
    return (N, C, H, W, C, KH, KW, (1, 1), p, d, C)


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_dwflat_matches_numpy_and_reads_only_the_plane(profile, rng):
    target = executable(profile)
    choice = ConvChoice("dwflat", 1, 2, target.vector_floats)
    forced = with_choices(target, {_geom(c): choice for c in CASES})
    m = ir.Module(name="dwflat")
    m.triple = target.triple
    for i, case in enumerate(CASES):
        assert flat_applies(target.tuning, *case[2:6], (1, 1), case[6], case[7], target.vector_floats)
        assert conv_plan(forced, *_geom(case)).method == "dwflat"
        a, c = ACT_PARAMS.get(case[10], (0.0, 0.0))
        emit_conv2d(m, f"c{i}", forced, *_geom(case), bias=case[8], residual=case[9], activation=case[10],
                    act_alpha=a, act_beta=c)
    fns = jit(m, forced, [f"c{i}" for i in range(len(CASES))])
    for i, case in enumerate(CASES):
        N, C, H, W, KH, KW, p, d, has_b, has_r, act = case
        X = rng.standard_normal((N, C, H, W))
        Wt = rng.standard_normal((C, 1, KH, KW))
        bias = rng.standard_normal(C) if has_b else None
        ref = conv_ref(X, Wt, bias, (1, 1), p, d, C)
        R = rng.standard_normal(ref.shape) if has_r else None
        a, c = ACT_PARAMS.get(act, (0.0, 0.0))
        ref = ACT_REF[act](ref + R if has_r else ref, a, c)
        assert conv_scratch_bytes(forced, *_geom(case)) == 0
        Wp = aligned(pack_conv_weights(Wt.astype(np.float32), forced, (N, C, H, W), (1, 1), p, d, C))
        for before in (False, True):
            xs = guarded(X.astype(np.float32), before=before)
            Y = aligned(np.full(ref.shape, np.nan))
            args = [xs[0], Wp, aligned(bias), aligned(R), Y]

            def run():
                fns[f"c{i}"](*map(ptr, args), None)
                return bool(np.allclose(Y, ref, rtol=1e-4, atol=1e-5))

            assert passes_in_child(run), (case, before)
            run()
            np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_the_cost_model_takes_it_from_three_vectors_of_a_3x3_plane():
    """``tuning.DWFLAT_MAX_VECTORS``: dwflat for 3x3 kernels from 3 vectors' worth of pixels, large planes too (their
    rows loop); one-vector planes keep channels in lanes, 5x5 kernels their methods, a plane whose lanes never
    repeat within 40 vectors (27x27 at 16 lanes) rows in lanes; stride 2 and the Arm profiles (masked loads
    scalarized on NEON) never take it."""
    cases = {  # (H, W, KH, stride): method at 512 bits, at 256 bits
        (25, 5, 3, 1): ("dwflat", "dwflat"), (8, 8, 3, 1): ("dwflat", "dwflat"),
        (16, 16, 3, 1): ("dwflat", "dwflat"), (24, 24, 3, 1): ("dwflat", "dwflat"),
        (112, 112, 3, 1): ("dwflat", "dwflat"), (27, 27, 3, 1): ("depthwise", "dwflat"),
        (6, 6, 3, 1): ("dwlanes", "dwflat"), (4, 4, 3, 1): ("dwlanes", "dwlanes"),
        (7, 7, 5, 1): ("dwlanes", "dwlanes"), (40, 40, 5, 1): ("depthwise", "depthwise"),
        (16, 16, 3, 2): ("dwlanes", "dwlanes"),
    }
    for (H, W, k, s), want in cases.items():
        geom = (1, 64, H, W, 64, k, k, (s, s), (k // 2,) * 4, (1, 1), 64)
        got = tuple(conv_plan(resolve_target(name), *geom).method for name in ("x86-avx512", "x86-avx2"))
        assert got == want, (H, W, k, s)
        assert conv_plan(resolve_target("rpi5"), *geom).method != "dwflat"
    avx512, rpi5 = resolve_target("x86-avx512"), resolve_target("rpi5")
    one_vector, five = (1, 64, 4, 4, 64, 3, 3, (1, 1), P1, (1, 1), 64), (1, 64, 7, 7, 64, 5, 5, (1, 1), (2,) * 4, (1, 1), 64)
    for geom in (one_vector, five):
        assert "dwflat" in {c.method for c in conv_candidates(avx512, geom)}  # the tuner still times it
    assert "dwflat" not in {c.method for c in conv_candidates(rpi5, (1, 64, 8, 8, 64, 3, 3, (1, 1), P1, (1, 1), 64))}


def test_taps_are_masked_loads_from_the_input_itself():
    """At 512 bits every tap of KWS's layer is one zmm load (masked where its lanes cross a row end or the plane's
    edge) and one FMA per vector; no scratch, no shuffles."""
    t = resolve_target("x86-avx512")
    m = ir.Module()
    m.triple = t.triple
    emit_conv2d(m, "d", t, 1, 64, 25, 5, 64, 3, 3, (1, 1), P1, (1, 1), 64, bias=True, activation="Relu")
    asm = assembly(m, t)
    fmas = re.findall(r"vfmadd\d+ps\s+[^\n]*zmm", asm)
    assert len(fmas) + len(re.findall(r"vmulps\s+[^\n]*zmm", asm)) == 8 * 9  # 8 vectors, 9 taps (no tap all padding)
    assert re.search(r"vmovups\s+[^\n]*zmm\d+ \{%k\d\} \{z\}", asm)
    assert not re.search(r"vperm|vshuf|vunpck", asm)


def test_large_planes_loop_over_row_periods():
    """Unrolled, a 64x64 plane would be 256 vectors of code: its 62 interior rows are one loop of a row period,
    and only the first and last rows are unrolled (the loop's body at least a block of vectors)."""
    from cuvil.compiler.codegen.cpu.conv.flat_geometry import DWFLAT_BLOCK, FLAT_UNROLLED_VECTORS, flat_geometry

    for (H, W, vl), (first, body, count) in {(64, 64, 16): (4, 4, 62), (64, 64, 8): (8, 8, 62),
                                             (28, 28, 16): (2, 7, 6), (16, 16, 16): (0, 2, 0)}.items():
        g = flat_geometry(H, W, 3, 3, P1, (1, 1), vl)
        assert (g.first, g.body, g.count) == (first, body, count), (H, W, vl)
        assert g.body >= DWFLAT_BLOCK and (g.count or g.vectors <= FLAT_UNROLLED_VECTORS)
        looped = range(g.first, g.first + g.body * g.count)
        for v in looped:  # every looped vector has its loop body's lanes
            assert np.array_equal(g.lanes[:, v], g.lanes[:, g.first + (v - g.first) % g.body])
    t = resolve_target("x86-avx512")
    m = ir.Module()
    m.triple = t.triple
    emit_conv2d(m, "d", t, 1, 32, 112, 112, 32, 3, 3, (1, 1), P1, (1, 1), 32, bias=True, activation="Relu")
    asm = assembly(m, t)
    assert len(re.findall(r"vfmadd\d+ps\s+[^\n]*zmm", asm)) < 300  # 784 vectors x 9 taps unrolled: ~7,000
