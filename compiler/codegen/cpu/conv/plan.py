"""The conv plan: which method and register tile a 2-D convolution gets on a Target (plain Python).

:func:`conv_plan` is the single place that picks the method (``direct``, ``im2col``,
``transposed``, ``depthwise``, ``rows``, ``winograd``: see ``direct.py``, ``rows.py``,
``winograd.py``) and the tile; the emitter (``emit.py``) and the packer (``pack.py``) both call it,
so they cannot disagree. The thresholds are the target's ``Tuning``; an on-device tuner's measured
choice (``Target.conv_choices``) overrides the model. :func:`conv_scratch_bytes` is what the memory
planner reserves for the conv's ``scratch`` argument. Also here: the ``rows`` method's column tiles;
a Winograd conv's geometry is in ``winograd_geometry.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ....target import Target
from ....tuning import Tuning
from ..tiles import choose_tile, vector_lanes
from .flat_geometry import DWFLAT_BLOCK, flat_wins
from .phases import WinogradImages, winograd_images
from .winograd_geometry import WinogradGeometry, round_up, winograd_applies, winograd_tile, winograd_wins

IM2COL_MAX_PIECES = 2048  # code-size bound on the unrolled im2col row copies (per channel)
ALIAS_BYTES = 4096  # addresses this far apart share an L1 set (x86: 64 sets of 64-byte lines)
ALIASED_MIN_OC = 16  # fewer output channels read the input once either way (16->2 at 64x64, x86-avx2: direct 6.2 us, im2col 14.6)
TALL_MIN_ROWS = 16  # output channels of a tall direct tile, one pixel vector wide (Tuning.tall_1x1_min_pixels)


@dataclass(frozen=True)
class ConvPlan:
    """Everything the conv emitter and packer must agree on (all sizes in elements)."""

    N: int
    C: int
    H: int
    W: int
    OC: int
    KH: int
    KW: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int
    dw: int
    group: int
    vl: int
    method: str  # "depthwise" | "dwlanes" | "dwflat" | "dwstride2" | "direct" | "im2col" | "transposed" | "winograd" | "rows"
    mr: int
    nv: int
    copy: bool  # inputs go through a zero-padded, stride-phase-split copy in scratch
    tuning: Tuning

    @property
    def OH(self) -> int:
        return (self.H + self.pt + self.pb - self.dh * (self.KH - 1) - 1) // self.sh + 1

    @property
    def OW(self) -> int:
        return (self.W + self.pl + self.pr - self.dw * (self.KW - 1) - 1) // self.sw + 1

    @property
    def Cg(self) -> int:
        return self.C // self.group

    @property
    def OCg(self) -> int:
        return self.OC // self.group

    @property
    def T(self) -> int:
        return self.KH * self.KW

    @property
    def K(self) -> int:
        return self.Cg * self.T

    @property
    def Hq(self) -> int:  # rows of one phase plane (of one band's, where the copy is made band by band)
        if not self.copy:
            return self.H
        return self.band + self.halo if self.band < self.OH else self.whole_rows

    @property
    def whole_rows(self) -> int:
        """Rows of one phase plane of the whole padded input."""
        return math.ceil((self.H + self.pt + self.pb) / self.sh)

    @property
    def halo(self) -> int:
        """Plane rows past its last output row that a band's taps read."""
        return (self.KH - 1) * self.dh // self.sh

    @property
    def band(self) -> int:
        """Output rows per band of a direct conv's copy (:mod:`.direct`): at most as many as keep one band's
        plane rows, halo included, within ``Tuning.direct_band_bytes``, in bands as even as they go; OH
        (one copy of the whole input) where the whole copy fits, and for every other method."""
        budget, row = self.tuning.direct_band_bytes, self.copy_row_bytes
        if not (self.copy and self.method == "direct" and budget) or \
                row * self.whole_rows <= budget:
            return self.OH
        rows = max(1, budget // row - self.halo)
        return self.OH if rows >= self.OH else math.ceil(self.OH / math.ceil(self.OH / rows))

    @property
    def copy_row_bytes(self) -> int:
        """One plane row of the copy, every channel and phase: a band's copy is this times its rows."""
        return 4 * self.Cg * len(self.phases) * self.Wq

    @property
    def by_slots(self) -> bool:
        """A direct conv that reads its input where it lies (no copy, no packed panels): a part of it may
        run any range of its pixel-vector slots (``split.py``), as every output is its own tile's."""
        return self.method == "direct" and not self.copy and not self.pack_b and self.group == 1

    def band_bytes_for(self, parts: int) -> int | None:
        """The ``Tuning.direct_band_bytes`` that cuts this direct conv's copy into exactly ``parts`` bands of
        output rows, or None when its rows do not make that many (a layer split by rows, ``split.py``)."""
        if not (self.copy and self.method == "direct") or self.OH < parts:
            return None
        rows = -(-self.OH // parts)
        cut = self.copy_row_bytes * (rows + self.halo)
        band = replace(self, tuning=self.tuning.replace(direct_band_bytes=cut)).band
        return cut if -(-self.OH // band) == parts else None

    @property
    def Wq(self) -> int:
        """Elements per row of a copy's phase plane. A strided direct conv's rows start on a vector boundary
        where that pads them by at most ``Tuning.direct_row_pad``: its kw = 0 and 1 taps then load aligned
        vectors, where an odd row length left nearly every load split across two cache lines
        (``tuning.DIRECT_ROW_PAD``)."""
        if not self.copy:
            return self.W
        row = math.ceil((self.W + self.pl + self.pr) / self.sw)
        padded = round_up(row, self.vl)
        return padded if self.method == "direct" and self.sw > 1 and padded <= row * (1 + self.tuning.direct_row_pad) \
            else row

    @property
    def phases(self) -> tuple[tuple[int, int], ...]:
        """Stride phases (row, col) some tap reads; only these are copied."""
        ps = {((kh * self.dh) % self.sh, (kw * self.dw) % self.sw) for kh in range(self.KH) for kw in range(self.KW)}
        return tuple(sorted(ps))

    @property
    def plane(self) -> int:
        return self.Hq * self.Wq

    @property
    def chan_stride(self) -> int:
        """Elements between channels of the (copied or original) input the kernel reads. A copy's
        stride is kept off multiples of 1 KiB, where every k step's loads would share L1 sets."""
        if not self.copy:
            return self.H * self.W
        cs = self.plane * len(self.phases)
        return cs + 16 if cs % 256 == 0 else cs

    @property
    def pack_b(self) -> bool:
        """1x1 direct without a copy: each column tile's pixel vectors are packed into a contiguous
        K-blocked panel in scratch, so channel planes a multiple of 1-4 KiB apart (same L1 sets)
        don't evict the panel while every row block reuses it, as MLAS packs B. Measured (AVX2):
        cuvil/ORT 1.30 -> 0.85 on 256x64x64, 1.09 -> 0.68 on 64->256 32x32; only where the panel
        outgrows ``Tuning.panel_bytes`` or its planes alias, and enough row blocks reuse it (else slower)."""
        if not (self.method == "direct" and not self.copy and self.T == 1):
            return False
        panel = 4 * self.Cg * self.nv * self.vl
        aliased = (4 * self.chan_stride) % 1024 == 0 and panel >= 4096
        return -(-self.OCg // self.mr) >= self.tuning.pack_min_row_blocks and (panel > self.tuning.panel_bytes or aliased)

    @property
    def panel_k(self) -> int:
        """Channels per K block of the packed panel: equal blocks, a multiple of 4, within panel_bytes."""
        kmax = max(4, self.tuning.panel_bytes // (4 * self.nv * self.vl) // 4 * 4)
        per_block = -(-self.Cg // -(-self.Cg // kmax))
        return min(self.Cg, -(-per_block // 4) * 4)

    @property
    def panel_floats(self) -> int:
        return self.panel_k * self.nv * self.vl if self.pack_b else 0

    def tap_offset(self, kh: int, kw: int) -> int:
        """Offset of tap (kh, kw) from output pixel (oh, ow)'s base oh*Wq + ow inside a channel."""
        ph, pw = (kh * self.dh) % self.sh, (kw * self.dw) % self.sw
        phase = self.phases.index((ph, pw)) if self.copy else 0
        return phase * self.plane + (kh * self.dh // self.sh) * self.Wq + kw * self.dw // self.sw

    @property
    def vpr(self) -> int:  # vector slots per output row (direct / depthwise)
        return math.ceil(self.OW / self.vl)

    @property
    def slots(self) -> int:
        """Vector columns of the GEMM: pixel vectors, or output-channel vectors when transposed."""
        P = self.OH * self.OW
        if self.method in ("transposed", "rows"):
            return math.ceil(self.OCg / self.vl)
        return math.ceil(P / self.vl) if self.method == "im2col" else self.OH * self.vpr

    @property
    def copy_floats(self) -> int:
        if not self.copy:
            return 0
        chans = 1 if self.method == "depthwise" else self.Cg
        return chans * self.chan_stride + 2 * self.vl + self.Wq  # slack: tail vectors read past a row

    @property
    def lanes_channels(self) -> int:
        """dwlanes: channels padded to whole vectors (a pixel's place in the channel-last plane)."""
        return -(-self.C // self.vl) * self.vl

    @property
    def lanes_plane_floats(self) -> int:
        """dwlanes: the zero-bordered channel-last copy of one group of VL channels."""
        return (self.H + self.pt + self.pb) * (self.W + self.pl + self.pr) * self.vl

    @property
    def im2col_floats(self) -> int:
        return self.K * self.slots * self.vl if self.method == "im2col" else 0

    @property
    def streams_weights(self) -> bool:
        """Direct / im2col: the packed weights (every group's, rows padded to MR) outgrow the L2 budget, so each
        inference reads them from L3 or DRAM and the tiles prefetch them (``Tuning.direct_prefetch_bytes``)."""
        return 4 * -(-self.OCg // self.mr) * self.mr * self.K * self.group > self.tuning.l2_budget_bytes

    @property
    def rows_outer(self) -> bool:
        """Loop order: row blocks outside column tiles when the weights, not the input, overflow L2."""
        a_bytes = 4 * self.OCg * self.K
        b_bytes = 4 * (self.im2col_floats if self.method == "im2col" else self.Cg * self.chan_stride)
        return self.slots > self.nv and a_bytes > self.tuning.l2_budget_bytes >= b_bytes and not self.pack_b

    @property
    def im2col_offset(self) -> int:  # 64-byte aligned relative to scratch
        return -(-self.copy_floats // 16) * 16

    @property
    def winograd_images(self) -> WinogradImages:
        """The images a Winograd conv transforms: the input's, or a dilated conv's phase planes."""
        im = winograd_images(self.H, self.W, self.pads, (self.dh, self.dw), self.tuning)
        if im is None:
            raise ValueError(f"conv_plan: dilation {self.dh}x{self.dw} with pads {self.pads} has no phase planes")
        return im

    @property
    def winograd_geometry(self) -> WinogradGeometry:
        im = self.winograd_images
        return WinogradGeometry.for_tuning(self.vl, self.C, im.H, im.W, self.OC, im.pads, self.mr, self.tuning)

    @property
    def phase_floats(self) -> tuple[int, int]:
        """A dilated Winograd conv's phase-split copies in scratch, in floats: the input's, and the
        output's (a residual is split alike, after it); (0, 0) undilated."""
        if self.dh == 1:
            return 0, 0
        im, g = self.winograd_images, self.winograd_geometry
        return round_up(im.count * self.C * im.H * im.W, 16), round_up(im.count * self.OC * g.OH * g.OW, 16)

    def phase_copy_floats(self, residual: bool) -> int:
        """Floats of a dilated Winograd conv's phase-split copies in scratch (the input's, the output's,
        and with ``residual`` the residual's), before the Winograd transforms' own; 0 undilated."""
        xs, ys = self.phase_floats
        return xs + (2 if residual else 1) * ys

    @property
    def scratch_bytes(self) -> int:
        """What a kernel of this plan needs at most (with a residual); :meth:`scratch_for` is exact."""
        return self.scratch_for(residual=True)

    def scratch_for(self, residual: bool) -> int:
        """Scratch bytes of this plan's kernel; only a dilated Winograd conv's depend on ``residual``
        (its phase-split copy: ASPP's rate-6 branch, 64 channels, 390 KB, reserved for none before)."""
        if self.method == "winograd":
            return 4 * (self.phase_copy_floats(residual) + self.winograd_geometry.floats)
        if self.method == "dwlanes":
            return 4 * self.lanes_plane_floats
        return 4 * (self.im2col_offset + self.im2col_floats + self.panel_floats)

    @property
    def pads(self) -> tuple[int, int, int, int]:
        return self.pt, self.pl, self.pb, self.pr


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
        tmp = ConvPlan(**base, method="depthwise", mr=1, nv=1, copy=True)  # nv: vectors per tile,
        nv = max(1, min(tmp.OH * tmp.vpr, target.tuning.vector_registers // 2))  # whole rows where they fit
        return ConvPlan(**base, method="depthwise", mr=1, nv=nv, copy=True)
    tmp = ConvPlan(**base, method="rows", mr=1, nv=1, copy=False)
    if rows_wins(tmp):
        # pixels of one output row x channel vectors; at least 4 pixels per tile, as the weights stream
        # once per tile (512x4x4 on znver4: 2x8 1.15 ms, 4x4 0.56 ms)
        mr, nv = choose_tile(target, tmp.OW, tmp.slots, min_mr=min(tmp.OW, 4))
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


def rows_wins(p: ConvPlan) -> bool:
    """Shapes where the rows kernel beats direct / im2col (measured, see rows.py)."""
    t = p.tuning
    return (p.vl * 32 in t.rows_widths and p.group == 1 and p.KH == p.KW and p.KH in t.rows_kernels
            and min(p.C, p.OC) >= t.rows_min_channels and p.OH * p.OW <= t.rows_max_pixels)


def column_tiles(panels: int, nv: int) -> list[tuple[int, int, int]]:
    """(first panel, tiles, panels per tile): full tiles of NV, then one of the rest (64 = 21x3 + 1,
    not 20x3 + 2x2: a smaller second loop body, measured as fast)."""
    full, rest = divmod(panels, nv)
    return [g for g in ((0, full, nv), (full * nv, 1, rest)) if g[1] and g[2]]
