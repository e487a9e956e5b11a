"""Every conv candidate an on-device tuner may pick computes the conv (each profile this host runs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, emit_choice, multiplies, with_choices
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
from cuvil.compiler.codegen.cpu.conv.rules import TALL_MIN_ROWS
from cuvil.compiler.target import ConvChoice, Target
from cuvil.devices.detect import resolve_target

from ...hosts import executable
from .kernel_jit import aligned, conv_ref, jit, ptr

P1 = (1, 1, 1, 1)
AVX512 = resolve_target("x86-avx512")
GEOMETRIES = [  # (N, C, H, W, OC, KH, KW, strides, pads, dilations, group): one per family of candidates
    (1, 64, 16, 16, 64, 3, 3, (1, 1), P1, (1, 1), 1),  # winograd F2/F4, direct, im2col
    (1, 128, 4, 4, 128, 3, 3, (1, 1), P1, (1, 1), 1),  # rows
    (1, 64, 8, 8, 96, 3, 3, (2, 2), P1, (1, 1), 1),  # strided rows / im2col
    (1, 96, 6, 6, 64, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # transposed 1x1
    (1, 48, 20, 20, 48, 3, 3, (2, 2), P1, (1, 1), 48),  # depthwise: dwlanes first, rows (half width on 512 bits)
    (1, 20, 14, 14, 20, 3, 3, (1, 1), P1, (1, 1), 20),  # depthwise: rows first, dwlanes (channel tail)
    (1, 32, 30, 30, 40, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1),  # dilated: winograd on phase planes, direct
    (1, 64, 60, 60, 72, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # 1x1 over 3,600 pixels: tall at 512 bits, wide
    (1, 256, 32, 32, 320, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # deep 1x1 at 32x32: tall over a packed panel
    (1, 32, 32, 32, 64, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # short 1x1 (K = 32): 4-row tiles over a packed panel
]


def test_cost_model_choice_comes_first_and_candidates_are_distinct():
    t = resolve_target("x86-avx512")
    for geom in GEOMETRIES:
        cands = conv_candidates(t, geom)
        p = conv_plan(t, *geom)
        assert cands[0] == ConvChoice(p.method, p.mr, p.nv, p.vl)
        assert len(set(cands)) == len(cands) >= 2


def test_multiplies_count_the_taps_or_the_winograd_tiles():
    geom = GEOMETRIES[0]  # 64 -> 64 channels, 16x16 outputs
    assert multiplies(AVX512, geom, ConvChoice("direct", 4, 3, 16)) == 64 * 64 * 16 * 16 * 9
    assert multiplies(AVX512, geom, ConvChoice("winograd", 2, 1, 16)) == 64 * 64 * 8 * 8 * 16  # 8x8 tiles of 4x4 points
    assert multiplies(AVX512, geom, ConvChoice("winograd", 4, 1, 16)) == 64 * 64 * 4 * 4 * 36
    strided = multiplies(AVX512, GEOMETRIES[2], ConvChoice("im2col", 4, 3, 16))
    assert strided == 96 * 64 * 4 * 4 * 9  # stride 2: 4x4 outputs
    assert multiplies(AVX512, GEOMETRIES[1], ConvChoice("winograd", 4, 1, 16)) == 128 * 128 * 1 * 1 * 36


def test_a_tall_direct_tile_is_timed_where_32_registers_hold_it():
    def tall(profile, geom):
        return [c for c in conv_candidates(resolve_target(profile), geom)
                if c.method == "direct" and c.nv == 1 and c.mr >= TALL_MIN_ROWS]
    assert len(tall("x86-avx512", GEOMETRIES[0])) == 1
    assert tall("x86-avx2", GEOMETRIES[0]) == []  # 16 ymm registers
    assert tall("x86-avx512", GEOMETRIES[5]) == []  # depthwise


def test_large_1x1_convs_take_the_tall_tile_at_512_bits_and_the_tuner_still_times_the_wide_one():
    big = (1, 128, 64, 64, 256, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    p = conv_plan(AVX512, *big)
    assert (p.method, p.nv) == ("direct", 1) and p.mr >= TALL_MIN_ROWS
    assert any(c.method == "direct" and c.nv > 1 for c in conv_candidates(AVX512, big))
    assert conv_plan(resolve_target("x86-avx2"), *big).nv > 1
    small = (1, 128, 32, 32, 256, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # 32x32: the wide tile
    assert conv_plan(AVX512, *small).nv > 1
    narrow = (1, 32, 64, 64, 256, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # 32 channels in
    assert conv_plan(AVX512, *narrow).nv > 1


def test_deep_1x1_convs_take_the_tall_tile_from_32x32_at_512_bits():
    deep = GEOMETRIES[-2]  # 256 -> 320 channels
    p = conv_plan(AVX512, *deep)
    assert (p.method, p.nv, p.pack_b) == ("direct", 1, True) and p.mr >= TALL_MIN_ROWS
    assert conv_plan(resolve_target("x86-avx2"), *deep).nv > 1
    shallower = (1, 128, 32, 32, 512, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # 128 channels in: wide
    assert conv_plan(AVX512, *shallower).nv > 1
    small = (1, 512, 16, 16, 1024, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # 16x16: wide
    assert conv_plan(AVX512, *small).nv > 1


def test_cores_with_two_512_bit_fmas_a_cycle_take_4_row_tiles_where_zen_4_takes_the_tall_one():
    """Zen 5 (``tuning.FULL_RATE_512_CPUS``): the tall tile's weight load per FMA lost there (0.79-0.92x the
    wide tile's time), 4-row tiles won; a Zen 4 and the generic x86-avx512 profile keep the tall tile."""
    zen4, zen5 = (Target(cpu, AVX512.triple, cpu, AVX512.features, 512) for cpu in ("znver4", "znver5"))
    big = (1, 256, 64, 64, 256, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    deep = (1, 512, 32, 32, 512, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    for geom in (big, deep):
        for tall in (conv_plan(zen4, *geom), conv_plan(AVX512, *geom)):
            assert (tall.nv, tall.mr >= TALL_MIN_ROWS) == (1, True)
        p = conv_plan(zen5, *geom)
        assert (p.method, p.mr) == ("direct", 4) and p.nv > 1
    at_16x16 = (1, 128, 16, 16, 128, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # under short_1x1_min_pixels: wide
    assert conv_plan(zen5, *at_16x16).mr > 4
    same = [(p.method, p.mr, p.nv) for p in (conv_plan(t, *GEOMETRIES[0]) for t in (zen4, zen5))]
    assert same[0] == same[1]  # a 3x3 conv: the same tile


def test_short_1x1_convs_take_4_row_tiles_at_512_bits_and_the_tuner_still_times_the_cost_models():
    short = GEOMETRIES[-1]  # 32 -> 64 channels at 32x32
    p = conv_plan(AVX512, *short)
    assert (p.method, p.mr, p.nv, p.pack_b) == ("direct", 4, 6, True)
    assert any(c.method == "direct" and c.mr > 4 for c in conv_candidates(AVX512, short))
    off = dataclasses.replace(AVX512, tuning=AVX512.tuning.replace(short_1x1_max_k=0))
    assert conv_plan(off, *short).mr > 4
    for other in [(1, 64, 32, 32, 64), (1, 32, 28, 28, 64), (1, 32, 32, 32, 66)]:  # K 64; 784 pixels; 66 rows
        assert conv_plan(AVX512, *other, 1, 1).mr > 4, other
    wide = (1, 16, 64, 64, 32, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # MobileNetV1's 16 -> 32 at 64x64
    assert conv_plan(AVX512, *wide).mr == 4


@pytest.mark.parametrize("c,h,w,method", [
    (16, 64, 64, "im2col"),  # MobileNetV1's 16 -> 32 at 64x64: planes 16 KiB apart
    (32, 32, 32, "im2col"),  # 4 KiB apart
    (16, 56, 56, "direct"),  # 12.25 KiB apart: no aliasing
    (64, 64, 64, "direct"),  # from 64 input channels direct wins or ties anyway
])
def test_1x1_convs_whose_planes_alias_in_l1_take_im2col_at_256_bits(c, h, w, method):
    avx2 = resolve_target("x86-avx2")
    geom = (1, c, h, w, 32, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert conv_plan(avx2, *geom).method == method
    assert conv_plan(AVX512, *geom).method == "direct"  # 512-bit short tiles do not show it
    off = dataclasses.replace(avx2, tuning=avx2.tuning.replace(aliased_1x1_im2col_max_k=0))
    assert conv_plan(off, *geom).method == "direct"
    few = (1, c, h, w, 2, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # 2 outputs: the input is read once
    assert conv_plan(avx2, *few).method == "direct"


@pytest.mark.parametrize("c,h,oc,k,group,method", [
    (64, 28, 128, 3, 1, "im2col"),  # 14-wide output rows: one partial zmm
    (32, 30, 64, 3, 1, "im2col"),  # 15-wide
    (32, 32, 64, 3, 1, "direct"),  # 16-wide: one whole zmm
    (64, 64, 64, 3, 1, "direct"),  # 32-wide rows: two vectors
    (64, 28, 128, 1, 1, "direct"),  # one tap: no phase copy to spare
    (64, 28, 64, 3, 4, "direct"),  # grouped: not measured
])
def test_strided_convs_with_one_partial_vector_rows_take_im2col_at_512_bits(c, h, oc, k, group, method):
    geom = (1, c, h, h, oc, k, k, (2, 2), P1 if k == 3 else (0, 0, 0, 0), (1, 1), group)
    assert conv_plan(AVX512, *geom).method == method
    off = dataclasses.replace(AVX512, tuning=AVX512.tuning.replace(strided_im2col_max_vectors=0))
    assert conv_plan(off, *geom).method == "direct"


def test_with_choices_makes_conv_plan_return_the_choice():
    t = resolve_target("x86-avx512")
    geom = GEOMETRIES[0]
    forced = ConvChoice("im2col", 4, 3, 16)
    p = conv_plan(with_choices(t, {geom: forced}), *geom)
    assert (p.method, p.mr, p.nv, p.vl) == ("im2col", 4, 3, 16)
    assert with_choices(t, {geom: forced}) == with_choices(with_choices(t, {}), {geom: forced})


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: f"{g[1]}x{g[2]}x{g[3]}-{g[4]}k{g[5]}s{g[7][0]}g{g[10]}")
def test_every_candidate_computes_the_conv(profile, geom):
    t = executable(profile)
    N, C, H, W, OC, KH, KW, strides, pads, dil, group = geom
    cands = conv_candidates(t, geom)
    m = ir.Module()
    m.triple = t.triple
    rng = np.random.default_rng(1)
    X, bias = aligned(rng.standard_normal((N, C, H, W))), aligned(rng.standard_normal(OC))
    Wt = (rng.standard_normal((OC, C // group, KH, KW)) / np.sqrt(C // group * KH * KW)).astype(np.float32)
    built = [emit_choice(m, f"c{i}", t, geom, c, Wt) for i, c in enumerate(cands)]
    fns = jit(m, t, [f"c{i}" for i in range(len(cands))])
    ref = np.maximum(conv_ref(X, Wt, bias, strides, pads, dil, group), 0)
    for i, (c, (wp, scratch_bytes, shape)) in enumerate(zip(cands, built)):
        Y, Wp = aligned(np.zeros(shape)), aligned(wp)
        scratch = aligned(np.zeros(max(16, scratch_bytes // 4)))
        fns[f"c{i}"](ptr(X), ptr(Wp), ptr(bias), None, ptr(Y), ptr(scratch))
        np.testing.assert_allclose(Y.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4, err_msg=str(c))
