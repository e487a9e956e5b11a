"""The conv plan: which method and register tile a 2-D convolution gets on a Target (plain Python).

:func:`conv_plan` is the single place that picks the method (``direct``, ``im2col``,
``transposed``, ``depthwise``, ``rows``, ``winograd``: see ``direct.py``, ``rows.py``,
``winograd.py``) and the tile, as a :class:`.layout.ConvPlan`; the emitter (``emit.py``) and the packer
(``pack.py``) both call it, so they cannot disagree. The thresholds are the target's ``Tuning`` and the
measured shape rules of ``rules.py``; an on-device tuner's measured choice (``Target.conv_choices``)
overrides the model. :func:`conv_scratch_bytes` is what the memory planner reserves for the conv's
``scratch`` argument. Also here: the ``rows`` method's column tiles; a Winograd conv's geometry is in
``winograd_geometry.py``.
"""
from __future__ import annotations

import math

from ....target import Target
from ..tiles import choose_tile, vector_lanes
from .flat_geometry import DWFLAT_BLOCK, flat_wins
from .layout import ConvPlan
from .rules import TALL_MIN_ROWS, aliased_1x1, dwstride2_applies, rows_min_pixels, rows_wins, short_1x1, strided_narrow, tall_1x1
from .winograd_geometry import winograd_applies, winograd_tile, winograd_wins

IM2COL_MAX_PIECES = 2048  # code-size bound on the unrolled im2col row copies (per channel)


