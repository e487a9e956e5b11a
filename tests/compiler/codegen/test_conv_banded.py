"""Direct convs whose zero-bordered copy is made band of output rows by band (``conv/direct.py``), the
parts of direct convs split over threads by bands or by pixel vectors, and weights too big for L2 prefetched.

A small ``Tuning.direct_band_bytes`` bands these small cases, so they run in milliseconds: bands with
a remainder, halos of 1-3 rows, border rows zeroed by the band that needs them (the scratch starts as
NaN), batch and groups, stride with dilation, a residual over the output.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuvil.compiler.codegen.cpu.conv.choices import with_choices
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
from cuvil.compiler.target import ConvChoice
from cuvil.devices.detect import resolve_target

from ...hosts import executable
from .kernel_jit import passes_in_child
from .test_conv import _emit_all, _geom, _run

P1 = (1, 1, 1, 1)
BUDGET = 4096
# (N, C, H, W, OC, KH, KW, strides, pads, dilations, group, bias, residual, activation)
CASES = [
    (1, 4, 30, 29, 12, 3, 3, (2, 2), P1, (1, 1), 1, True, True, "Relu"),  # 5 bands of 3
    (1, 3, 23, 40, 8, 3, 3, (1, 1), P1, (1, 1), 1, True, False, "none"),  # stride 1: 3 bands of 6 and one of 5
    (1, 2, 29, 16, 6, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, True, True, "none"),  # halo 3: 8 rows and 7
    (1, 2, 61, 33, 6, 3, 3, (2, 2), (2, 2, 2, 2), (2, 2), 1, True, False, "none"),  # stride 2, dilation 2
    (2, 4, 19, 37, 8, 3, 3, (2, 2), (1, 0, 1, 1), (1, 1), 2, False, True, "Relu"),  # batch, groups, asymmetric pads
]


def _banded(profile: str):
    """The profile's target with the small band budget, each case forced to the direct method."""
    t = executable(profile)
    t = dataclasses.replace(t, tuning=t.tuning.replace(direct_band_bytes=BUDGET))
    return with_choices(t, {_geom(c): ConvChoice("direct", 4, 2, t.vector_floats) for c in CASES})


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_every_case_is_banded(profile):
    t = _banded(profile)
    for c in CASES:
        p = conv_plan(t, *_geom(c))
        assert p.method == "direct" and p.copy and 1 < p.band < p.OH, c
        assert 4 * p.Cg * len(p.phases) * p.Hq * p.Wq <= BUDGET < 4 * p.Cg * len(p.phases) * p.Wq * -(-(p.H + 4) // p.sh)
    assert any(conv_plan(t, *_geom(c)).OH % conv_plan(t, *_geom(c)).band for c in CASES)  # a remainder band


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_banded_convs_match_numpy(profile, rng):
    t = _banded(profile)
    fns = _emit_all(t, CASES)
    for i, case in enumerate(CASES):
        for inplace in (False, True):  # the residual over the output: each output row is written once
            Y, ref = _run(fns[f"c{i}"], t, case, rng, inplace=inplace)
            np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_banded_convs_read_nothing_past_x(rng):
    t = _banded("x86-avx2")
    fns = _emit_all(t, CASES)
    for i, case in enumerate(CASES):
        def check(i=i, case=case):
            Y, ref = _run(fns[f"c{i}"], t, case, rng, x_guard=True)
            return np.allclose(Y, ref, rtol=1e-4, atol=1e-5)

        assert passes_in_child(check), f"case {case}"


def test_a_big_stride_2_copy_is_banded_within_its_budget():
    """ASPP's 32->64 3x3 stride-2 conv at 128x128: a 2.1 MB copy whole, bands of ~230 KB by default."""
    t = resolve_target("x86-avx512")
    geom = (1, 32, 128, 128, 64, 3, 3, (2, 2), P1, (1, 1), 1)
    banded = conv_plan(t, *geom)
    whole = conv_plan(dataclasses.replace(t, tuning=t.tuning.replace(direct_band_bytes=0)), *geom)
    assert (banded.method, whole.method) == ("direct", "direct") and whole.band == whole.OH == 64
    assert banded.band < 64 and 4 * banded.copy_floats <= t.tuning.direct_band_bytes + 4096
    assert whole.scratch_bytes > 2_000_000 > 8 * banded.scratch_bytes


def test_a_strided_copys_rows_start_on_vector_boundaries_where_that_pads_them_little():
    """At 512 bits, ASPP's 32->64 3x3 stride-2 conv at 128x128 pads its 65-element plane rows to 80, so the
    taps kw = 0 and 1 of every pixel vector load whole aligned vectors; 64x64 inputs (33 -> 48 would add
    45%), stride 1 and 256-bit targets keep the tight rows."""
    geom = (1, 32, 128, 128, 64, 3, 3, (2, 2), P1, (1, 1), 1)
    wide, narrow = resolve_target("x86-avx512"), resolve_target("x86-avx2")
    p = conv_plan(wide, *geom)
    assert (p.method, p.copy, p.Wq) == ("direct", True, 80)
    aligned = [p.tap_offset(kh, kw) for kh in range(3) for kw in (0, 1)]
    assert all(off % p.vl == 0 for off in aligned + [p.plane, p.chan_stride, p.im2col_offset])
    assert [p.tap_offset(kh, 2) % p.vl for kh in range(3)] == [1, 1, 1]
    assert conv_plan(narrow, *geom).Wq == 65
    assert conv_plan(wide, 1, 32, 64, 64, 64, 3, 3, (2, 2), P1, (1, 1), 1).Wq == 33
    stride_1 = with_choices(wide, {(1, 32, 128, 128, 64, 3, 3, (1, 1), P1, (1, 1), 1): ConvChoice("direct", 4, 2, 16)})
    assert conv_plan(stride_1, 1, 32, 128, 128, 64, 3, 3, (1, 1), P1, (1, 1), 1).Wq == 130
    off = dataclasses.replace(wide, tuning=wide.tuning.replace(direct_row_pad=0.0))
    assert conv_plan(off, *geom).Wq == 65


@pytest.mark.parametrize("budget", [0, 16384])
def test_padded_rows_match_numpy(budget, rng):
    """Plane rows of 66 padded to 80 (a 130-wide input at stride 2), copied whole or band by band: the
    columns past a row's end are never read as pixels."""
    t = executable("x86-avx512")
    t = dataclasses.replace(t, tuning=t.tuning.replace(direct_band_bytes=budget))
    cases = [(1, 3, 21, 130, 8, 3, 3, (2, 2), P1, (1, 1), 1, True, True, "Relu"),
             (1, 5, 12, 129, 20, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 1, True, False, "none")]
    t = with_choices(t, {_geom(c): ConvChoice("direct", 4, 2, t.vector_floats) for c in cases})
    for c in cases:
        p = conv_plan(t, *_geom(c))
        assert p.Wq == 80 and p.Wq > -(-(c[3] + c[8][1] + c[8][3]) // 2) and (p.band < p.OH) == bool(budget), c
    fns = _emit_all(t, cases)
    for i, case in enumerate(cases):
        Y, ref = _run(fns[f"c{i}"], t, case, rng)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_parts_of_bands_together_write_what_the_whole_conv_writes(rng):
    """A layer split by rows runs the same kernel over its share of the bands (``blocks``): the parts'
    outputs, in any order, are the whole kernel's bit for bit (the residual is read, never rewritten)."""
    from llvmlite import ir

    from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d

    from .kernel_jit import jit

    t = _banded("x86-avx2")
    case = CASES[1]  # 23 output rows in bands of 6: three bands and a short one
    p = conv_plan(t, *_geom(case))
    bands = -(-p.OH // p.band)
    assert bands == 4 and p.OH % p.band
    m = ir.Module(name="bands")
    m.triple = t.triple
    for name, blocks in (("whole", None), ("lo", (0, 1)), ("hi", (1, bands))):
        emit_conv2d(m, name, t, *_geom(case), bias=case[11], residual=case[12], activation=case[13], blocks=blocks)
    fns = jit(m, t, ["whole", "lo", "hi"])
    whole, ref = _run(fns["whole"], t, case, np.random.default_rng(7))
    lo, _ = _run(fns["lo"], t, case, np.random.default_rng(7))  # the same draws: the same X, weights, bias
    hi, _ = _run(fns["hi"], t, case, np.random.default_rng(7))
    rows = p.band  # the first part wrote rows [0, 6); the rest of its Y is the NaN it started with
    assert np.isnan(lo[:, :, rows:]).all() and np.isnan(hi[:, :, :rows]).all()
    parts = np.concatenate([lo[:, :, :rows], hi[:, :, rows:]], axis=2)
    assert parts.tobytes() == whole.tobytes()
    np.testing.assert_allclose(whole, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="bands"):
        emit_conv2d(ir.Module(), "bad", t, *_geom(case), blocks=(2, bands + 1))


@pytest.mark.parametrize("width", [97, 130])  # 130 at 512 bits: plane rows of 66 padded to 80
@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_a_conv_copied_whole_cut_into_a_band_per_part_writes_what_the_whole_writes(profile, width):
    """A direct conv whose copy is made whole splits over threads into one band per part, each part's tuning
    carrying the cut (``split.py``): each part, given exactly the scratch it asks for, writes its rows bit for
    bit as the whole kernel does."""
    from llvmlite import ir

    from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges

    from .kernel_jit import jit

    t = executable(profile)
    t = dataclasses.replace(t, threads=3, tuning=t.tuning.replace(parallel_sync_us=0.0))
    case = (1, 3, 97, width, 16, 3, 3, (2, 2), P1, (1, 1), 1, True, True, "Relu")  # a stem: 49 output rows
    t = with_choices(t, {_geom(case): ConvChoice("direct", 4, 2, t.vector_floats)})
    whole_plan = conv_plan(t, *_geom(case))
    assert whole_plan.band == 49 and (whole_plan.Wq % whole_plan.vl == 0) == (width == 130 and whole_plan.vl == 16)
    ranges = split_ranges(t, _geom(case))
    assert [r.blocks for r in ranges] == [(0, 1), (1, 2), (2, 3)]
    m = ir.Module(name="cut")
    m.triple = t.triple
    emit_conv2d(m, "whole", t, *_geom(case), bias=True, residual=True, activation="Relu")
    for i, r in enumerate(ranges):
        emit_conv2d(m, f"p{i}", r.target, *_geom(case), bias=True, residual=True, activation="Relu", blocks=r.blocks)
    fns = jit(m, t, ["whole", "p0", "p1", "p2"])
    whole, ref = _run(fns["whole"], t, case, np.random.default_rng(3))
    np.testing.assert_allclose(whole, ref, rtol=1e-4, atol=1e-5)
    band = conv_plan(ranges[0].target, *_geom(case)).band
    for i, r in enumerate(ranges):
        part, _ = _run(fns[f"p{i}"], r.target, case, np.random.default_rng(3))  # the same draws
        rows = slice(i * band, min(49, (i + 1) * band))
        assert part[:, :, rows].tobytes() == whole[:, :, rows].tobytes()
        assert np.isnan(np.delete(part, np.arange(49)[rows], axis=2)).all()  # nothing outside its rows


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_parts_of_pixel_vectors_write_what_the_whole_conv_writes(profile):
    """An uncopied direct conv (a 1x1 projection to few channels) split by ranges of its pixel vectors: each
    part writes every channel of its pixels bit for bit as the whole kernel does, and nothing else."""
    from llvmlite import ir

    from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges

    from .kernel_jit import jit

    t = executable(profile)
    t = dataclasses.replace(t, threads=2, tuning=t.tuning.replace(parallel_sync_us=0.0))
    case = (1, 40, 20, 20, 12, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True, True, "Relu")  # 400 pixels
    p = conv_plan(t, *_geom(case))
    assert p.by_slots
    ranges = split_ranges(t, _geom(case))
    assert len(ranges) == 2 and ranges[0].blocks[0] == 0 and ranges[1].blocks == (ranges[0].blocks[1], p.slots)
    m = ir.Module(name="slots")
    m.triple = t.triple
    emit_conv2d(m, "whole", t, *_geom(case), bias=True, residual=True, activation="Relu")
    for i, r in enumerate(ranges):
        emit_conv2d(m, f"p{i}", r.target, *_geom(case), bias=True, residual=True, activation="Relu", blocks=r.blocks)
    fns = jit(m, t, ["whole", "p0", "p1"])
    whole, ref = _run(fns["whole"], t, case, np.random.default_rng(5))
    np.testing.assert_allclose(whole, ref, rtol=1e-4, atol=1e-5)
    flat = whole.reshape(12, -1)
    for i, r in enumerate(ranges):
        part, _ = _run(fns[f"p{i}"], r.target, case, np.random.default_rng(5))
        part = part.reshape(12, -1)
        mine = np.arange(flat.shape[1])[r.blocks[0] * p.vl:r.blocks[1] * p.vl]
        assert part[:, mine].tobytes() == flat[:, mine].tobytes()
        assert np.isnan(np.delete(part, mine, axis=1)).all()


PREFETCHED = [  # (N, C, H, W, OC, KH, KW, strides, pads, dilations, group, bias, residual, activation)
    (1, 64, 4, 4, 48, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True, True, "Relu"),  # 1x1 at 4x4: ResNet-50's stage 4
    (1, 16, 9, 9, 20, 3, 3, (2, 2), P1, (1, 1), 1, True, False, "none"),  # taps: channels outer
]


def _ir(t, case) -> str:
    from llvmlite import ir

    from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d

    m = ir.Module(name="pf")
    m.triple = t.triple
    emit_conv2d(m, "c", t, *_geom(case), bias=case[11], residual=case[12], activation=case[13])
    return str(m)


def test_only_x86_targets_prefetch_the_direct_convs_weights():
    assert resolve_target("x86-avx2").tuning.direct_prefetch_bytes > 0
    assert resolve_target("x86-avx512").tuning.direct_prefetch_bytes > 0
    assert resolve_target("rpi5").tuning.direct_prefetch_bytes == 0  # never timed on Arm


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_direct_convs_whose_weights_outgrow_the_l2_budget_prefetch_them_and_compute_the_same(profile):
    """Weights over ``l2_budget_bytes`` (made small here) are prefetched ahead of the tiles; smaller ones,
    or ``direct_prefetch_bytes`` 0, are not; the outputs are the same bits either way."""
    base = executable(profile)
    vl = base.vector_floats
    for case in PREFETCHED:
        weights = 4 * case[4] * case[1] * case[5] * case[6]
        outs = []
        for ahead, budget, expect in ((4096, weights - 1, True), (4096, weights, False), (0, weights - 1, False)):
            t = dataclasses.replace(base, tuning=base.tuning.replace(direct_prefetch_bytes=ahead, l2_budget_bytes=budget))
            t = with_choices(t, {_geom(case): ConvChoice("direct", 4, 1, vl)})
            assert conv_plan(t, *_geom(case)).method == "direct"
            assert ("llvm.prefetch" in _ir(t, case)) == expect, (case, ahead, budget)
            y, ref = _run(_emit_all(t, [case])["c0"], t, case, np.random.default_rng(11))
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
            outs.append(y.tobytes())
        assert outs[0] == outs[1] == outs[2]
