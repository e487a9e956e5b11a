"""The measured shape rules :func:`.plan.conv_plan` applies where the lane count alone misjudges a
conv's method or tile: each names the shapes it covers, its thresholds are the target's ``Tuning``
(where the measurements are cited).
"""
from __future__ import annotations

from ....tuning import Tuning
from .layout import ConvPlan

ALIAS_BYTES = 4096  # addresses this far apart share an L1 set (x86: 64 sets of 64-byte lines)
ALIASED_MIN_OC = 16  # fewer output channels read the input once either way (16->2 at 64x64, x86-avx2: direct 6.2 us, im2col 14.6)
TALL_MIN_ROWS = 16  # output channels of a tall direct tile, one pixel vector wide (Tuning.tall_1x1_min_pixels)


def dwstride2_applies(KH: int, KW: int, strides, pads, dilations) -> bool:
    """A depthwise conv the ``dwstride2`` method runs: 3x3, stride 2, undilated, padding of at most one."""
    return KH == KW == 3 and tuple(strides) == (2, 2) and tuple(dilations) == (1, 1) and max(pads) <= 1


def tall_1x1(t: Tuning, p: ConvPlan) -> bool:
    """A 1x1 stride-1 conv over ``Tuning.tall_1x1_min_pixels`` or more, with ``tall_1x1_min_channels`` in
    and out, or a deep one (``tall_1x1_deep_channels``) over ``tall_1x1_deep_min_pixels``: a tall tile."""
    rules = ((t.tall_1x1_min_pixels, t.tall_1x1_min_channels), (t.tall_1x1_deep_min_pixels, t.tall_1x1_deep_channels))
    return _plain_1x1(p) and any(0 < pixels <= p.OH * p.OW and min(p.Cg, p.OCg) >= chans for pixels, chans in rules)


def short_1x1(t: Tuning, p: ConvPlan) -> bool:
    """A 1x1 stride-1 conv over ``Tuning.short_1x1_max_k`` input channels or fewer and
    ``short_1x1_min_pixels`` or more, in whole tiles of ``short_1x1_rows`` output channels: a short, wide tile."""
    return (_plain_1x1(p) and 0 < p.Cg <= t.short_1x1_max_k and p.OH * p.OW >= t.short_1x1_min_pixels
            and p.OCg % t.short_1x1_rows == 0)


def aliased_1x1(t: Tuning, p: ConvPlan) -> bool:
    """A plain 1x1 conv over ``Tuning.aliased_1x1_im2col_max_k`` input channels or fewer whose float32
    channel planes lie a multiple of ``ALIAS_BYTES`` apart (so whole vectors: read in place, no copy), with
    ``ALIASED_MIN_OC`` outputs or more: the direct tiles' loads of every channel fall in the same L1 sets
    and each block of output channels reads them again, so im2col's packed panels win
    (``tuning.ALIASED_1X1_MAX_K``)."""
    return (_plain_1x1(p) and 0 < p.Cg <= t.aliased_1x1_im2col_max_k and p.OCg >= ALIASED_MIN_OC
            and p.H * p.W * 4 % ALIAS_BYTES == 0)


def strided_narrow(t: Tuning, p: ConvPlan) -> bool:
    """An ungrouped strided conv of more than one tap whose output rows take at most
    ``Tuning.strided_im2col_max_vectors`` vectors, the last one partial: im2col's packed panels, not direct's
    phase copy, even where its lanes are filled nearly as well (``tuning.STRIDED_IM2COL_MAX_VECTORS``)."""
    return (p.T > 1 and p.group == 1 and (p.sh > 1 or p.sw > 1) and p.OW % p.vl != 0
            and p.vpr <= t.strided_im2col_max_vectors)


def _plain_1x1(p: ConvPlan) -> bool:
    """A 1x1 (one tap), stride-1, unpadded conv: a plain GEMM over the pixels."""
    return p.T == 1 and p.sh == p.sw == 1 and not any(p.pads)


def rows_wins(p: ConvPlan) -> bool:
    """Shapes where the rows kernel beats direct / im2col (measured, see rows.py)."""
    t = p.tuning
    return (p.vl * 32 in t.rows_widths and p.group == 1 and p.KH == p.KW and p.KH in t.rows_kernels
            and min(p.C, p.OC) >= t.rows_min_channels and p.OH * p.OW <= t.rows_max_pixels)


def rows_min_pixels(t: Tuning, ow: int) -> int:
    """The fewest pixels of a 'rows' tile: its whole output row where that is at most ``rows_whole_row_max``
    wide, else 4 (or the row), as the weights stream once per tile (512x4x4 on znver4: 2x8 1.15 ms, 4x4 0.56 ms)."""
    return ow if ow <= t.rows_whole_row_max else min(ow, 4)
