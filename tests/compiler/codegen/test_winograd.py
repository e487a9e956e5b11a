"""Winograd convolutions (codegen/cpu/conv/winograd.py) through emit_conv2d, checked against float64 NumPy.

Compiled for the x86-avx2 profile, whose plans pick Winograd (every x86 build machine runs its code),
and for 4- and 16-lane targets with Winograd enabled at their widths.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
from cuvil.compiler.codegen.cpu.conv.winograd_geometry import WinogradGeometry
from cuvil.compiler.target import Target

from ...hosts import HOST, executable
from .kernel_jit import passes_in_child
from .test_conv import AVX2, P0, P1, SSE, WIDE16, _emit_all, _geom, _ids, _run


# Winograd F(2x2,3x3) / F(4x4,3x3): odd sizes (partial tiles), asymmetric and 0/2 pads, batch, C/OC off
# the vector width, bias/residual/activations; chunks of whole tile rows (TW dividing VL: 13x7, 10x10)
# and of row segments (one, or a loop of interior ones between masked edge chunks: 6x70), one tile
# column (30x3).
WINO = [
    (1, 16, 9, 11, 20, 3, 3, (1, 1), P1, (1, 1), 1, True, False, "Relu"),
    (1, 20, 13, 7, 16, 3, 3, (1, 1), (1, 0, 1, 2), (1, 1), 1, True, True, "Relu"),
    (2, 24, 10, 10, 36, 3, 3, (1, 1), P0, (1, 1), 1, False, True, "Clip"),
    (1, 16, 8, 8, 17, 3, 3, (1, 1), (2, 2, 2, 2), (1, 1), 1, True, True, "none"),
    (1, 64, 32, 32, 64, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),
    (1, 33, 11, 9, 18, 3, 3, (1, 1), (0, 1, 2, 1), (1, 1), 1, False, False, "Sigmoid"),
    (2, 16, 6, 70, 21, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),
    (1, 17, 30, 3, 16, 3, 3, (1, 1), (1, 1, 0, 1), (1, 1), 1, True, False, "none"),
]


def _wino_tol(ref, m):
    """F(2x2): the usual per-element bounds. F(4x4): the same rtol, atol relative to the largest output
    (its transforms' +-1/2 .. 4 coefficients lose a few more bits: up to ~2e-5 of the output range)."""
    return {"rtol": 1e-4, "atol": 1e-5 if m == 2 else 2e-5 * max(1.0, float(np.abs(ref).max()))}


@pytest.fixture(params=[2, 4], ids=["F2", "F4"])
def wino_m(request):
    return request.param


def winograd_everywhere(target: Target, m: int, **tuning) -> Target:
    """``target`` tuned to take Winograd F(m x m, 3x3) at its own width for every eligible shape."""
    return replace(target, tuning=target.tuning.replace(winograd_widths=(target.vector_floats * 32,), winograd_f4=m,
                                                        winograd_f4_min_pixels=0, **tuning))


@pytest.mark.parametrize("i", range(len(WINO)), ids=[_ids(c) for c in WINO])
def test_winograd_matches_numpy(wino_m, i, rng):
    target = winograd_everywhere(executable("x86-avx2"), wino_m)
    p = conv_plan(target, *_geom(WINO[i]))
    assert p.method == "winograd"
    fn = _emit_all(target, [WINO[i]])["c0"]
    Y, ref = _run(fn, target, WINO[i], rng)
    np.testing.assert_allclose(Y, ref, **_wino_tol(ref, p.mr))
    Y, ref = _run(fn, target, WINO[i], rng, inplace=True)  # residual aliasing Y
    np.testing.assert_allclose(Y, ref, **_wino_tol(ref, p.mr))
    if i in (0, 6, 7):  # X ending right before a PROT_NONE page (checked in a child: a fault fails the test)
        def check():
            Y, ref = _run(fn, target, WINO[i], rng, x_guard=True)
            return np.allclose(Y, ref, **_wino_tol(ref, p.mr))

        assert passes_in_child(check)


@pytest.mark.parametrize("target", [SSE, WIDE16], ids=["4-lane", "16-lane"])
def test_winograd_other_widths(target, rng, wino_m):
    if target is WIDE16 and not HOST.has("avx2"):
        pytest.skip("16-lane plans are emulated with AVX2 halves")
    target = winograd_everywhere(target, wino_m)
    cases = [WINO[i] for i in (0, 1, 2, 3, 5, 6, 7)]
    fns = _emit_all(target, cases)
    for i, case in enumerate(cases):
        assert conv_plan(target, *_geom(case)).method == "winograd"
        Y, ref = _run(fns[f"c{i}"], target, case, rng)
        np.testing.assert_allclose(Y, ref, **_wino_tol(ref, wino_m), err_msg=str(case))


# Blocks of tile rows (Tuning.winograd_block_bytes shrunk): partial last blocks of whole-row chunks (17x14 F4, 19x6 F4,
# 13x7 F2) and of row segments.
WINO_BLOCKS = [WINO[4], WINO[6],
               (1, 20, 17, 14, 16, 3, 3, (1, 1), (1, 0, 1, 2), (1, 1), 1, True, True, "Relu"),
               (1, 16, 19, 6, 12, 3, 3, (1, 1), P1, (1, 1), 1, False, True, "none"),
               (1, 24, 13, 7, 20, 3, 3, (1, 1), (1, 0, 1, 2), (1, 1), 1, True, False, "Relu")]


@pytest.mark.parametrize("i", range(len(WINO_BLOCKS)), ids=[_ids(c) for c in WINO_BLOCKS])
def test_winograd_tile_blocks(wino_m, i, rng):
    case = WINO_BLOCKS[i]
    C, H, W, OC = case[1:5]
    seen = set()
    avx2 = executable("x86-avx2")
    for budget in (1, 2 ** 14, 2 ** 16, 2 ** 18):
        target = winograd_everywhere(avx2, wino_m, winograd_block_bytes=budget, winograd_block_weight_ratio=0.0)
        g = WinogradGeometry.of(target.vector_floats, C, H, W, OC, case[8], wino_m, budget)
        if g.nblk < 2 or (g.TRB, g.nblk) in seen:
            continue
        seen.add((g.TRB, g.nblk))
        fn = _emit_all(target, [case])["c0"]
        Y, ref = _run(fn, target, case, rng)
        np.testing.assert_allclose(Y, ref, **_wino_tol(ref, wino_m), err_msg=str(g))
    assert seen or g.TH <= g.R


def test_winograd_only_where_it_wins():
    assert conv_plan(AVX2, 1, 64, 32, 32, 64, 3, 3, (1, 1), P1, (1, 1), 1).method == "winograd"
    assert conv_plan(AVX2, 1, 512, 4, 4, 512, 3, 3, (1, 1), P1, (1, 1), 1).method != "winograd"  # 4 tiles
    assert conv_plan(AVX2, 1, 8, 16, 16, 8, 3, 3, (1, 1), P1, (1, 1), 1).method != "winograd"  # few channels
    assert conv_plan(AVX2, 1, 64, 16, 16, 64, 3, 3, (2, 2), P1, (1, 1), 1).method != "winograd"


def test_blocks_keep_v_and_m_small_unless_the_weights_would_be_read_too_often():
    """Every block of tile rows reads all of U: 64 channels at 112x112 (U 0.6 MB) takes many 1 MiB
    blocks, 256 channels at 28x28 (U 9.4 MB, V + M 4.5 MB) one, and so does a layer whose V + M are about
    the L2's size, unless its U is small; a ratio of 0 keeps the budget exact."""
    from cuvil.compiler.codegen.cpu.conv.winograd_geometry import block_budget
    from cuvil.devices.detect import resolve_target

    t = resolve_target("x86-avx512").tuning
    assert t.winograd_block_bytes == 1 << 20 and t.winograd_block_weight_ratio == 2.5
    small = WinogradGeometry.for_tuning(16, 64, 112, 112, 64, P1, 4, t)
    assert small.nblk >= 8 and 4 * small.A * 128 * small.St <= 1 << 20
    big = WinogradGeometry.for_tuning(16, 256, 28, 28, 256, P1, 4, t)
    assert big.nblk == 1 and block_budget(t, 16, 256, 28, 28, 256, P1, 4) > 1 << 20
    mid = WinogradGeometry.for_tuning(16, 128, 56, 56, 128, P1, 4, t)  # U 2.4 MB, V + M 7.7 MB: 7 blocks, not 14
    whole = WinogradGeometry.of(16, 128, 56, 56, 128, P1, 4, 1 << 62)
    assert mid.nblk == 7 and mid.nblk * 128 * 128 <= 2.5 * 256 * whole.St
    near_l2 = WinogradGeometry.for_tuning(16, 64, 32, 32, 64, P1, 4, t)  # V + M 1.2 MB, 1.25 L2s 1.3: one block
    assert near_l2.nblk == 1 and t.l2_bytes == 1 << 20 and t.winograd_whole_l2s == 1.25
    light = WinogradGeometry.for_tuning(16, 16, 64, 64, 16, P1, 4, t)  # the same V + M, U 37 KB: 1 MiB blocks
    assert light.nblk == 2
    exact = t.replace(winograd_block_weight_ratio=0.0)
    assert WinogradGeometry.for_tuning(16, 256, 28, 28, 256, P1, 4, exact) == WinogradGeometry.of(16, 256, 28, 28, 256, P1, 4, 1 << 20)
