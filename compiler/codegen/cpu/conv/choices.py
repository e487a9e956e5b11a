"""The alternatives to the cost model's conv plan that an on-device tuner may time, and how to build one.

``conv_candidates(target, geometry)`` lists legal :class:`ConvChoice` s for one conv, the cost
model's first: Winograd F(2x2) and F(4x4) for 3x3 stride-1 convs (dilated ones on their phase
planes), ``rows`` for 3x3 convs with small outputs, ``direct`` / ``im2col`` / ``transposed`` where
they apply, and for depthwise convs the row kernel (half width too on 512-bit targets: narrow planes
waste fewer lanes), ``dwstride2`` (stride 2, read in place), ``dwlanes`` (channels in lanes) and
``dwflat`` (stride 1, each plane read flat), whichever of them the cost model did not pick. A choice is
put into effect by ``with_choices`` (a Target whose ``conv_plan`` returns it), so the packer and the
emitter cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from llvmlite import ir

from ....spread import spread
from ....target import ConvChoice, Geometry, Target
from ..tiles import choose_tile
from .emit import emit_conv2d
from .pack import pack_conv_weights
from .flat_geometry import DWFLAT_BLOCK, flat_applies
from .layout import ConvPlan
from .plan import IM2COL_MAX_PIECES, conv_plan, plan_for
from .rules import TALL_MIN_ROWS, dwstride2_applies, rows_min_pixels
from .winograd_geometry import winograd_applies

MAX_CANDIDATES = 5


def choice_of(p: ConvPlan) -> ConvChoice:
    return ConvChoice(p.method, p.mr, p.nv, p.vl)


def with_choices(target: Target, choices: dict[Geometry, ConvChoice]) -> Target:
    """``target`` with these layers' choices fixed (sorted, so equal choices give equal Targets)."""
    merged = dict(target.conv_choices) | choices
    return dataclasses.replace(target, conv_choices=tuple(sorted(merged.items(), key=repr)))


