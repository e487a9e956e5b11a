"""Tile plans and NumPy weight packers for the GEMM / Conv emitters (``gemm.py``, ``conv.py``).

Pure NumPy and plain Python, so the coordinator's pre-flight lowering and the device produce the
same bytes. Every packer returns a C-contiguous float32 array; the caller places it 64-byte aligned.

Layouts (VL = ``target.vector_floats``):

* ``pack_gemm_b(W[K,N], target, trans_b=False, alpha=1.0) -> [ceil(N/VL), K, VL]``: one panel per
  vector of output columns, zero-padded. It does not depend on M, so a Gemm/MatMul with a constant
  B packs it once. ``trans_b`` takes W as [N,K] (ONNX Gemm transB); ``alpha`` is folded in.
* ``pack_conv_weights(W[OC,C/g,KH,KW], target, in_shape=(N,C,H,W), strides, pads, dilations,
  group) -> [group, ceil(OCg/MR), C/g*KH*KW, MR]`` for the GEMM-style paths (MR from
  :func:`conv_plan`, rows past OCg zero), ``[OC, KH*KW]`` for the depthwise path, or
  ``[group, ceil(OCg/VL), C/g, VL]`` for 1x1 convs over few pixels ("transposed": output channels
  along the vectors). K runs over (channel, kh, kw), the order the kernels walk. Rows plans (3x3
  over many channels, small outputs: ``conv_rows.py``): per tile of nv panels of ``conv_rows.column_tiles``,
  ``[C, KH*KW, nv, VL]``, the tiles one after another (a flat array). Winograd plans
  (3x3 stride 1, AVX2): ``winograd.pack_winograd_weights`` -> ``[(m+2)^2, ceil(OC/MR), C, MR]``.

:func:`conv_plan` is the single place that picks the conv method and register tile; the emitter
and the packer both call it, so they cannot disagree. :func:`conv_scratch_bytes` is what the
memory planner reserves for the conv's ``scratch`` argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..target import Target

WINOGRAD = True  # 3x3 stride-1 convs via Winograd where it was measured to win
WINOGRAD_WIDTHS = {256}  # vector widths it was measured to win on (AVX2 znver3); tests add others
WINOGRAD_F4 = 4  # large-tile m; F(4x4) errs up to ~2e-5 x max|output| per layer, 2 keeps F(2x2) everywhere
WINOGRAD_F4_MIN_PIXELS = 256  # F(4x4) from 16x16 outputs up; at 8x8 (4 tiles) F(2x2) is 1.4x faster
WINOGRAD_MIN_PIXELS = 64  # 512x4x4 (4 tiles): the 16/9x larger transformed weights dominate, 0.8x
L2_BUDGET_BYTES = 768 * 1024  # weights up to this size stay cache resident across pixel tiles
IM2COL_MAX_PIECES = 2048  # code-size bound on the unrolled im2col row copies (per channel)


def vector_lanes(target: Target) -> int:
    return target.vector_floats


def register_count(target: Target) -> int:
    """Architectural vector registers: 16 ymm on AVX2, 32 zmm on AVX-512, 32 on AArch64."""
    if target.triple.startswith(("x86_64", "i686", "i386")):
        return 32 if target.vector_bits == 512 else 16
    return 32


def _reserved_registers(target: Target) -> int:
    """Vector registers a tile leaves free: x86 FMAs take the B vector as a memory operand, so one
    broadcast register is enough (4x3 tiles: 12 accumulators); AArch64 keeps B in registers."""
    return 1 if target.triple.startswith(("x86_64", "i686", "i386")) else 2


def _step_cycles(mr: int, nv: int) -> float:
    """Cycles per k-step of an mr x nv tile: 2 FMA ports, 2 load ports, and (in practice) 12
    accumulators needed to hide the FMA latency."""
    return max(mr * nv / 2, (mr + nv) / 2, 6.0)


def choose_tile(target: Target, rows: int, slots: int, max_nv: int = 8) -> tuple[int, int]:
    """(MR, NV): accumulator rows x vector columns minimising modelled cycles over the whole
    rows x slots problem, tails included (rows: output rows / channels, slots: vectors)."""
    return tile_cost(target, rows, slots, max_nv)[1:]


def tile_cost(target: Target, rows: int, slots: int, max_nv: int = 8) -> tuple[float, int, int]:
    """(modelled cycles per k step of the whole problem, MR, NV) of the best tile."""
    if rows <= 0 or slots <= 0:
        return 0.0, 1, 1
    regs, reserved = register_count(target), _reserved_registers(target)
    best: tuple[float, int, int, int] | None = None
    for nv in range(1, min(max_nv, slots) + 1):
        mr_max = max(1, min(rows, (regs - nv - reserved) // nv, 16 if regs == 16 else 28))
        for mr in range(1, mr_max + 1):
            full_r, tail_r = divmod(rows, mr)
            full_s, tail_s = divmod(slots, nv)
            cost = 0.0
            for r, nr in ((mr, full_r), (tail_r, 1 if tail_r else 0)):
                for s, ns in ((nv, full_s), (tail_s, 1 if tail_s else 0)):
                    if r and s:
                        cost += nr * ns * (_step_cycles(r, s) + 0.02 * r * s)
            key = (cost, -mr * nv, mr, nv)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[0], best[2], best[3]


# GEMM ----------------------------------------------------------------------------------------------
def gemm_tile(target: Target, M: int, N: int) -> tuple[int, int]:
    """The register tile emit_gemm uses: (MR rows of C, NV vectors of VL columns)."""
    return choose_tile(target, M, math.ceil(N / vector_lanes(target)))


def pack_gemm_b(W: np.ndarray, target: Target, *, trans_b: bool = False, alpha: float = 1.0) -> np.ndarray:
    """B[K,N] (or [N,K] with trans_b) -> panels [ceil(N/VL), K, VL], zero-padded, times alpha."""
    B = np.asarray(W, dtype=np.float64)
    if trans_b:
        B = B.T
    K, N = B.shape
    vl = vector_lanes(target)
    npan = math.ceil(N / vl)
    out = np.zeros((K, npan * vl), dtype=np.float64)
    out[:, :N] = B * alpha
    return np.ascontiguousarray(out.reshape(K, npan, vl).transpose(1, 0, 2), dtype=np.float32)


# Conv ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvPlan:
    """Everything the conv emitter and packer must agree on (all sizes in elements)."""

    PANEL_BYTES: ClassVar[int] = 16 * 1024  # packed B panel (K block x NV vectors): half of L1
    PACK_MIN_ROW_BLOCKS: ClassVar[int] = 12  # fewer don't amortise the packing copy (MobileNetV2's 192->32)

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
    method: str  # "depthwise" | "direct" | "im2col" | "transposed" | "winograd" | "rows"
    mr: int
    nv: int
    copy: bool  # inputs go through a zero-padded, stride-phase-split copy in scratch

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
    def Hq(self) -> int:  # rows of one phase plane
        return math.ceil((self.H + self.pt + self.pb) / self.sh) if self.copy else self.H

    @property
    def Wq(self) -> int:
        return math.ceil((self.W + self.pl + self.pr) / self.sw) if self.copy else self.W

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
        outgrows half of L1 or its planes alias, and enough row blocks reuse it (else slower)."""
        if not (self.method == "direct" and not self.copy and self.T == 1):
            return False
        panel = 4 * self.Cg * self.nv * self.vl
        aliased = (4 * self.chan_stride) % 1024 == 0 and panel >= 4096
        return -(-self.OCg // self.mr) >= self.PACK_MIN_ROW_BLOCKS and (panel > self.PANEL_BYTES or aliased)

    @property
    def panel_k(self) -> int:
        """Channels per K block of the packed panel: equal blocks, a multiple of 4, within PANEL_BYTES."""
        kmax = max(4, self.PANEL_BYTES // (4 * self.nv * self.vl) // 4 * 4)
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
    def im2col_floats(self) -> int:
        return self.K * self.slots * self.vl if self.method == "im2col" else 0

    @property
    def rows_outer(self) -> bool:
        """Loop order: row blocks outside column tiles when the weights, not the input, overflow L2."""
        a_bytes = 4 * self.OCg * self.K
        b_bytes = 4 * (self.im2col_floats if self.method == "im2col" else self.Cg * self.chan_stride)
        return self.slots > self.nv and a_bytes > L2_BUDGET_BYTES >= b_bytes and not self.pack_b

    @property
    def im2col_offset(self) -> int:  # 64-byte aligned relative to scratch
        return -(-self.copy_floats // 16) * 16

    @property
    def scratch_bytes(self) -> int:
        if self.method == "winograd":
            from .winograd import winograd_scratch_bytes
            return winograd_scratch_bytes(self, self.C, self.H, self.W, self.OC, (self.pt, self.pl, self.pb, self.pr),
                                          self.mr)
        return 4 * (self.im2col_offset + self.im2col_floats + self.panel_floats)

    @property
    def vector_floats(self) -> int:  # lets the plan stand in for its Target in winograd's size helpers
        return self.vl


def winograd_tile(vl: int, C: int, H: int, W: int, OC: int, pads) -> int:
    """m of F(m x m, 3x3) for a Winograd conv."""
    pt, pl, pb, pr = pads
    return WINOGRAD_F4 if (H + pt + pb - 2) * (W + pl + pr - 2) >= WINOGRAD_F4_MIN_PIXELS else 2


def winograd_wins(vl: int, C: int, H: int, W: int, OC: int, pads) -> bool:
    """Shapes where Winograd beats the direct kernel (measured, see winograd.py)."""
    if not WINOGRAD or vl * 32 not in WINOGRAD_WIDTHS:
        return False
    pt, pl, pb, pr = pads
    return C >= 16 and OC >= 16 and (H + pt + pb - 2) * (W + pl + pr - 2) >= WINOGRAD_MIN_PIXELS


def conv_plan(target: Target, N: int, C: int, H: int, W: int, OC: int, KH: int, KW: int,
              strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1) -> ConvPlan:
    """Pick the method and tile. pads are ONNX order (top, left, bottom, right).

    depthwise: group == C == OC; direct: implicit GEMM reading pixel vectors straight from the
    (padded copy of the) input, when whole output rows fill vectors well; im2col otherwise (small
    output rows), packing B panels so no lane is wasted; transposed: 1x1 convs over so few pixels
    that output channels fill vectors better (the input is read as A, transposed stores); rows
    (``conv_rows.rows_wins``): 3x3 convs over many channels with small outputs, output channels
    along the vectors and no product with padding computed (ResNet-18's 512x4x4: 1.2x).
    """
    vl = vector_lanes(target)
    sh, sw = strides
    dh, dw = dilations
    pt, pl, pb, pr = pads
    if C % group or OC % group:
        raise ValueError(f"conv_plan: group {group} must divide C={C} and OC={OC}")
    base = dict(N=N, C=C, H=H, W=W, OC=OC, KH=KH, KW=KW, sh=sh, sw=sw, pt=pt, pl=pl, pb=pb, pr=pr,
                dh=dh, dw=dw, group=group, vl=vl)
    if (KH == KW == 3 and sh == sw == 1 and dh == dw == 1 and group == 1 and max(pads) <= 2 and min(H + pt + pb, W + pl + pr) >= 3
            and winograd_wins(vl, C, H, W, OC, pads)):
        m = winograd_tile(vl, C, H, W, OC, pads)
        return ConvPlan(**base, method="winograd", mr=m, nv=1, copy=False)  # mr: the output tile, F(m x m, 3x3)
    if group == C == OC and group > 1:
        tmp = ConvPlan(**base, method="depthwise", mr=1, nv=1, copy=True)  # nv: vectors per tile,
        nv = max(1, min(tmp.OH * tmp.vpr, register_count(target) // 2))  # whole rows where they fit
        return ConvPlan(**base, method="depthwise", mr=1, nv=nv, copy=True)
    from .conv_rows import rows_wins
    tmp = ConvPlan(**base, method="rows", mr=1, nv=1, copy=False)
    if rows_wins(vl, tmp):
        mr, nv = choose_tile(target, tmp.OW, tmp.slots)  # pixels of one output row x channel vectors
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
    use_im2col = eff_im2col - eff_direct >= 0.1 and pieces <= IM2COL_MAX_PIECES
    method = "im2col" if use_im2col else "direct"
    tmp = ConvPlan(**base, method=method, mr=1, nv=1, copy=copy)
    mr, nv = choose_tile(target, tmp.OCg, tmp.slots)
    return ConvPlan(**base, method=method, mr=mr, nv=nv, copy=copy)


def conv_scratch_bytes(target: Target, N: int, C: int, H: int, W: int, OC: int, KH: int, KW: int,
                       strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1) -> int:
    """Bytes the conv kernel's ``scratch`` argument must point to (0: pass null)."""
    return conv_plan(target, N, C, H, W, OC, KH, KW, strides, pads, dilations, group).scratch_bytes


def pack_conv_weights(Wt: np.ndarray, target: Target, in_shape, strides=(1, 1), pads=(0, 0, 0, 0),
                      dilations=(1, 1), group: int = 1) -> np.ndarray:
    """W[OC, C/g, KH, KW] -> the layout emit_conv2d reads for this geometry (see module doc)."""
    OC, Cg, KH, KW = Wt.shape
    N, C, H, W = in_shape
    p = conv_plan(target, N, C, H, W, OC, KH, KW, strides, pads, dilations, group)
    if p.method == "winograd":
        from .winograd import pack_winograd_weights
        return pack_winograd_weights(Wt, target, p.mr, H, W, pads)
    w = np.asarray(Wt, dtype=np.float32)
    if p.method == "depthwise":
        return np.ascontiguousarray(w.reshape(OC, KH * KW))
    if p.method == "rows":  # per column tile of nv panels [C, KH*KW, nv, VL]: one contiguous stream
        from .conv_rows import column_tiles
        npan = math.ceil(OC / p.vl)
        out = np.zeros((npan * p.vl, Cg, KH * KW), dtype=np.float32)
        out[:OC] = w.reshape(OC, Cg, KH * KW)
        out = out.reshape(npan, p.vl, Cg, KH * KW)
        tiles = [out[s: s + nv].transpose(2, 3, 0, 1).ravel() for first, count, nv in column_tiles(npan, p.nv)
                 for s in range(first, first + count * nv, nv)]
        return np.ascontiguousarray(np.concatenate(tiles))
    if p.method == "transposed":  # per group, W_g^T [C/g, OC/g] packed as pack_gemm_b panels
        return np.ascontiguousarray(np.stack([pack_gemm_b(wg.reshape(p.OCg, Cg), target, trans_b=True)
                                              for wg in w.reshape(group, p.OCg, Cg)]))
    nb = math.ceil(p.OCg / p.mr)
    out = np.zeros((group, nb * p.mr, p.K), dtype=np.float32)
    out[:, : p.OCg, :] = w.reshape(group, p.OCg, p.K)
    return np.ascontiguousarray(out.reshape(group, nb, p.mr, p.K).transpose(0, 1, 3, 2))
