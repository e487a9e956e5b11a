"""The ``dwlanes`` depthwise method (channels in lanes, narrow planes), compiled for named x86 profiles
and checked against float64 NumPy: the plan takes it below ``Tuning.depthwise_lanes_max_ow`` only."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.choices import with_choices
from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
from cuvil.compiler.codegen.cpu.conv.pack import pack_conv_weights
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan, conv_scratch_bytes
from cuvil.compiler.target import ConvChoice
from cuvil.devices.detect import resolve_target

from ...hosts import executable
from .kernel_jit import ACT_PARAMS, ACT_REF, aligned, conv_ref, jit, ptr

P1 = (1, 1, 1, 1)
# (N, C, H, W, strides, pads, dilations, bias, residual, activation): KWS DS-CNN's 64x25x5 layer, a
# channel tail (C % 16, C % 8), a batch with stride 2 and asymmetric pads, dilation
CASES = [
    (1, 64, 25, 5, (1, 1), P1, (1, 1), True, False, "Relu"),
    (1, 21, 7, 4, (1, 1), P1, (1, 1), True, True, "Clip"),
    (2, 40, 9, 9, (2, 2), (0, 1, 1, 0), (1, 1), False, False, "none"),
    (1, 24, 6, 6, (1, 1), (2, 2, 2, 2), (2, 2), True, False, "none"),
]


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_dwlanes_matches_numpy(profile, rng):
    lanes = executable(profile).vector_floats
    dwlanes = ConvChoice("dwlanes", lanes, 1, lanes)  # where dwflat would take the plane, too
    target = with_choices(executable(profile), {(N, C, H, W, C, 3, 3, s, p, d, C): dwlanes
                                                for N, C, H, W, s, p, d, *_ in CASES})
    m = ir.Module(name="dwlanes")
    m.triple = target.triple
    for i, (N, C, H, W, s, p, d, has_b, has_r, act) in enumerate(CASES):
        assert conv_plan(target, N, C, H, W, C, 3, 3, s, p, d, C).method == "dwlanes"
        a, c = ACT_PARAMS.get(act, (0.0, 0.0))
        emit_conv2d(m, f"c{i}", target, N, C, H, W, C, 3, 3, s, p, d, C, bias=has_b, residual=has_r,
                    activation=act, act_alpha=a, act_beta=c)
    fns = jit(m, target, [f"c{i}" for i in range(len(CASES))])
    for i, (N, C, H, W, s, p, d, has_b, has_r, act) in enumerate(CASES):
        X = rng.standard_normal((N, C, H, W))
        Wt = rng.standard_normal((C, 1, 3, 3))
        bias = rng.standard_normal(C) if has_b else None
        ref = conv_ref(X, Wt, bias, s, p, d, C)
        R = rng.standard_normal(ref.shape) if has_r else None
        a, c = ACT_PARAMS.get(act, (0.0, 0.0))
        ref = ACT_REF[act](ref + R if has_r else ref, a, c)
        nbytes = conv_scratch_bytes(target, N, C, H, W, C, 3, 3, s, p, d, C)
        scratch = aligned(np.full(nbytes // 4, np.nan))  # the kernel must not trust scratch
        Y = aligned(np.full(ref.shape, np.nan))
        Wp = aligned(pack_conv_weights(Wt.astype(np.float32), target, (N, C, H, W), s, p, d, C))
        args = [aligned(X), Wp, aligned(bias), aligned(R), Y, scratch]  # kept alive across the call
        fns[f"c{i}"](*map(ptr, args))
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(CASES[i]))


def test_wider_planes_keep_rows_in_lanes():
    """Up to ``Tuning.depthwise_lanes_max_ow`` output columns (where ``dwflat`` does not take the conv: here stride 2,
    and the 4x4 plane of one vector); wider rows keep to the row methods."""
    for profile in ("x86-avx2", "x86-avx512"):
        t = resolve_target(profile)
        ow = t.tuning.depthwise_lanes_max_ow
        assert conv_plan(t, 1, 64, 49, 2 * ow, 64, 3, 3, (2, 2), P1, (1, 1), 64).method == "dwlanes"
        wider = conv_plan(t, 1, 64, 49, 2 * ow + 2, 64, 3, 3, (2, 2), P1, (1, 1), 64)
        assert wider.method in ("depthwise", "dwstride2")
        assert conv_plan(t, 1, 512, 4, 4, 512, 3, 3, (1, 1), P1, (1, 1), 512).method == "dwlanes"


# MobileNetV3-ish's 5x5 layers: 288 channels at 6x6, 144 at 12x12 with stride 2 (a 40-channel tail too)
CASES_5X5 = [(1, 288, 6, 6, (1, 1)), (1, 40, 12, 12, (2, 2))]


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_a_5x5_kernel_loops_over_its_rows_and_sums_in_the_unrolled_order(profile, rng, monkeypatch):
    """From ``ROW_LOOP_TAPS`` taps on a tile loops over kernel rows: a fraction of the unrolled IR, and
    the same sums in the same order, so its output is the unrolled kernel's bit for bit."""
    from cuvil.compiler.codegen.cpu.conv import dwlanes

    target = executable(profile)
    P2 = (2, 2, 2, 2)
    built = {}
    for loop in (True, False):
        if not loop:
            monkeypatch.setattr(dwlanes, "ROW_LOOP_TAPS", 10 ** 6)
        m = ir.Module(name=f"dw5-{loop}")
        m.triple = target.triple
        for i, (N, C, H, W, s) in enumerate(CASES_5X5):
            assert conv_plan(target, N, C, H, W, C, 5, 5, s, P2, (1, 1), C).method == "dwlanes"
            emit_conv2d(m, f"c{i}", target, N, C, H, W, C, 5, 5, s, P2, (1, 1), C, bias=True, activation="Relu")
        size = sum(len(blk.instructions) for f in m.functions for blk in f.blocks)
        built[loop] = (size, jit(m, target, [f"c{i}" for i in range(len(CASES_5X5))]))
    assert built[True][0] * 2 < built[False][0]
    for i, (N, C, H, W, s) in enumerate(CASES_5X5):
        X, Wt, bias = rng.standard_normal((N, C, H, W)), rng.standard_normal((C, 1, 5, 5)), rng.standard_normal(C)
        ref = np.maximum(conv_ref(X, Wt, bias, s, P2, (1, 1), C), 0)
        nbytes = conv_scratch_bytes(target, N, C, H, W, C, 5, 5, s, P2, (1, 1), C)
        Wp = aligned(pack_conv_weights(Wt.astype(np.float32), target, (N, C, H, W), s, P2, (1, 1), C))
        outs = []
        for loop in (True, False):
            Y = aligned(np.full(ref.shape, np.nan))
            args = [aligned(X), Wp, aligned(bias), None, Y, aligned(np.full(nbytes // 4, np.nan))]
            built[loop][1][f"c{i}"](*(ptr(a) if a is not None else None for a in args))
            outs.append(Y)
        np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(outs[0], outs[1])