def _output_plane(geom: Geometry) -> tuple[int, int]:
    """(OH, OW) of a conv of ``geom``."""
    _, _, H, W, _, KH, KW, strides, pads, dil, _ = geom
    return ((H + pads[0] + pads[2] - dil[0] * (KH - 1) - 1) // strides[0] + 1,
            (W + pads[1] + pads[3] - dil[1] * (KW - 1) - 1) // strides[1] + 1)


def _winograd_planes(target: Target, geom: Geometry) -> tuple[int, int, int] | None:
    """(images per input, OH, OW of each) that a Winograd conv of ``geom`` transforms (``phases.winograd_images``:
    the input, or a dilated conv's phase planes); None where Winograd does not apply."""
    _, _, H, W, _, KH, KW, strides, pads, dil, group = geom
    im = winograd_applies(KH, KW, strides, pads, dil, group, H, W, target.tuning)
    if im is None:
        return None
    pt, pl, pb, pr = im.pads
    return im.count, im.H + pt + pb - 2, im.W + pl + pr - 2


def conv_candidates(target: Target, geom: Geometry) -> tuple[ConvChoice, ...]:
    """The cost model's choice first, then up to MAX_CANDIDATES - 1 legal alternatives."""
    N, C, H, W, OC, KH, KW, strides, pads, dil, group = geom
    default = conv_plan(dataclasses.replace(target, conv_choices=()), *geom)
    base = {k: getattr(default, k) for k in ("N", "C", "H", "W", "OC", "KH", "KW", "sh", "sw", "pt", "pl",
                                             "pb", "pr", "dh", "dw", "group", "tuning")}
    base.update(N=N, C=C, H=H, W=W, dh=dil[0], dw=dil[1])
    vl = target.vector_floats
    out: list[ConvChoice] = [choice_of(default)]

    def add(method: str, lanes: int = vl, min_mr: int = 1, max_nv: int = 8) -> None:
        p = plan_for(base, method, 1, 1, lanes)
        rows = p.OW if method == "rows" else p.OCg if method in ("direct", "im2col") else p.OH * p.OW
        if method == "depthwise":
            mr, nv = 1, max(1, min(p.OH * p.vpr, 16))
        elif method == "dwstride2":
            mr, nv = 1, p.vpr
        elif method == "dwlanes":
            mr, nv = lanes, 1
        elif method == "dwflat":
            mr, nv = 1, DWFLAT_BLOCK
        else:
            mr, nv = choose_tile(target, rows, p.slots, max_nv=max_nv, min_mr=min(min_mr, rows))
        c = ConvChoice(method, mr, nv, lanes)
        if c not in out:
            out.append(c)

    OH, OW = _output_plane(geom)
    if group == C == OC and group > 1:
        for lanes in (8, 16) if vl == 16 else (vl,):
            add("depthwise", lanes)
        if dwstride2_applies(KH, KW, strides, pads, dil):
            add("dwstride2")
        add("dwlanes")
        if flat_applies(target.tuning, H, W, KH, KW, strides, pads, dil, vl):
            add("dwflat")
        return tuple(out[:MAX_CANDIDATES])
    three = KH == KW == 3 and group == 1
    planes = _winograd_planes(target, geom)
    if planes is not None and min(C, OC) >= 16 and planes[1] * planes[2] >= 64 and vl >= 8:
        for m in (2, 4):
            c = ConvChoice("winograd", m, 1, vl)
            if c not in out:
                out.append(c)
    if three and min(C, OC) >= target.tuning.rows_min_channels and OH * OW <= target.tuning.rows_max_pixels:
        add("rows", min_mr=rows_min_pixels(target.tuning, OW))
    if KH == KW == 1 and strides == (1, 1) and not any(pads):
        add("transposed")
    add("direct")
    if target.tuning.vector_registers >= 32 and OC // group >= TALL_MIN_ROWS:
        # each weight feeds one FMA, which AVX-512 takes as a {1to16} memory operand, where a wide tile
        # broadcasts it once for two FMAs: on Zen 4 0.90-0.98x on ASPP's 3x3 convs, 0.87x on ResNeXt's
        # 256-channel 64x64 1x1 conv, 1.05x on a 64-channel 32x32 1x1 (tuning.TALL_1X1_MIN_PIXELS)
        add("direct", min_mr=TALL_MIN_ROWS, max_nv=1)
    p = plan_for(base, "im2col", 1, 1, vl)
    if (p.OH + math.ceil(p.OH * p.OW / vl)) * p.T <= IM2COL_MAX_PIECES:
        add("im2col")
    return tuple(out[:MAX_CANDIDATES])


def multiplies(target: Target, geom: Geometry, choice: ConvChoice) -> int:
    """Multiplies of ``choice`` for one conv: the taps' for a direct method; Winograd F(m x m, 3x3)
    does (m+2)^2 per channel pair and m x m output tile (transforms left out). The tuner times no
    candidate that does far more than the cost model's choice (ResNet-18's direct and im2col ran
    2.2-4.0x slower than Winograd, as their 2.25-4x the multiplies say)."""
    N, C, _, _, OC, KH, KW, _, _, _, group = geom
    OH, OW = _output_plane(geom)
    if choice.method == "winograd":
        m, (images, OHs, OWs) = choice.mr, _winograd_planes(target, geom)
        return N * images * OC * C * -(-OHs // m) * -(-OWs // m) * (m + 2) ** 2
    return N * OC * (C // group) * OH * OW * KH * KW


def timing_weights(geom: Geometry) -> np.ndarray:
    """Weights [OC, C/group, KH, KW] of a conv of ``geom`` to time candidates with: made once per layer
    (a 512-channel 3x3 layer's normal draw took about as long as emitting a candidate's IR)."""
    _, C, _, _, OC, KH, KW, *_, group = geom
    w = spread((OC, C // group, KH, KW))
    w *= np.float32(1 / np.sqrt(C // group * KH * KW))
    return w


def emit_choice(module: ir.Module, name: str, target: Target, geom: Geometry, choice: ConvChoice,
                weights: np.ndarray) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """Define conv ``name`` (bias, ReLU) as ``choice``; return ``weights`` packed for it, scratch bytes, Y's shape."""
    N, C, H, W, OC, KH, KW, strides, pads, dil, group = geom
    t = with_choices(target, {geom: choice})
    p = conv_plan(t, *geom)
    emit_conv2d(module, name, t, N, C, H, W, OC, KH, KW, strides, pads, dil, group, bias=True, activation="Relu")
    return pack_conv_weights(weights, t, (N, C, H, W), strides, pads, dil, group), p.scratch_bytes, (N, OC, p.OH, p.OW)
