"""check_plan: an independent proof that a MemoryPlan is safe for its graph.

It trusts nothing the planner computed. From the graph alone it derives every arena value, its size
and its lifetime, then checks that each value has an aligned offset inside the arena and that any
two values live at the same step occupy disjoint bytes, except an in-place handover: an output
written over an operand of the node that produces it, at the same offset, where that operand dies
at this node, is not a graph input, and the op may work in place; and an operand of a joined node (a
Concat the plan declares in place) inside that node's output, where each of its operands must lie at
its own offset, or the output (which no code writes) would be wrong. Only the op table's rules
(``OpDef.shares``, ``OpDef.operand_offsets``) are shared with the planner: facts about ops, not planning logic.
"""

from __future__ import annotations

from ..errors import CuvilError
from ..ir.graph import Graph
from ..ops import get_op
from .plan import MemoryPlan


class PlanError(CuvilError):
    """A memory plan would let two live tensors share bytes, or put a tensor outside the arena."""


def live_ranges(graph: Graph) -> dict[str, tuple[int, int]]:
    """(first step, last step) of every arena value, from the graph alone (step i + 1 runs node i)."""
    final = len(graph.nodes) + 1
    start = {name: 0 for name in graph.inputs}
    last = dict(start)
    for step, node in enumerate(graph.nodes, start=1):
        for name in node.inputs:
            if name not in graph.constants:
                last[name] = max(last.get(name, 0), step)
        for name in node.outputs:
            start[name] = step
            last.setdefault(name, step)
    for name in graph.outputs:
        last[name] = final
    return {name: (start[name], max(start[name], last[name])) for name in start}


def _handover(graph: Graph, plan: MemoryPlan, live, a: str, b: str) -> bool:
    """True when one of a, b is produced in place over the other by the node that kills it."""
    for old, new in ((a, b), (b, a)):
        step = live[new][0]
        if step == 0 or live[old][1] != step or old in graph.inputs or new not in plan.aliases:
            continue
        node = graph.nodes[step - 1]
        if old not in node.inputs or node.outputs != (new,) or plan.offsets[old] != plan.offsets[new]:
            continue
        op = get_op(node.op)
        if op.shares_value(node.attr, node.inputs, old) and (op.view or graph.types[old] == graph.types[new]):
            return True
    return False


def _check_joins(graph: Graph, plan: MemoryPlan) -> dict[str, set[str]]:
    """Each joined output the plan declares, made by a node whose output is its operands end to end, with
    every operand (an arena value) at its offset in it: output -> its operands."""
    producer = {out: node for node in graph.nodes for out in node.outputs}
    found: dict[str, set[str]] = {}
    for out in sorted(plan.joined_outputs):
        node = producer.get(out)
        if node is None:
            raise PlanError(f"{out!r} is declared joined, but no node makes it")
        ins = [graph.types[i].bind(plan.batch) for i in node.inputs]
        offsets = get_op(node.op).operand_offsets(node.attr, ins, graph.types[out].bind(plan.batch))
        if offsets is None or node.outputs != (out,):
            raise PlanError(f"{node.name!r} ({node.op}) cannot make {out!r} of its operands in place")
        for name, off in zip(node.inputs, offsets):
            if name in graph.constants or plan.offsets.get(name) != plan.offsets[out] + off:
                raise PlanError(f"{name!r} is not at byte {off} of the joined {out!r}")
        found[out] = set(node.inputs)
    return found


def check_plan(graph: Graph, plan: MemoryPlan) -> MemoryPlan:
    """Raise PlanError naming the first unsafe placement; return the plan for chaining."""
    live = live_ranges(graph)
    want = {name: graph.types[name].nbytes(plan.batch) for name in live}
    if set(plan.offsets) != set(want) or set(plan.sizes) != set(want):
        missing, extra = sorted(set(want) - set(plan.offsets)), sorted(set(plan.offsets) - set(want))
        raise PlanError(f"plan covers the wrong values: missing {missing[:5]}, unexpected {extra[:5]}")
    if plan.alignment < 1 or plan.alignment & (plan.alignment - 1):
        raise PlanError(f"alignment {plan.alignment} is not a power of two")
    for name, size in want.items():
        off = plan.offsets[name]
        if plan.sizes[name] != size:
            raise PlanError(f"{name!r} needs {size} bytes, the plan says {plan.sizes[name]}")
        if off < 0 or off % plan.alignment:
            raise PlanError(f"{name!r} at offset {off} is not {plan.alignment}-byte aligned")
        if off + size > plan.arena_bytes:
            raise PlanError(f"{name!r} [{off}, {off + size}) does not fit the {plan.arena_bytes}-byte arena")
    for name, owner in plan.aliases.items():
        if owner not in want or plan.offsets[name] != plan.offsets[owner]:
            raise PlanError(f"{name!r} is declared to reuse {owner!r} but is not placed on it")
    joins = _check_joins(graph, plan)
    # Sweep by offset: only values whose byte ranges intersect are compared.
    order = sorted((v for v in want if want[v]), key=lambda v: plan.offsets[v])
    for i, a in enumerate(order):
        a_end = plan.offsets[a] + want[a]
        for b in order[i + 1:]:
            if plan.offsets[b] >= a_end:
                break
            (s1, e1), (s2, e2) = live[a], live[b]
            joined = a in joins.get(b, ()) or b in joins.get(a, ())
            if s1 <= e2 and s2 <= e1 and not joined and not _handover(graph, plan, live, a, b):
                raise PlanError(f"{a!r} (steps {s1}..{e1}, bytes {plan.offsets[a]}..{a_end}) and {b!r} (steps "
                                f"{s2}..{e2}, bytes {plan.offsets[b]}..{plan.offsets[b] + want[b]}) overlap while both live")
    naive = sum(want.values())
    if plan.naive_bytes != naive:
        raise PlanError(f"naive_bytes is {plan.naive_bytes}, the values sum to {naive}")
    if plan.lower_bound > plan.arena_bytes:
        raise PlanError(f"lower bound {plan.lower_bound} exceeds the arena {plan.arena_bytes}")
    return plan
