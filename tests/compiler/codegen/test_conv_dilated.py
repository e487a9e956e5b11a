"""Dilated 3x3 convs by Winograd on phase planes (codegen/cpu/conv/dilated.py), checked against float64 NumPy.

Compiled for the x86-avx2 and x86-avx512 profiles (each run where the host runs its code) and for
16-lane plans on any AVX2 host, the phase planes as a batch and tiled into one image: planes that
divide evenly and ones zero-filled past the image (H or W not a multiple of d), asymmetric pads,
dilations 2 to 6, rows of several vectors, batch, residual.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, multiplies
from cuvil.compiler.codegen.cpu.conv.phases import phase_plane, winograd_images
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan

from ...hosts import HOST, executable
from .test_conv import AVX2, AVX512, WIDE16, _emit_all, _geom, _ids, _run
from .test_winograd import _wino_tol

D2, D4 = (2, 2, 2, 2), (4, 4, 4, 4)
DILATED = [
    (1, 16, 32, 32, 20, 3, 3, (1, 1), D2, (2, 2), 1, True, True, "Relu"),  # ASPP's rate 2: 16x16 planes
    (2, 16, 13, 11, 17, 3, 3, (1, 1), D2, (2, 2), 1, True, False, "none"),  # odd: planes 7x6 zero-filled
    (1, 24, 17, 19, 16, 3, 3, (1, 1), D4, (4, 4), 1, False, True, "Relu"),
    (1, 16, 30, 31, 18, 3, 3, (1, 1), (6, 6, 6, 6), (6, 6), 1, True, False, "Relu"),
    (1, 16, 14, 20, 16, 3, 3, (1, 1), (2, 0, 4, 2), (2, 2), 1, True, True, "none"),  # plane pads (1, 0, 2, 1)
    (1, 20, 9, 12, 16, 3, 3, (1, 1), (3, 3, 3, 3), (3, 3), 1, True, False, "Clip"),
    (1, 16, 8, 70, 16, 3, 3, (1, 1), D2, (2, 2), 1, True, True, "Relu"),  # 35-wide planes: several vectors
]


def _winograd_at(target, m: int, f4_min: int):
    """``target`` taking Winograd F(m x m) for every eligible shape, phase planes as a batch where they
    have ``f4_min`` outputs (else tiled into one image)."""
    t = target.tuning.replace(winograd_widths=(target.vector_floats * 32,), winograd_f4=m, winograd_min_pixels=0,
                              winograd_f4_min_pixels=f4_min)
    return replace(target, tuning=t)


def _plane_outputs(case) -> int:
    Hs, Ws, (pt, pl, pb, pr) = phase_plane(case[2], case[3], case[8], case[9])
    return (Hs + pt + pb - 2) * (Ws + pl + pr - 2)


@pytest.mark.parametrize("i", range(len(DILATED)), ids=[_ids(c) for c in DILATED])
@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("m", [2, 4], ids=["F2", "F4"])
@pytest.mark.parametrize("layout", ["batch", "tiled"])
def test_dilated_winograd_matches_numpy(layout, profile, i, rng, m):
    case = DILATED[i]
    f4_min = 0 if layout == "batch" else _plane_outputs(case) + 1  # planes too small for F(4x4): one tiled image
    target = _winograd_at(executable(profile), m, f4_min)
    p = conv_plan(target, *_geom(case))
    images = 1 if layout == "tiled" else case[9][0] ** 2
    assert (p.method, p.dh, p.winograd_images.count) == ("winograd", case[9][0], images)
    fn = _emit_all(target, [case])["c0"]
    Y, ref = _run(fn, target, case, rng)
    np.testing.assert_allclose(Y, ref, **_wino_tol(ref, p.mr))
    if case[12]:
        Y, ref = _run(fn, target, case, rng, inplace=True)  # residual aliasing Y
        np.testing.assert_allclose(Y, ref, **_wino_tol(ref, p.mr))


def test_dilated_winograd_16_lane_plans(rng):
    if not HOST.has("avx2"):
        pytest.skip("16-lane plans are emulated with AVX2 halves")
    for f4_min in (0, 10 ** 6):
        target = _winograd_at(WIDE16, 2, f4_min)
        fns = _emit_all(target, DILATED)
        for i, case in enumerate(DILATED):
            Y, ref = _run(fns[f"c{i}"], target, case, rng)
            np.testing.assert_allclose(Y, ref, **_wino_tol(ref, 2), err_msg=str(case))


def test_phase_planes():
    assert phase_plane(32, 32, D2, (2, 2)) == (16, 16, (1, 1, 1, 1))
    assert phase_plane(13, 11, (2, 0, 4, 2), (2, 2)) == (7, 6, (1, 0, 2, 1))
    assert phase_plane(32, 32, (6, 6, 6, 6), (6, 6)) == (6, 6, (1, 1, 1, 1))
    assert phase_plane(32, 32, (3, 3, 3, 3), (2, 2)) is None  # pads not multiples of d
    assert phase_plane(32, 32, D2, (2, 1)) is None


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["x86-avx2", "x86-avx512"])
def test_cost_model_takes_winograd_on_phase_planes(target):
    """ASPP's branches on a 32x32 plane: rate 2 as four 16x16 planes, F(4x4); rates 4 and 6 (8x8 and 6x6
    planes) tiled into one 35x35 and 41x41 image, F(4x4); a stride-2 or grouped dilated conv never."""
    def aspp(d, s=(1, 1), g=1):
        return 1, 64, 32, 32, 64, 3, 3, s, (d,) * 4, (d, d), g
    for d, images, size in ((2, 4, 16), (4, 1, 35), (6, 1, 41)):
        p = conv_plan(target, *aspp(d))
        assert (p.method, p.mr) == ("winograd", 4)
        assert p.winograd_images[:3] == (images, size, size)
    assert conv_plan(target, *aspp(2, s=(2, 2))).method != "winograd"
    assert conv_plan(target, *aspp(2, g=2)).method != "winograd"


def test_tiled_planes_sit_a_padding_apart():
    im = winograd_images(32, 30, (6, 6, 6, 6), (6, 6), AVX512.tuning)
    assert (im.count, im.H, im.W, im.pads, im.plane) == (1, 41, 35, (1, 1, 1, 1), (6, 5))
    assert im.origin(0, 0) == (0, 0, 0) and im.origin(2, 3) == (0, 14, 18)
    batch = winograd_images(32, 32, (2, 2, 2, 2), (2, 2), AVX512.tuning)
    assert (batch.count, batch.origin(1, 0)) == (4, (2, 0, 0))


def test_tuner_candidates_and_their_multiplies():
    geom = (1, 64, 32, 32, 64, 3, 3, (1, 1), D2, (2, 2), 1)
    cands = conv_candidates(AVX512, geom)
    assert {c.method for c in cands} >= {"winograd", "direct"}
    f4 = next(c for c in cands if c.method == "winograd" and c.mr == 4)
    assert multiplies(AVX512, geom, f4) == 4 * 64 * 64 * 4 * 4 * 36  # 4 planes of 4x4 tiles, 6x6 points
    direct = next(c for c in cands if c.method == "direct")
    assert multiplies(AVX512, geom, direct) == 64 * 64 * 32 * 32 * 9
