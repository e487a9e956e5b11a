"""A conv's plan as data: its method, register tile and the memory layout that follows from them
(the copy's planes and bands, strides between channels, scratch), which the emitters (``direct.py``,
``rows.py``, ``winograd.py``, ...) and the packer (``pack.py``) all read; :func:`.plan.conv_plan` makes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ....tuning import Tuning
from .phases import WinogradImages, winograd_images
from .winograd_geometry import WinogradGeometry, round_up


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
