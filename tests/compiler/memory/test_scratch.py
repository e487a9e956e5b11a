"""Kernel scratch: placed in the bytes of values dead (or not yet written) while it is used, never on a
live value, a reserved word or another part of the same job; and the checker refuses each way it can go wrong."""

from __future__ import annotations

import pytest

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, verify
from cuvil.compiler.memory.checker import PlanError
from cuvil.compiler.memory.planner import plan_memory
from cuvil.compiler.memory.scratch import ScratchPlacer, ScratchSpan, check_scratch


def f32(*shape) -> TensorType:
    return TensorType(DType.F32, tuple(shape))


def chain():
    """x [1024] -> a = Concat(x, x, x, x) [4096] -> s = Slice(a) [1024] -> e = Exp(s) -> y = Neg(e)."""
    return verify(infer_graph_types("g", {"x": f32(1024)}, {}, [
        Node.make("Concat", ["x", "x", "x", "x"], ["a"], axis=0),
        Node.make("Slice", ["a"], ["s"], starts=[0], ends=[1024], axes=[0], steps=[1]),
        Node.make("Exp", ["s"], ["e"]), Node.make("Neg", ["e"], ["y"])], ["y"]))


def test_scratch_takes_the_bytes_of_values_dead_by_then():
    g = chain()
    plan = plan_memory(g)
    big = plan.offsets["a"]
    placer = ScratchPlacer(g, plan)
    at1 = placer.place("concat", 1, 1, 1024)  # x and a live: beside them
    at3 = placer.place("exp", 3, 3, 8192)  # a is dead at step 3 (the Exp): its 16 KiB are free
    live3 = [(plan.offsets[v], plan.offsets[v] + plan.sizes[v]) for v in ("s", "e")]
    assert all(hi <= at3 or at3 + 8192 <= lo for lo, hi in live3)
    assert at3 + 8192 <= max(big + 16384, max(hi for _, hi in live3))  # within the arena the values need
    assert placer.end <= plan.arena_bytes + 1024
    check_scratch(g, plan, placer.spans, max(plan.arena_bytes, placer.end))
    assert at1 % 64 == 0 and at3 % 64 == 0


def test_parts_of_a_job_are_side_by_side_and_clear_of_reserved_bytes():
    g = chain()
    plan = plan_memory(g)
    reserved = [(plan.arena_bytes, plan.arena_bytes + 64)]
    placer = ScratchPlacer(g, plan, reserved)
    at = placer.place("job", 1, 2, 4096, parts=3)
    spans = [s for s in placer.spans if s.label == "job"]
    assert [(s.lo - at, s.hi - at) for s in spans] == [(0, 4096), (4096, 8192), (8192, 12288)]
    assert all(s.hi <= reserved[0][0] or s.lo >= reserved[0][1] for s in spans)
    check_scratch(g, plan, placer.spans, max(plan.arena_bytes + 64, placer.end), reserved)


@pytest.mark.parametrize("span,why", [
    (lambda p: ScratchSpan("n", 0, 1, 1, p.offsets["a"], p.offsets["a"] + 64), "overlaps 'a'"),  # on a live value
    (lambda p: ScratchSpan("n", 0, 1, 1, 8, 72), "aligned"),
    (lambda p: ScratchSpan("n", 0, 1, 1, 0, 1 << 30), "inside the"),
    (lambda p: ScratchSpan("n", 0, 2, 1, 0, 64), "aligned region"),  # steps backwards
], ids=["live", "unaligned", "past-arena", "steps"])
def test_unsafe_scratch_is_refused(span, why):
    g = chain()
    plan = plan_memory(g)
    with pytest.raises(PlanError, match=why):
        check_scratch(g, plan, [span(plan)], plan.arena_bytes + 65536)


def test_parts_sharing_bytes_or_a_reserved_word_are_refused():
    g = chain()
    plan = plan_memory(g)
    top = -(-plan.arena_bytes // 64) * 64
    parts = [ScratchSpan("job", 0, 1, 1, top, top + 128), ScratchSpan("job", 1, 1, 1, top + 64, top + 192)]
    with pytest.raises(PlanError, match="parts 0 and 1 of 'job' share scratch bytes"):
        check_scratch(g, plan, parts, top + 4096)
    reuse = [ScratchSpan("j1", 0, 1, 1, top, top + 128), ScratchSpan("j2", 0, 3, 3, top, top + 128)]
    check_scratch(g, plan, reuse, top + 4096)  # different steps may reuse the same bytes
    with pytest.raises(PlanError, match="reserved bytes"):
        check_scratch(g, plan, reuse[:1], top + 4096, reserved=[(top + 64, top + 128)])
