"""emit_conv2d: compiled for this host at O3, called through ctypes, checked against float64 NumPy.

Covers every method conv_plan picks (direct with and without the padded copy, im2col, depthwise,
transposed, winograd, rows), strides 1/2, pads (asymmetric too), dilation, groups, batch, tails,
bias/residual/activations. The methods a profile picks are read from its plans, never assumed of the
host; cases whose 256-bit plans differ from the host's run compiled for the x86-avx2 profile too.
The Winograd and 'rows' methods' own edge cases are in test_winograd.py and test_conv_rows.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, with_choices
from cuvil.compiler.codegen.cpu.conv.emit import emit_conv2d
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan, conv_scratch_bytes
from cuvil.compiler.codegen.cpu.conv.pack import pack_conv_weights
from cuvil.compiler.target import Target
from cuvil.devices.detect import resolve_target

from ...hosts import executable
from .kernel_jit import ACT_PARAMS, ACT_REF, aligned, assembly, conv_ref, guarded, jit, passes_in_child, ptr

HOST = resolve_target("host")
AVX2, AVX512 = resolve_target("x86-avx2"), resolve_target("x86-avx512")
SSE = Target("x86-sse4", "x86_64-unknown-linux-gnu", "x86-64-v2", ("+sse4.2",), 128)
# 16-lane plans (the x86-avx512 profile's tiles, im2col choices and masks, whatever the host) run here too:
# LLVM splits each <16 x float> into two AVX2 halves. Only correctness means anything on it, never speed.
WIDE16 = Target("avx512-plans-on-host", HOST.triple, HOST.cpu, HOST.features, 512, tuning=AVX512.tuning)
P0, P1 = (0, 0, 0, 0), (1, 1, 1, 1)

# (N, C, H, W, OC, KH, KW, strides, pads, dilations, group, bias, residual, activation)
CASES = [
    (1, 8, 8, 8, 16, 3, 3, (1, 1), P1, (1, 1), 1, True, False, "Relu"),
    (1, 32, 16, 16, 40, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),
    (1, 3, 17, 19, 10, 3, 3, (1, 1), P1, (1, 1), 1, True, False, "none"),
    (1, 16, 9, 9, 8, 3, 3, (2, 2), P1, (1, 1), 1, True, False, "none"),
    (1, 16, 32, 32, 24, 3, 3, (2, 2), P1, (1, 1), 1, False, False, "none"),
    (1, 32, 8, 8, 32, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "none"),
    (1, 24, 7, 7, 20, 1, 1, (1, 1), P0, (1, 1), 1, True, False, "none"),
    (1, 5, 7, 7, 9, 1, 1, (2, 2), P0, (1, 1), 1, False, True, "none"),
    (2, 12, 7, 7, 10, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "none"),
    (1, 16, 4, 4, 24, 3, 3, (1, 1), P1, (1, 1), 1, True, False, "none"),
    (1, 64, 4, 4, 64, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),
    (1, 8, 12, 12, 12, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 2, True, False, "none"),
    (1, 8, 11, 13, 8, 3, 3, (1, 1), P0, (1, 1), 4, False, False, "none"),
    (1, 6, 10, 9, 8, 5, 5, (1, 2), (2, 1, 0, 3), (1, 1), 2, True, False, "none"),
    (1, 4, 16, 16, 6, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, True, False, "none"),
    (1, 4, 9, 16, 4, 3, 1, (1, 1), (1, 0, 1, 0), (1, 1), 1, True, False, "none"),
    (1, 8, 10, 10, 8, 3, 3, (1, 1), P1, (1, 1), 8, True, False, "none"),  # dwflat
    (1, 4, 40, 40, 4, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 4, True, True, "Relu"),  # depthwise rows (5x5: not dwflat)
    (2, 6, 11, 9, 6, 3, 3, (2, 2), P1, (1, 1), 6, True, True, "none"),
    (1, 32, 24, 24, 32, 3, 3, (1, 1), P1, (1, 1), 32, True, False, "Clip"),
    (1, 16, 3, 3, 16, 3, 3, (1, 1), P1, (1, 1), 16, False, False, "none"),
    (1, 12, 13, 13, 12, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 12, True, False, "none"),
    (1, 8, 12, 12, 16, 3, 3, (1, 1), P1, (1, 1), 8, True, False, "none"),  # depth multiplier 2: grouped path
    (2, 16, 4, 4, 8, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "none"),  # batch through the no-copy 1x1 path
    (1, 4, 15, 15, 6, 3, 3, (2, 2), (2, 2, 2, 2), (2, 2), 1, True, False, "none"),  # stride and dilation
    (1, 128, 6, 6, 192, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),  # weights over L2: rows outer
    (1, 96, 5, 5, 100, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "Clip"),  # few pixels: transposed
    (2, 64, 3, 3, 52, 1, 1, (1, 1), P0, (1, 1), 2, True, True, "none"),  # transposed, batch and groups
    (1, 3, 35, 37, 8, 3, 3, (2, 2), (1, 0, 1, 1), (1, 1), 1, True, False, "none"),  # stride-2 copy, odd rows
    (1, 5, 37, 35, 5, 3, 3, (2, 2), (0, 1, 1, 0), (1, 1), 5, False, False, "none"),  # depthwise, same
    (1, 16, 1, 100, 24, 1, 5, (1, 2), (0, 2, 0, 2), (1, 2), 1, True, False, "none"),  # 1-D, as lowered
    (1, 8, 5, 5, 4, 5, 5, (1, 1), P0, (1, 1), 1, True, False, "none"),  # one output pixel
    (1, 12, 6, 6, 2048, 3, 3, (1, 1), P1, (1, 1), 1, True, True, "Relu"),  # im2col (under rows_min_channels), weights
    # over L2: rows outer
    (1, 1, 49, 10, 16, 10, 4, (2, 2), (4, 1, 5, 2), (1, 1), 1, True, False, "Relu"),  # im2col, taps looped (KWS stem)
    (1, 3, 20, 13, 12, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 1, True, True, "none"),  # im2col, 25 taps looped
] + [(1, 8, 6, 10, 12, 3, 3, (1, 1), P1, (1, 1), 1, True, True, act) for act in ACT_REF if act not in ("none", "Relu")]
DWSTRIDE2 = [  # stride-2 depthwise read in place: zmm rows with a partial vector, ymm rows with a lookahead block
    (1, 6, 64, 66, 6, 3, 3, (2, 2), P1, (1, 1), 6, True, True, "Relu"),
    (1, 3, 7, 33, 3, 3, 3, (2, 2), (1, 0, 1, 0), (1, 1), 3, False, True, "none"),
    (2, 4, 10, 40, 4, 3, 3, (2, 2), (0, 1, 0, 1), (1, 1), 4, True, False, "Clip"),
]
CASES += DWSTRIDE2


def _geom(case):
    return case[:11]


def _emit_all(target, cases):
    m = ir.Module(name="conv_tests")
    m.triple = target.triple
    for i, c in enumerate(cases):
        a, b = ACT_PARAMS.get(c[13], (0.0, 0.0))
        emit_conv2d(m, f"c{i}", target, *_geom(c), bias=c[11], residual=c[12], activation=c[13],
                    act_alpha=a, act_beta=b)
    return jit(m, target, [f"c{i}" for i in range(len(cases))])


@pytest.fixture(scope="module")
def host_fns():
    return _emit_all(HOST, CASES)


def _run(f, target, case, rng, x_guard=False, inplace=False):
    N, C, H, W, OC, KH, KW, s, p, d, g, has_b, has_r, act = case
    X = rng.standard_normal((N, C, H, W))
    Wt = rng.standard_normal((OC, C // g, KH, KW)) / np.sqrt(C // g * KH * KW) * (3.0 if act != "none" else 1.0)
    bias = rng.standard_normal(OC) if has_b else None
    ref = conv_ref(X, Wt, bias, s, p, d, g)
    R = rng.standard_normal(ref.shape) if has_r else None
    if has_r:
        ref = ref + R
    a, c = ACT_PARAMS.get(act, (0.0, 0.0))
    ref = ACT_REF[act](ref, a, c)
    xs = guarded(X.astype(np.float32)) if x_guard else (aligned(X), None)
    Wp, bb = aligned(pack_conv_weights(Wt.astype(np.float32), target, (N, C, H, W), s, p, d, g)), aligned(bias)
    nbytes = conv_scratch_bytes(target, N, C, H, W, OC, KH, KW, s, p, d, g, residual=has_r)
    # kernels must not trust scratch (NaN), nor write past the bytes they asked for (an inaccessible page)
    kept = guarded(np.full(max(-(-nbytes // 4), 1), np.nan)) if nbytes else (None, None)
    scratch = kept[0]
    Y = aligned(R if (has_r and inplace) else np.full(ref.shape, np.nan))
    RR = Y if (has_r and inplace) else aligned(R)
    f(ptr(xs[0]), ptr(Wp), ptr(bb), ptr(RR), ptr(Y), ptr(scratch))
    return Y, ref


def _ids(c):
    pads = "".join(map(str, c[8]))
    geom = f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-oc{c[4]}-k{c[5]}x{c[6]}"
    return f"{geom}-s{c[7][0]}{c[7][1]}-p{pads}-d{c[9][0]}-g{c[10]}-{c[13]}"


@pytest.mark.parametrize("i", range(len(CASES)), ids=[_ids(c) for c in CASES])
def test_conv_matches_numpy(host_fns, i, rng):
    Y, ref = _run(host_fns[f"c{i}"], HOST, CASES[i], rng)
    np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_every_method_is_covered(target):
    """The cases walk every method each x86 profile picks (Winograd and rows: 256-bit plans only)."""
    methods = {(conv_plan(target, *_geom(c)).method, conv_plan(target, *_geom(c)).copy) for c in CASES}
    want = {("direct", True), ("direct", False), ("im2col", True), ("depthwise", True), ("transposed", False),
            ("dwstride2", False), ("dwflat", False), ("dwlanes", False)}
    if target is AVX2:
        want |= {("winograd", False), ("rows", False)}
    assert want <= methods
    if target is AVX2:  # weights over L2 at 256 bits; the 512-bit plans of these cases fit
        assert any(conv_plan(target, *_geom(c)).rows_outer and conv_plan(target, *_geom(c)).method == "im2col"
                   for c in CASES)
    from cuvil.compiler.codegen.cpu.conv.direct import IM2COL_UNROLLED_TAPS

    assert any(conv_plan(target, *_geom(c)).method == "im2col" and conv_plan(target, *_geom(c)).T > IM2COL_UNROLLED_TAPS
               for c in CASES)  # the tap-table loop of the im2col fill


AVX2_ONLY = [c for c in CASES if conv_plan(AVX2, *_geom(c)).method in ("winograd", "rows")]


def test_256_bit_methods_match_numpy(rng):
    """The cases the x86-avx2 profile runs as Winograd or rows, compiled for it, on any host that runs
    AVX2 code (an AVX-512 host picks other methods for them in ``test_conv_matches_numpy``)."""
    target = executable("x86-avx2")
    assert {conv_plan(target, *_geom(c)).method for c in AVX2_ONLY} == {"winograd", "rows"}
    fns = _emit_all(target, AVX2_ONLY)
    for i, case in enumerate(AVX2_ONLY):
        Y, ref = _run(fns[f"c{i}"], target, case, rng)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_residual_may_alias_output(host_fns, rng):
    for i in (1, 5, 10, 17, 25, 26, CASES.index(DWSTRIDE2[0])):
        Y, ref = _run(host_fns[f"c{i}"], HOST, CASES[i], rng, inplace=True)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)


def test_conv_reads_nothing_past_x(host_fns, rng):
    """X ending right before a PROT_NONE page (checked in a child process, a fault fails the test)."""
    for i in (4, 5, 6, 9, 12, 16, 17, 26, 27, 28, *(CASES.index(c) for c in DWSTRIDE2)):
        def check(i=i):
            Y, ref = _run(host_fns[f"c{i}"], HOST, CASES[i], rng, x_guard=True)
            return np.allclose(Y, ref, rtol=1e-4, atol=1e-5)

        assert passes_in_child(check), f"case {CASES[i]}"


@pytest.mark.parametrize("target", [SSE, WIDE16], ids=["4-lane", "16-lane"])
def test_conv_other_widths(target, rng):
    """4- and 16-lane plans run on this host too: other tiles, masks and method choices."""
    if target is WIDE16 and not HOST.has("avx2"):
        pytest.skip("16-lane plans are emulated with AVX2 halves")
    cases = [CASES[i] for i in (0, 1, 3, 5, 6, 9, 10, 12, 17, 18, 22, 23, 25, 26, 27, 28)] + DWSTRIDE2
    fns = _emit_all(target, cases)
    for i, case in enumerate(cases):
        Y, ref = _run(fns[f"c{i}"], target, case, rng)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_fused_conv_reference_agrees(host_fns, rng):
    """Same numbers as the op table's FusedConv reference (attribute meaning, not just the math)."""
    from cuvil.compiler.ops.registry import get_op

    i = next(j for j, c in enumerate(CASES) if c[13] == "Clip" and c[10] == 1)
    N, C, H, W, OC, KH, KW, s, p, d, g, _, _, act = CASES[i]
    X = aligned(rng.standard_normal((N, C, H, W)))
    Wt = aligned(rng.standard_normal((OC, C, KH, KW)) / 3)
    bias = aligned(rng.standard_normal(OC))
    op = get_op("FusedConv")
    a, c = ACT_PARAMS[act]
    attrs = op.normalize_attrs(dict(strides=list(s), pads=list(p), dilations=list(d), group=g, has_bias=1,
                                    has_residual=1, activation=act, act_alpha=a, act_beta=c))
    R = aligned(rng.standard_normal(conv_ref(X, Wt, None, s, p, d, g).shape))
    ref = op.reference([X, Wt, bias, R], attrs)[0]
    Y = aligned(np.zeros(ref.shape))
    Wp = aligned(pack_conv_weights(Wt, HOST, X.shape, s, p, d, g))
    scratch = aligned(np.zeros(max(1, conv_scratch_bytes(HOST, N, C, H, W, OC, KH, KW, s, p, d, g) // 4)))
    host_fns[f"c{i}"](ptr(X), ptr(Wp), ptr(bias), ptr(R), ptr(Y), ptr(scratch))
    np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)


def test_avx512_assembly_uses_zmm_fma():
    """The direct method's 512-bit tile (forced: the cost model takes Winograd for this 3x3) and a
    depthwise conv over wide rows run on zmm registers without spills."""
    t = resolve_target("x86-avx512")
    geom = (1, 64, 32, 32, 64, 3, 3, (1, 1), P1, (1, 1), 1)
    assert conv_plan(t, *geom).method == "winograd"
    direct = next(c for c in conv_candidates(t, geom) if c.method == "direct")
    assert direct.mr * direct.nv >= 24 and direct.vl == 16
    m = ir.Module()
    m.triple = t.triple
    emit_conv2d(m, "c", with_choices(t, {geom: direct}), *geom[:7], (1, 1), P1, (1, 1), 1, bias=True,
                activation="Relu")
    emit_conv2d(m, "d", t, 1, 96, 48, 48, 96, 3, 3, (1, 1), P1, (1, 1), 96, bias=True)
    asm = assembly(m, t)
    assert len(re.findall(r"vfmadd\d+ps\s+[^\n]*zmm", asm)) >= 100
    assert "Spill" not in asm and "Reload" not in asm


def test_a_depthwise_tile_takes_whole_rows_that_divide_the_plane():
    """MobileNetV3-ish's 5x5 depthwise convs at 12x12 output (256-bit rows of 8 + 4 on the 512-bit profile):
    16 vectors fit 8 rows, which leaves a second tile body of 4; tiles of 6 rows divide the 12. A plane with no
    divisor at least half the rows that fit (13 rows) keeps the full tiles and a rest."""
    t = resolve_target("x86-avx512")
    for geom in [(1, 240, 12, 12, 240, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 240),
                 (1, 96, 24, 24, 96, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 96)]:
        p = conv_plan(t, *geom)
        assert (p.method, p.vl, p.vpr, p.nv) == ("depthwise", 8, 2, 12) and p.OH % (p.nv // p.vpr) == 0, geom
    p = conv_plan(t, 1, 240, 13, 13, 240, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 240)
    assert (p.method, p.vpr, p.nv) == ("depthwise", 2, 16) and p.OH % (p.nv // p.vpr) == 5


def test_stride2_depthwise_reads_the_input_in_place():
    """Stride-2 3x3 depthwise convs wider than the dwlanes planes take ``dwstride2`` on the x86 profiles
    (MobileNetV1's 32x64x64/2, Zen 4: 11.5 us, the phase-plane copy's kernel 22.3), no scratch; the
    copy's kernel stays a tuner candidate; 128-bit targets keep it."""
    geom = (1, 32, 64, 64, 32, 3, 3, (2, 2), P1, (1, 1), 32)
    for name, lanes in (("x86-avx512", 16), ("x86-avx2", 8)):
        p = conv_plan(resolve_target(name), *geom)
        assert (p.method, p.vl, p.copy, p.scratch_bytes) == ("dwstride2", lanes, False, 0)
        assert "depthwise" in {c.method for c in conv_candidates(resolve_target(name), geom)}
    avx512 = resolve_target("x86-avx512")
    assert conv_plan(avx512, 1, 128, 16, 16, 128, 3, 3, (2, 2), P1, (1, 1), 128).method == "dwlanes"
    assert conv_plan(avx512, 1, 32, 64, 64, 32, 3, 3, (1, 1), P1, (1, 1), 32).method == "dwflat"  # stride 1
    assert conv_plan(resolve_target("rpi5"), *geom).method == "depthwise"
    m = ir.Module()
    m.triple = resolve_target("x86-avx512").triple
    emit_conv2d(m, "d", resolve_target("x86-avx512"), *geom[:7], (2, 2), P1, (1, 1), 32, bias=True, activation="Relu")
    asm = assembly(m, resolve_target("x86-avx512"))
    assert re.search(r"vperm[it]2ps\s+[^\n]*zmm", asm) and len(re.findall(r"vfmadd\d+ps\s+[^\n]*zmm", asm)) >= 18
    assert "Spill" not in asm and "Reload" not in asm


def test_avx512_narrow_depthwise_runs_on_ymm():
    """Depthwise rows up to the profile's half_width_depthwise_max_ow use 8 lanes on AVX-512 (znver4:
    MobileNetV2's depthwise layers 368 -> 297 us), wider ones 16."""
    t, P2 = resolve_target("x86-avx512"), (2, 2, 2, 2)  # 5x5: 3x3 stride-1 planes read flat (dwflat)
    assert conv_plan(t, 1, 144, 48, 24, 144, 5, 5, (1, 1), P2, (1, 1), 144).vl == 8
    assert conv_plan(t, 1, 144, 48, 48, 144, 5, 5, (1, 1), P2, (1, 1), 144).vl == 16
    assert conv_plan(t, 1, 144, 24, 24, 144, 3, 3, (1, 1), P1, (1, 1), 144).method == "dwflat"
    assert conv_plan(resolve_target("x86-avx2"), 1, 144, 24, 24, 144, 3, 3, (1, 1), P1, (1, 1), 144).vl == 8


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512", "rpi5", "graviton3", "arm64-sve2", "jetson-xavier"])
def test_device_classes_assemble(profile):
    """GEMM, im2col conv and depthwise compile for each kind of device class, with vector FMAs
    (scalable SVE targets get fixed 4-lane vectors, which are NEON code there)."""
    from cuvil.compiler.codegen.cpu.gemm import emit_gemm

    t = resolve_target(profile)
    m = ir.Module()
    m.triple = t.triple
    emit_gemm(m, "g", t, 5, 37, 19, bias="n", residual=True, activation="Gelu")
    emit_conv2d(m, "i", t, 1, 16, 4, 4, 24, 3, 3, (2, 2), P1, (1, 1), 1, bias=True, residual=True)
    emit_conv2d(m, "d", t, 1, 16, 12, 12, 16, 3, 3, (2, 2), P1, (1, 1), 16, bias=True, activation="Clip", act_beta=6.0)
    asm = assembly(m, t)
    fma = r"vfmadd\d+ps" if t.triple.startswith("x86_64") else r"fmla\s+v\d+\.4s"
    assert len(re.findall(fma, asm)) >= 10


# 1x1 direct convs whose pixel vectors are packed into K-blocked panels (ConvPlan.pack_b): planes
# a multiple of 4 KiB apart, OC tails, 1-3 K blocks with partial last ones, batch and groups.
PACKED = [
    (1, 64, 32, 32, 52, 1, 1, (1, 1), P0, (1, 1), 1, True, False, "none"),  # one K block, column tail
    (1, 256, 64, 64, 76, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "Relu"),  # two equal K blocks
    (1, 250, 32, 32, 50, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "Clip"),  # 128 + 122, row tail
    (1, 400, 32, 32, 50, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "Sigmoid"),  # three blocks, looped epilogue
    (1, 128, 16, 256, 72, 1, 1, (1, 1), P0, (1, 1), 1, False, True, "none"),  # 6x2 tile
    (2, 256, 32, 32, 112, 1, 1, (1, 1), P0, (1, 1), 2, True, True, "Relu"),  # batch and groups
    (2, 96, 32, 32, 100, 1, 1, (1, 1), P0, (1, 1), 1, True, False, "none"),
]


@pytest.fixture(scope="module")
def packed_fns():
    """Compiled for the x86-avx2 profile, whose plans take the packed path for every case."""
    target = executable("x86-avx2")
    return target, _emit_all(target, PACKED)


@pytest.mark.parametrize("i", range(len(PACKED)), ids=[_ids(c) for c in PACKED])
def test_packed_1x1_matches_numpy(packed_fns, i, rng):
    target, fns = packed_fns
    p = conv_plan(target, *_geom(PACKED[i]))
    assert p.pack_b and p.scratch_bytes >= 4 * p.panel_floats > 0
    Y, ref = _run(fns[f"c{i}"], target, PACKED[i], rng)
    np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)
    if PACKED[i][12]:
        Y, ref = _run(fns[f"c{i}"], target, PACKED[i], rng, inplace=True)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5)


def test_packed_1x1_k_blocks():
    """The panel stays within Tuning.panel_bytes; the K blocks cover C with a partial last one where C needs it
    (the x86-avx2 profile's plans)."""
    blocks = set()
    for c in PACKED:
        p = conv_plan(AVX2, *_geom(c))
        if p.pack_b:
            assert 4 * p.panel_floats <= AVX2.tuning.panel_bytes and p.panel_k % 4 == 0 or p.panel_k == p.Cg
            blocks.add((-(-p.Cg // p.panel_k), p.Cg % p.panel_k != 0))
    assert {(1, False), (2, False), (2, True), (3, True)} <= blocks



def test_avx512_keeps_a_256_channel_1x1_in_one_k_block():
    """MobileNetV1's 256x8x8 1x1 conv: one 256-channel K block at 512 bits (two ran 1.7% slower on Zen 4);
    at 256 bits a 2-ymm column tile's 16 KiB panel still splits a 512-channel K."""
    p = conv_plan(AVX512, 1, 256, 8, 8, 256, 1, 1)
    assert p.vl == 16 and (not p.pack_b or p.panel_k == 256)
    q = conv_plan(AVX2, 1, 512, 16, 16, 512, 1, 1)
    assert q.pack_b and q.panel_k < 512


def test_avx512_tall_1x1_packs_its_aliased_planes():
    """ResNeXt-tiny's 256->256 at 64x64 takes the tall tile at 512 bits, 10 row blocks of it: its channel
    planes, 16 KiB apart, are packed (read in place it ran 2x slower on a Xeon); at 256 bits 10 row blocks
    of an aliased conv still read in place."""
    p = conv_plan(AVX512, 1, 256, 64, 64, 256, 1, 1)
    assert p.nv == 1 and -(-p.OCg // p.mr) == 10 and p.pack_b
    q = conv_plan(AVX2, 1, 64, 64, 64, 60, 1, 1)
    assert -(-q.OCg // q.mr) < AVX2.tuning.pack_min_row_blocks and not q.pack_b

def test_packed_1x1_reads_nothing_past_x(packed_fns, rng):
    target, fns = packed_fns
    for i in (0, 2, 5):
        def check(i=i):
            Y, ref = _run(fns[f"c{i}"], target, PACKED[i], rng, x_guard=True)
            return np.allclose(Y, ref, rtol=1e-4, atol=1e-5)

        assert passes_in_child(check), f"case {PACKED[i]}"


def test_packed_1x1_other_widths(rng):
    """16-lane plans (AVX-512 tiles and panels) through the packed path, emulated on this host."""
    if not HOST.has("avx2"):
        pytest.skip("16-lane plans are emulated with AVX2 halves")
    cases = [(1, 256, 32, 32, 200, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "Relu"),
             (1, 300, 16, 16, 170, 1, 1, (1, 1), P0, (1, 1), 1, True, False, "Sigmoid"),
             (1, 64, 64, 64, 256, 1, 1, (1, 1), P0, (1, 1), 1, True, True, "Relu")]  # the tall tile, 10 row blocks
    assert all(conv_plan(WIDE16, *_geom(c)).pack_b for c in cases)
    assert conv_plan(WIDE16, *_geom(cases[-1])).nv == 1
    fns = _emit_all(WIDE16, cases)
    for i, case in enumerate(cases):
        Y, ref = _run(fns[f"c{i}"], WIDE16, case, rng)
        np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-5, err_msg=str(case))


def test_copied_planes_avoid_1k_strides():
    """The padded copy's channel stride is never a multiple of 1 KiB (same L1 sets every k step)."""
    p = conv_plan(HOST, 1, 64, 32, 32, 128, 1, 1, (2, 2))
    assert p.copy and p.plane == 256 and p.chan_stride % 256 != 0
    assert p.copy_floats >= p.Cg * p.chan_stride
