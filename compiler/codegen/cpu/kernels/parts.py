"""The vocabulary of a layer split over threads: a part, its ranges, and the cost model's count.

A split layer runs as parts, each a layer of its own over a range of the output's axis 1 (channels,
heads, tokens) or of a GEMM's rows, reading its operands at byte offsets into the whole layer's. The
splitters (``split.py``: convs, fully connected layers, pools; ``split_rows.py``: elementwise ops and
GEMMs of several rows) build them; the lowering runs them as one job of the worker pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....target import Target
from .base import KernelKey


@dataclass(frozen=True)
class Part:
    """One part of a split layer: its kernel and how its operands are found in the whole layer's."""

    key: KernelKey  # the part's kernel (``packed`` holds "const" for constant inputs)
    target: Target  # the whole layer's conv choice fixed for the part's geometry
    byte_offsets: tuple[int, ...]  # per input: added to the arena pointer (constants: unused)
    out_offset: int  # bytes into the output
    rows: tuple[int, int]  # the output range: of channels (axis 1), of a 2-D GEMM's rows, or (axis 2) of a conv's blocks of output rows or pixel vectors
    axes: tuple[int | None, ...]  # per input: the axis of a constant sliced to ``rows`` (None: whole)
    axis: int = 1  # the output axis ``rows`` ranges over; only parts over axis 1 may take a follower
    after_job_only: bool = False  # worth splitting only where a job just wrote the input, spread over the cores


def even_ranges(units: int, parts: int, unit: int) -> list[tuple[int, int]]:
    """``parts`` ranges of whole units, sizes differing by at most one unit, in channels."""
    out, lo = [], 0
    for p in range(parts):
        n = units // parts + (p < units % parts)
        out.append((lo * unit, (lo + n) * unit))
        lo += n
    return out


def min_part_macs(target: Target) -> float:
    """The cost model's smallest part: worth ``parallel_sync_ratio`` handoffs at the assumed speed."""
    t = target.tuning
    return t.parallel_sync_ratio * t.parallel_sync_us * t.conv_macs_per_us


def cost_model_ranges(target: Target, total: int, unit: int, work: float,
                      per_us: int | None = None) -> list[tuple[int, int]] | None:
    """Ranges of whole ``unit``s over ``total`` output channels, the last taking the rest: one per
    thread at most, per unit and per ``min_part_macs`` of the layer's ``work`` (multiply-adds, or the
    elements a pool or elementwise op reads), done at ``per_us`` a microsecond where that is not
    ``conv_macs_per_us`` (its default: the rate ``min_part_macs`` assumes); None under two."""
    conv_rate = target.tuning.conv_macs_per_us
    macs = work if per_us is None else work * conv_rate / per_us
    count = min(target.threads, total // unit, int(macs // max(1.0, min_part_macs(target))))
    if count < 2:
        return None
    found = even_ranges(total // unit, count, unit)
    found[-1] = (found[-1][0], total)
    return found


def covers(rows: list[tuple[int, int]], oc: int, unit: int, threads: int) -> bool:
    """``rows`` cover 0..oc in order, in whole units, at most one per thread."""
    ends = [0] + [hi for _, hi in rows]
    return (0 < len(rows) <= threads and ends[-1] == oc
            and all(lo == ends[i] and lo < hi and lo % unit == 0 for i, (lo, hi) in enumerate(rows)))


def slice_constant(arr: np.ndarray, part: Part, i: int) -> np.ndarray:
    """The part's range of constant input ``i`` (whole when the part takes all of it)."""
    axis = part.axes[i]
    return arr if axis is None else arr[(slice(None),) * axis + (slice(*part.rows),)]
