"""A Winograd conv's shape decisions and geometry (plain Python): where F(m x m, 3x3) applies and
wins, its m, the sizes and scratch layout of its transforms, and the register tile of its point GEMMs.

Why apart from :mod:`.plan`: the plan asks these questions, and the emitter (``winograd.py``) and the
packer (``pack.py``) read the geometry; all three must agree, and none of it is about other methods.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....target import Target
from ....tuning import Tuning
from ..tiles import grid_cost
from .phases import WinogradImages, winograd_images


def winograd_applies(KH: int, KW: int, strides, pads, dilations, group: int, H: int, W: int,
                     t: Tuning) -> WinogradImages | None:
    """The images a 3x3 stride-1 conv's Winograd transforms (:func:`winograd_images`), or None where it cannot."""
    if not (KH == KW == 3 and tuple(strides) == (1, 1) and group == 1):
        return None
    im = winograd_images(H, W, pads, dilations, t)
    if im is None or max(im.pads) > 2 or min(im.H + im.pads[0] + im.pads[2], im.W + im.pads[1] + im.pads[3]) < 3:
        return None
    return im


def winograd_tile(t: Tuning, H: int, W: int, pads) -> int:
    """m of F(m x m, 3x3) for a Winograd conv."""
    pt, pl, pb, pr = pads
    return t.winograd_f4 if (H + pt + pb - 2) * (W + pl + pr - 2) >= t.winograd_f4_min_pixels else 2


def winograd_wins(t: Tuning, vl: int, C: int, H: int, W: int, OC: int, pads) -> bool:
    """Shapes where Winograd beats the direct kernel (measured, see winograd.py)."""
    if vl * 32 not in t.winograd_widths:
        return False
    pt, pl, pb, pr = pads
    return C >= 16 and OC >= 16 and (H + pt + pb - 2) * (W + pl + pr - 2) >= t.winograd_min_pixels


