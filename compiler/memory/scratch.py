"""Kernel scratch in the arena: placed where no value lives while it is used, and checked apart.

A kernel's scratch (a conv's padded copy, Winograd's transforms, im2col panels) lives only while its
node runs, or while its job runs (a layer split over threads and the layers that joined its job: each
part gets a region of its own). :class:`ScratchPlacer` puts each region at the lowest aligned gap
between the values live over those steps (the memory plan's bytes of tensors dead by then, or not
yet written), above the arena only where no gap is wide enough: ASPP's Winograd transforms reuse the
bytes of its early 128x128 activations instead of adding their size to the arena. Reserved regions
(the fault word) are never given out.

:func:`check_scratch` proves it independently from the graph and the plan: every region aligned,
inside the arena, clear of every value live at its steps and of the reserved bytes, and the parts of
one job disjoint (regions of different steps may reuse the same bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ..ir.graph import Graph
from .checker import PlanError, live_ranges
from .plan import MemoryPlan


class ScratchSpan(NamedTuple):
    """Scratch bytes [lo, hi) of part ``part`` of ``label`` (a node or job), used over steps [first, last]."""

    label: str
    part: int
    first: int
    last: int
    lo: int
    hi: int


def _value_spans(graph: Graph, plan: MemoryPlan) -> list[tuple[str, int, int, int, int]]:
    """(name, first step, last step, lo, hi) of every arena value with bytes."""
    return [(v, s, e, plan.offsets[v], plan.offsets[v] + plan.sizes[v])
            for v, (s, e) in live_ranges(graph).items() if plan.sizes[v]]


class ScratchPlacer:
    """Places scratch regions for a graph whose values ``plan`` placed; ``reserved``: [lo, hi) never given out."""

    def __init__(self, graph: Graph, plan: MemoryPlan, reserved: Iterable[tuple[int, int]] = ()):
        self.values = _value_spans(graph, plan)
        self.reserved = [(lo, hi) for lo, hi in reserved if hi > lo]
        self.alignment = plan.alignment
        self.spans: list[ScratchSpan] = []
        self.end = 0  # the highest scratch byte placed

    def place(self, label: str, first: int, last: int, part_bytes: int, parts: int = 1) -> int:
        """Offset of ``parts`` regions of ``part_bytes`` each (rounded up to the alignment, so every part
        starts aligned), used over steps [first, last]: the lowest aligned gap clear of the values live
        then and of the reserved bytes."""
        part_bytes = -(-part_bytes // self.alignment) * self.alignment
        need = part_bytes * parts
        busy = sorted([(lo, hi) for _, s, e, lo, hi in self.values if s <= last and first <= e] + self.reserved)
        at = 0
        for lo, hi in busy:
            if lo - at >= need:
                break
            at = max(at, -(-hi // self.alignment) * self.alignment)
        for p in range(parts):
            lo = at + p * part_bytes
            self.spans.append(ScratchSpan(label, p, first, last, lo, lo + part_bytes))
        self.end = max(self.end, at + need)
        return at


def check_scratch(graph: Graph, plan: MemoryPlan, spans: Iterable[ScratchSpan], arena_bytes: int,
                  reserved: Iterable[tuple[int, int]] = ()) -> None:
    """Raise PlanError naming the first unsafe scratch region (see the module doc)."""
    values = _value_spans(graph, plan)
    by_label: dict[str, list[tuple[int, int, int]]] = {}
    for sp in spans:
        if sp.lo % plan.alignment or sp.lo < 0 or sp.hi > arena_bytes or sp.hi < sp.lo or sp.last < sp.first:
            raise PlanError(f"scratch of part {sp.part} of {sp.label!r} at [{sp.lo}, {sp.hi}) is not an aligned "
                            f"region inside the {arena_bytes}-byte arena")
        for name, s, e, lo, hi in values:
            if s <= sp.last and sp.first <= e and lo < sp.hi and sp.lo < hi:
                raise PlanError(f"scratch of part {sp.part} of {sp.label!r} at [{sp.lo}, {sp.hi}) overlaps "
                                f"{name!r} at [{lo}, {hi}), live at steps {s}..{e}")
        for lo, hi in reserved:
            if lo < sp.hi and sp.lo < hi:
                raise PlanError(f"scratch of part {sp.part} of {sp.label!r} at [{sp.lo}, {sp.hi}) overlaps "
                                f"reserved bytes [{lo}, {hi})")
        by_label.setdefault(sp.label, []).append((sp.lo, sp.hi, sp.part))
    for label, regions in by_label.items():
        regions.sort()
        for (lo1, hi1, p1), (lo2, hi2, p2) in zip(regions, regions[1:]):
            if lo2 < hi1:
                raise PlanError(f"parts {p1} and {p2} of {label!r} share scratch bytes [{lo2}, {min(hi1, hi2)})")
