"""check_worker_scratch: the parts of a split layer never share scratch bytes, nor touch a tensor.

Each part of a layer split over threads gets scratch of its own, carved from the arena after the
planned tensors. Independently of how the lowering carved it, this checks every region from its
recorded bounds: aligned, past the last tensor byte (so no live value can be overwritten), inside
the arena, and disjoint from the other parts of the same layer (parts of different layers run at
different times, so they may reuse the same bytes).
"""

from __future__ import annotations

from collections.abc import Iterable

from .checker import PlanError


def check_worker_scratch(spans: Iterable[tuple[str, int, int, int]], tensors_end: int, arena_bytes: int,
                         alignment: int = 64) -> None:
    """``spans``: (layer, part, first byte, end); raise PlanError naming the first unsafe region."""
    by_layer: dict[str, list[tuple[int, int, int]]] = {}
    for layer, part, lo, hi in spans:
        if lo % alignment or lo < tensors_end or hi > arena_bytes or hi < lo:
            raise PlanError(f"scratch of part {part} of {layer!r} at [{lo}, {hi}) is not an aligned region between "
                            f"the tensors' end {tensors_end} and the arena's end {arena_bytes}")
        by_layer.setdefault(layer, []).append((lo, hi, part))
    for layer, regions in by_layer.items():
        regions.sort()
        for (lo1, hi1, p1), (lo2, hi2, p2) in zip(regions, regions[1:]):
            if lo2 < hi1:
                raise PlanError(f"parts {p1} and {p2} of {layer!r} share scratch bytes [{lo2}, {min(hi1, hi2)})")