def round_up(x: int, k: int) -> int:
    return -(-x // k) * k


@dataclass(frozen=True)
class WinogradGeometry:
    """Sizes and scratch offsets (in floats) of a Winograd F(m x m, 3x3) conv (``winograd.py``).

    TH x TW tiles of m x m outputs, a = m + 2, A = a*a transform points, per_load tiles per VL-float
    load; a chunk of VL tiles is R whole tile rows (R > 1) or one of nch segments of a tile row;
    blocks of TRB tile rows (nblk of them); St: row length of V and M, slots: its vectors; vs, ms:
    per-point strides of V and M; the zero row (zlen floats), V and M follow each other in scratch.
    """

    OH: int
    OW: int
    TH: int
    TW: int
    m: int
    a: int
    A: int
    R: int
    nch: int
    per_load: int
    TRB: int
    nblk: int
    St: int
    slots: int
    vs: int
    ms: int
    zlen: int

    @property
    def v_off(self) -> int:
        return self.zlen

    @property
    def m_off(self) -> int:
        return self.zlen + self.A * self.vs

    @property
    def floats(self) -> int:
        return self.zlen + self.A * (self.vs + self.ms)

    @staticmethod
    def of(vl: int, C: int, H: int, W: int, OC: int, pads, m: int, block_bytes: int) -> WinogradGeometry:
        """``block_bytes``: V + M of a block of tile rows at most (``Tuning.winograd_block_bytes``)."""
        pt, pl, pb, pr = pads
        OH, OW = H + pt + pb - 2, W + pl + pr - 2
        TH, TW, a = -(-OH // m), -(-OW // m), m + 2
        A, per_load = a * a, vl // m  # tiles per VL-float load
        R, nch = (vl // TW, 1) if vl % TW == 0 and TW % per_load == 0 else (1, -(-TW // vl))

        rows = round_up(TH, R)
        while rows > R and _block_bytes(A, C, OC, rows, TW, R, nch, vl) > block_bytes:
            rows -= R
        nblk = -(-TH // rows)
        TRB = round_up(-(-TH // nblk), R)
        St = _stride(TRB, TW, R, nch, vl)
        zlen = round_up(m * nch * vl + 2 * vl + m, 16)  # the zero row that padding rows read
        vs, ms = C * St + 16, OC * St + 16  # per-point strides: +64 B, so a tile's A points don't share L1 sets
        return WinogradGeometry(OH, OW, TH, TW, m, a, A, R, nch, per_load, TRB, nblk, St, -(-TRB * TW // vl), vs, ms, zlen)

    @staticmethod
    def for_tuning(vl: int, C: int, H: int, W: int, OC: int, pads, m: int, t: Tuning) -> WinogradGeometry:
        """:meth:`of` at the block budget ``t`` gives this layer (:func:`block_budget`)."""
        return WinogradGeometry.of(vl, C, H, W, OC, pads, m, block_budget(t, vl, C, H, W, OC, pads, m))


def block_budget(t: Tuning, vl: int, C: int, H: int, W: int, OC: int, pads, m: int) -> int:
    """V + M of a block of tile rows at most: ``Tuning.winograd_block_bytes``, raised where more blocks
    would read the weights U (every block reads all of them) more than ``winograd_block_weight_ratio``
    times V and M's bytes, and all of V and M where they take at most ``winograd_whole_l2s`` times the
    L2 and U is not small against them (``winograd_small_weights``); with that ratio 0, exactly
    ``winograd_block_bytes``."""
    if t.winograd_block_weight_ratio <= 0:
        return t.winograd_block_bytes
    whole = WinogradGeometry.of(vl, C, H, W, OC, pads, m, 1 << 62)  # one block
    vm, u = _block_bytes(whole.A, C, OC, whole.TRB, whole.TW, whole.R, whole.nch, vl), 4 * whole.A * C * OC
    if vm <= t.winograd_whole_l2s * t.l2_bytes and u * t.winograd_small_weights > vm:
        return vm  # one block: about the L2's size, and reading U again would cost more than smaller blocks gain
    most = max(1, int(t.winograd_block_weight_ratio * vm / u))  # blocks at most
    rows = round_up(-(-whole.TH // most), whole.R)  # tile rows a block then holds at least
    return max(t.winograd_block_bytes, _block_bytes(whole.A, C, OC, rows, whole.TW, whole.R, whole.nch, vl))


def _block_bytes(A: int, C: int, OC: int, rows: int, TW: int, R: int, nch: int, vl: int) -> int:
    """V + M of a block of ``rows`` tile rows, in bytes."""
    return 4 * A * (C + OC) * _stride(rows, TW, R, nch, vl)


def _stride(rows: int, TW: int, R: int, nch: int, vl: int) -> int:
    """The row length of V and M (floats) for a block of ``rows`` tile rows."""
    return rows * TW if R > 1 else round_up((rows - 1) * TW + nch * vl, vl)


def row_split_bytes(vl: int, C: int, H: int, W: int, OC: int, pads, m: int, block_bytes: int,
                    parts: int) -> tuple[int, int] | None:
    """(a ``block_bytes`` that cuts the layer into a multiple of ``parts`` blocks of tile rows, each no larger
    than ``block_bytes`` cuts them, and that many blocks): so each of ``parts`` parts runs whole blocks of equal
    count (a layer split by rows, ``split.py``); None when its tile rows do not make that many blocks."""
    g = WinogradGeometry.of(vl, C, H, W, OC, pads, m, block_bytes)
    for n in range(parts * -(-g.nblk // parts), g.TH // g.R + 1, parts):
        cut = _block_bytes(g.A, C, OC, round_up(-(-g.TH // n), g.R), g.TW, g.R, g.nch, vl)
        if WinogradGeometry.of(vl, C, H, W, OC, pads, m, cut).nblk == n:
            return cut, n
    return None


def winograd_gemm_tile(target: Target, g: WinogradGeometry, OC: int) -> tuple[int, int]:
    """(MR, NV) of the point GEMMs: the fewest modelled cycles (``tiles.grid_cost``) among tiles
    that keep their NV B vectors in registers and broadcast at most 8 U values a step: measured on
    znver3, 13x1 ran at 0.7x of 6x2 and 3x4 (17 registers) spilled."""
    best = None
    for nv in range(1, min(g.slots, 8) + 1):
        for mr in range(1, min(OC, 8) + 1):
            if mr * nv + nv + 1 > target.tuning.vector_registers:
                continue
            cost = grid_cost(OC, g.slots, mr, nv)
            if best is None or (cost, -mr * nv) < best[:2]:
                best = (cost, -mr * nv, mr, nv)
    return best[2], best[3]
