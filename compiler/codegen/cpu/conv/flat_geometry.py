"""Where a ``dwflat`` depthwise conv reads (``dwflat.py``), from its geometry alone (plain Python and NumPy).

Output pixel p of a channel reads input pixel ``p + offsets[tap]``: its lanes outside the image are known
per tap and output vector (``lanes``). Away from the plane's top and bottom rows the lanes repeat every
``OW / gcd(OW, VL)`` vectors (one row period), so a run of whole periods is one loop body (``first``,
``body``, ``count``) and only the vectors around it are unrolled: a 64x64 plane is one loop of 62 rows
with its first and last rows apart, instead of 256 vectors of straight-line code.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ....tuning import Tuning

FLAT_UNROLLED_VECTORS = 16
"""Planes of up to this many output vectors are unrolled whole (MobileNetV1's 128x16x16, 16 vectors, x86-avx512:
3.84-3.95 us unrolled, 4.43 as a loop); larger ones loop over their row periods (144x24x24, 36 vectors: 18.4 us
unrolled, 15.1 as a loop)."""
DWFLAT_BLOCK = 2
"""Output vectors a ``dwflat`` conv sums tap by tap together (1 to 8 within 5% of each other; all 36 of a 24x24
plane at once 1.4x slower: the accumulators spill)."""


@dataclass(frozen=True)
class FlatGeometry:
    lanes: np.ndarray  # [tap, output vector, lane]: the lane's input pixel lies in the image (and the lane in the plane)
    offsets: tuple[int, ...]  # per tap: its input pixel's index minus the output pixel's
    first: int  # the first vector of the loop
    body: int  # vectors per iteration: whole row periods, at least a block
    count: int  # iterations; 0: every vector unrolled

    @property
    def vectors(self) -> int:
        return self.lanes.shape[1]

    @property
    def unrolled(self) -> int:
        return self.vectors - self.body * self.count


@functools.lru_cache(maxsize=256)
def flat_geometry(H: int, W: int, KH: int, KW: int, pads: tuple, dilations: tuple, vl: int,
                  block: int = DWFLAT_BLOCK) -> FlatGeometry:
    """The geometry of a stride-1 conv whose output rows are as long as its input rows (``flat_applies``), its
    loop body at least ``block`` vectors."""
    pt, pl, pb, _ = pads
    dh, dw = dilations
    OH = H + pt + pb - dh * (KH - 1)
    P = OH * W
    q = np.arange(-(-P // vl) * vl)
    r, c = q // W, q % W
    taps, offsets = [], []
    for kh in range(KH):
        for kw in range(KW):
            sr, sc = r + kh * dh - pt, c + kw * dw - pl
            taps.append((q < P) & (sr >= 0) & (sr < H) & (sc >= 0) & (sc < W))
            offsets.append((kh * dh - pt) * W + kw * dw - pl)
    lanes = np.stack(taps).reshape(KH * KW, -1, vl)
    lanes.flags.writeable = False  # cached and shared: nobody may change it
    period = W // math.gcd(W, vl)
    body = period * -(-block // period)
    first, count = _longest_run(lanes, body) if lanes.shape[1] > FLAT_UNROLLED_VECTORS else (0, 0)
    return FlatGeometry(lanes, tuple(offsets), first, body, count)


def _longest_run(lanes: np.ndarray, body: int) -> tuple[int, int]:
    """(first vector, repeats) of the longest run of repeats of one ``body``-vector pattern (two at least; else
    (0, 0)), the earliest of the longest."""
    n = lanes.shape[1]
    key = [lanes[:, v].tobytes() for v in range(n)]
    best, start = (0, 0), None
    for v in range(body, n + 1):
        if v < n and key[v] == key[v - body]:
            start = v if start is None else start
            continue
        if start is not None:
            k = (v - start) // body + 1
            if k >= 2 and k > best[1]:
                best = (start - body, k)
            start = None
    return best


def flat_applies(t: Tuning, H: int, W: int, KH: int, KW: int, strides, pads, dilations, vl: int) -> bool:
    """A depthwise conv the ``dwflat`` method runs: stride 1, output rows as long as input rows (so each tap is
    one offset in the flattened plane), and at most ``Tuning.dwflat_max_vectors`` vectors outside its loop."""
    pt, pl, pb, pr = pads
    if not (tuple(strides) == (1, 1) and pl + pr == dilations[1] * (KW - 1) and H + pt + pb > dilations[0] * (KH - 1)
            and t.dwflat_max_vectors):
        return False
    return flat_geometry(H, W, KH, KW, tuple(pads), tuple(dilations), vl).unrolled <= t.dwflat_max_vectors


def flat_wins(t: Tuning, H: int, W: int, KH: int, KW: int, strides, pads, dilations, vl: int) -> bool:
    """The cost model's rule (``tuning.DWFLAT_MAX_VECTORS``): up to 3x3 kernels, and from
    ``Tuning.dwflat_min_vectors`` vectors' worth of pixels."""
    return (KH * KW <= 9 and H * W >= t.dwflat_min_vectors * vl
            and flat_applies(t, H, W, KH, KW, strides, pads, dilations, vl))