def conv_plan(target: Target, N: int, C: int, H: int, W: int, OC: int, KH: int, KW: int,
              strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1) -> ConvPlan:
    """Pick the method and tile. pads are ONNX order (top, left, bottom, right).

    depthwise: group == C == OC; direct: implicit GEMM reading pixel vectors straight from the
    (padded copy of the) input, when whole output rows fill vectors well; im2col otherwise (small
    output rows), packing B panels so no lane is wasted; transposed: 1x1 convs over so few pixels
    that output channels fill vectors better (the input is read as A, transposed stores); rows
    (:func:`rows_wins`): 3x3 convs over many channels with small outputs, output channels
    along the vectors and no product with padding computed (ResNet-18's 512x4x4: 1.2x).
    """
    vl = vector_lanes(target)
    sh, sw = strides
    dh, dw = dilations
    pt, pl, pb, pr = pads
    if C % group or OC % group:
        raise ValueError(f"conv_plan: group {group} must divide C={C} and OC={OC}")
    base = dict(N=N, C=C, H=H, W=W, OC=OC, KH=KH, KW=KW, sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr,
                dh=dh, dw=dw, group=group, vl=vl, tuning=target.tuning)
    forced = target.conv_choice((N, C, H, W, OC, KH, KW, tuple(strides), tuple(pads), tuple(dilations), group))
    if forced is not None:
        return plan_for(base, forced.method, forced.mr, forced.nv, forced.vl)
    im = winograd_applies(KH, KW, strides, pads, dilations, group, H, W, target.tuning)
    if im is not None and winograd_wins(target.tuning, vl, C, im.H, im.W, OC, im.pads):
        m = winograd_tile(target.tuning, im.H, im.W, im.pads)
        return ConvPlan(**base, method="winograd", mr=m, nv=1, copy=False)  # mr: the output tile, F(m x m, 3x3)
    if group == C == OC and group > 1:
        if flat_wins(target.tuning, H, W, KH, KW, strides, pads, dilations, vl):
            return ConvPlan(**base, method="dwflat", mr=1, nv=DWFLAT_BLOCK, copy=False)  # nv: vectors summed together
        if (W + pl + pr - dw * (KW - 1) - 1) // sw + 1 <= target.tuning.depthwise_lanes_max_ow:
            return ConvPlan(**base, method="dwlanes", mr=vl, nv=1, copy=False)  # tiles: VL pixels x VL channels
        if vl == 16 and (W + pl + pr - dw * (KW - 1) - 1) // sw + 1 <= target.tuning.half_width_depthwise_max_ow:
            base["vl"] = 8  # narrow rows waste fewer lanes of a ymm (AVX-512VL) than of a zmm
        if vl * 32 in target.tuning.dwstride2_widths and dwstride2_applies(KH, KW, strides, pads, dilations):
            tmp = ConvPlan(**base, method="dwstride2", mr=1, nv=1, copy=False)
            return ConvPlan(**base, method="dwstride2", mr=1, nv=tmp.vpr, copy=False)  # nv: vectors per output row
        tmp = ConvPlan(**base, method="depthwise", mr=1, nv=1, copy=True)
        return ConvPlan(**base, method="depthwise", mr=1, nv=_depthwise_tile(tmp, target.tuning.vector_registers // 2),
                        copy=True)
    tmp = ConvPlan(**base, method="rows", mr=1, nv=1, copy=False)
    if rows_wins(tmp):
        # pixels of one output row x channel vectors
        mr, nv = choose_tile(target, tmp.OW, tmp.slots, min_mr=rows_min_pixels(target.tuning, tmp.OW))
        return ConvPlan(**base, method="rows", mr=mr, nv=nv, copy=False)
    if KH == KW == 1 and sh == sw == 1 and not any(pads):  # 1x1: one long row, rows = channels
        base.update(H=1, W=H * W, dh=1, dw=1)
        P, OCg = H * W, OC // group
        eff_pix, eff_oc = P / (math.ceil(P / vl) * vl), OCg / (math.ceil(OCg / vl) * vl)
        if eff_pix < 0.95 and eff_oc > eff_pix:  # measured: only then do its scalar stores pay off
            mr, nv = choose_tile(target, P, math.ceil(OCg / vl))  # vectors along output channels
            return ConvPlan(**base, method="transposed", mr=mr, nv=nv, copy=False)
    unpadded = base["sh"] == base["sw"] == 1 and not any(pads)
    tmp = ConvPlan(**base, method="direct", mr=1, nv=1, copy=True)
    copy = not (unpadded and tmp.OW % vl == 0)  # else tail vectors could read past the input
    P = tmp.OH * tmp.OW
    eff_direct, eff_im2col = tmp.OW / (tmp.vpr * vl), P / (math.ceil(P / vl) * vl)
    pieces = (tmp.OH + math.ceil(P / vl)) * tmp.T  # unrolled row-piece copies per channel
    measured_exception = aliased_1x1(target.tuning, tmp) or strided_narrow(target.tuning, tmp)  # the lane rule misjudges
    use_im2col = (eff_im2col - eff_direct >= 0.1 or measured_exception) and pieces <= IM2COL_MAX_PIECES
    method = "im2col" if use_im2col else "direct"
    tmp = ConvPlan(**base, method=method, mr=1, nv=1, copy=copy)
    if method == "direct" and tall_1x1(target.tuning, tmp):
        mr, nv = choose_tile(target, tmp.OCg, tmp.slots, max_nv=1, min_mr=TALL_MIN_ROWS)
    elif method == "direct" and short_1x1(target.tuning, tmp):
        rows = target.tuning.short_1x1_rows
        mr, nv = choose_tile(target, tmp.OCg, tmp.slots, min_mr=rows, max_mr=rows)
    else:
        mr, nv = choose_tile(target, tmp.OCg, tmp.slots)
    return ConvPlan(**base, method=method, mr=mr, nv=nv, copy=copy)


def _depthwise_tile(p: ConvPlan, most: int) -> int:
    """Vectors per tile of a depthwise conv (its ``nv``): whole output rows where they fit in ``most``, as many
    rows as divide the plane's where such a divisor is at least half the rows that fit, so the kernel has one
    tile body, not a second for the rest (MobileNetV3-ish's 5x5 layers at 12x12 took 8 rows and 4, 600 FMAs of
    IR, where 6 and 6 take 300)."""
    nv = max(1, min(p.OH * p.vpr, most))
    if p.vpr > nv:
        return nv
    fit = nv // p.vpr
    even = max(d for d in range(1, fit + 1) if p.OH % d == 0)
    return even * p.vpr if 2 * even >= fit else nv


def plan_for(base: dict, method: str, mr: int, nv: int, vl: int) -> ConvPlan:
    """The plan of ``method`` with this tile and lane count (legality is the caller's: conv_candidates)."""
    base = dict(base, vl=vl)
    if method in ("transposed", "direct", "im2col") and base["KH"] == base["KW"] == 1 and base["sh"] == base["sw"] == 1 \
            and not any(base[k] for k in ("pt", "pl", "pb", "pr")):
        base.update(H=1, W=base["H"] * base["W"], dh=1, dw=1)
    copy = method == "depthwise"
    if method in ("direct", "im2col"):
        unpadded = base["sh"] == base["sw"] == 1 and not any(base[k] for k in ("pt", "pl", "pb", "pr"))
        copy = not (unpadded and ConvPlan(**base, method=method, mr=1, nv=1, copy=True).OW % vl == 0)
    return ConvPlan(**base, method=method, mr=mr, nv=nv, copy=copy)


def conv_scratch_bytes(target: Target, N: int, C: int, H: int, W: int, OC: int, KH: int, KW: int,
                       strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1,
                       residual: bool = True) -> int:
    """Bytes the conv kernel's ``scratch`` argument must point to (0: pass null); ``residual``: the
    kernel adds one (without, a dilated Winograd conv needs less)."""
    return conv_plan(target, N, C, H, W, OC, KH, KW, strides, pads, dilations, group).scratch_for(residual)


def column_tiles(panels: int, nv: int) -> list[tuple[int, int, int]]:
    """(first panel, tiles, panels per tile): full tiles of NV, then one of the rest (64 = 21x3 + 1,
    not 20x3 + 2x2: a smaller second loop body, measured as fast)."""
    full, rest = divmod(panels, nv)
    return [g for g in ((0, full, nv), (full * nv, 1, rest)) if g[1] and g[2]]
