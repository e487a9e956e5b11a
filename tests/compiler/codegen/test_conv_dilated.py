"""Dilated 3x3 convs by Winograd on phase planes (codegen/cpu/conv/dilated.py), checked against float64 NumPy.

Compiled for the x86-avx2 and x86-avx512 profiles (each run where the host runs its code) and for
16-lane plans on any AVX2 host: planes that divide evenly and ones zero-filled past the image (H or W
not a multiple of d), asymmetric pads, dilations 2 to 6, rows of several vectors, batch, residual.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, multiplies
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan, phase_plane

from ...hosts import HOST, executable
from .test_conv import AVX2, AVX512, WIDE16, _emit_all, _geom, _ids, _run
from .test_winograd import _wino_tol, winograd_everywhere

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


@pytest.mark.parametrize("i", range(len(DILATED)), ids=[_ids(c) for c in DILATED])
@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
@pytest.mark.parametrize("m", [2, 4], ids=["F2", "F4"])
def test_dilated_winograd_matches_numpy(profile, i, rng, m):
    target = winograd_everywhere(executable(profile), m, winograd_min_pixels=0)
    case = DILATED[i]
    p = conv_plan(target, *_geom(case))
    assert (p.method, p.dh) == ("winograd", case[9][0])
    fn = _emit_all(target, [case])["c0"]
    Y, ref = _run(fn, target, case, rng)
    np.testing.assert_allclose(Y, ref, **_wino_tol(ref, p.mr))
    if case[12]:
        Y, ref = _run(fn, target, case, rng, inplace=True)  # residual aliasing Y
        np.testing.assert_allclose(Y, ref, **_wino_tol(ref, p.mr))


def test_dilated_winograd_16_lane_plans(rng):
    if not HOST.has("avx2"):
        pytest.skip("16-lane plans are emulated with AVX2 halves")
    target = winograd_everywhere(WIDE16, 2, winograd_min_pixels=0)
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
def test_cost_model_takes_winograd_where_the_planes_are_large_enough(target):
    """ASPP's branches on a 32x32 plane: rates 2 and 4 (16x16 and 8x8 planes) by Winograd, 6 (6x6) direct;
    a stride-2 or grouped dilated conv never."""
    def aspp(d, s=(1, 1), g=1):
        return 1, 64, 32, 32, 64, 3, 3, s, (d,) * 4, (d, d), g
    assert conv_plan(target, *aspp(2)).method == "winograd"
    assert conv_plan(target, *aspp(4)).method == "winograd"
    assert conv_plan(target, *aspp(6)).method != "winograd"
    assert conv_plan(target, *aspp(2, s=(2, 2))).method != "winograd"
    assert conv_plan(target, *aspp(2, g=2)).method != "winograd"


def test_tuner_candidates_and_their_multiplies():
    geom = (1, 64, 32, 32, 64, 3, 3, (1, 1), D2, (2, 2), 1)
    cands = conv_candidates(AVX512, geom)
    assert {c.method for c in cands} >= {"winograd", "direct"}
    f4 = next(c for c in cands if c.method == "winograd" and c.mr == 4)
    assert multiplies(geom, f4) == 4 * 64 * 64 * 4 * 4 * 36  # 4 planes of 4x4 tiles, 6x6 points
    direct = next(c for c in cands if c.method == "direct")
    assert multiplies(geom, direct) == 64 * 64 * 32 * 32 * 9
