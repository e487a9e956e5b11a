"""The lowering driver both backends share, up to the first kernel.

:func:`prepare` checks the graph against its limits, optimizes it, binds the batch, verifies the
result, collects every op the backend has no kernel for (all of them, in one error), lets a tuner
retarget, plans the arena and proves the plan safe with :func:`~..memory.check_plan`.
:func:`placement` says, per node, which inputs the plan put on an output (an in-place handover) and
whether a view needs no code at all; :class:`WeightBlock` holds the constants; a backend caches its
kernels by a key of everything that decides their code, so identical nodes share one.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import CompileError
from ..ir.graph import Graph, Node
from ..ir.infer import bind_batch
from ..ir.limits import check_graph
from ..ir.verify import verify
from ..memory.checker import check_plan
from ..memory.plan import MemoryPlan
from ..memory.planner import plan_memory
from ..ops import get_op
from ..passes.pipeline import optimize as optimize_graph
from ..target import Target
from .irhelpers import ALIGN
from .lowered import IOSpec, grow, private_map

Retarget = Callable[[Graph, Target], Target]
Held = Callable[[Graph, Target], Mapping[str, int]]


@dataclass(frozen=True)
class Prepared:
    """An optimized, batch-bound, verified graph with its checked memory plan and final target."""

    graph: Graph
    plan: MemoryPlan
    target: Target

    def io(self, names: tuple[str, ...]) -> tuple[IOSpec, ...]:
        types = self.graph.types
        return tuple(IOSpec(v, self.plan.offsets[v], types[v].dtype, tuple(types[v].shape), types[v].bounded_axis)
                     for v in names)

    @property
    def fault_offset(self) -> int | None:
        """Arena offset of the i32 fault word run-time checks set (``OpDef.run_time_check``), right
        after the plan's arena; None when no node checks anything."""
        if not any(get_op(n.op).run_time_check for n in self.graph.nodes):
            return None
        return -(-self.plan.arena_bytes // ALIGN) * ALIGN

    def span(self, name: str) -> tuple[int, int]:
        """The arena bytes [lo, hi) of value ``name``."""
        lo = self.plan.offsets[name]
        return lo, lo + self.graph.types[name].nbytes(self.plan.batch)


def optimized(graph: Graph, batch: int) -> Graph:
    """``graph`` through the pass pipeline (the limits checked first): the part of :func:`prepare`
    that needs no Target, so a caller may run it before it knows the Target; ``prepare`` of the
    result with ``optimize=False`` is then ``prepare`` of ``graph``."""
    check_graph(graph, batch)
    return optimize_graph(graph)


def prepare(graph: Graph, target: Target, batch: int, *, optimize: bool, kernels: Container[str], backend: str,
            retarget: Retarget | None = None, held: Held | None = None) -> Prepared:
    """Everything before code: see the module doc. ``kernels``: the ops the backend can lower;
    ``held(graph, target)``: values the plan keeps live longer (see ``plan_memory``)."""
    check_graph(graph, batch)  # a LimitError before any work the graph asks for
    g = verify(bind_batch(optimize_graph(graph) if optimize else graph, batch))
    missing: dict[str, list[str]] = {}
    for node in g.nodes:
        if node.op not in kernels:
            missing.setdefault(node.op, []).append(node.name)
    if missing:
        names = "; ".join(f"{op} ({', '.join(ns[:5])})" for op, ns in sorted(missing.items()))
        raise CompileError(f"no {backend} kernel for {len(missing)} op(s): {names}")
    if retarget is not None:
        target = retarget(g, target)
    plan = plan_memory(g, batch, alignment=ALIGN, held=held(g, target) if held is not None else None)
    check_plan(g, plan)
    return Prepared(g, plan, target)


def hand_over_constants(p: Prepared) -> tuple[Prepared, dict[str, np.ndarray]]:
    """``p`` with a graph whose constants are empty stand-ins (their names, dtypes and ``types``
    kept), and the arrays themselves: a backend that owns them can free each one (the folded
    weights, tens of MB) as soon as it is packed, not after the whole model is lowered."""
    consts = dict(p.graph.constants)
    stand_ins = {k: np.empty(0, v.dtype) for k, v in consts.items()}
    return dataclasses.replace(p, graph=dataclasses.replace(p.graph, constants=stand_ins)), consts


def placement(p: Prepared, node: Node) -> tuple[int | None, ...] | None:
    """Per input: the output whose bytes the plan gave it (read through that output), else None.
    None for a view the planner placed on its input's bytes, or a Concat whose operands it placed
    inside the output (``MemoryPlan.joined``): neither needs code."""
    if len(node.outputs) == 1 and node.outputs[0] in p.plan.joined_outputs:
        return None
    outs = [p.span(o) for o in node.outputs]
    alias: list[int | None] = []
    for i, name in enumerate(node.inputs):
        if name in p.graph.constants:
            alias.append(None)
            continue
        lo, hi = p.span(name)
        hit = [j for j, (olo, ohi) in enumerate(outs) if lo < ohi and olo < hi]
        if not hit:
            alias.append(None)
            continue
        same = (lo, hi) == outs[hit[0]]
        if get_op(node.op).view and same:
            return None
        if not (same and len(hit) == 1 and get_op(node.op).shares(node.attr, i)):
            raise CompileError(f"node {node.name!r} ({node.op}): input {name!r} overlaps output "
                               f"{node.outputs[hit[0]]!r} in the memory plan, which the kernel cannot do in place")
        alias.append(hit[0])
    return tuple(alias)


class WeightBlock:
    """One read-only block; every tensor starts at a 64-byte boundary, each (name, layout) once per content.

    A layout names how a constant is packed, not everything its bytes depend on: a conv's packing
    follows the input's size, a GEMM's the rows and alpha, so one weight read by two convs of other
    input sizes (a detection head shared by pyramid levels, a Siamese encoder) packs twice. A key
    added again is placed again unless its bytes equal a copy already there (the first conv's
    packing, read by the second, gave wrong outputs or a crash).

    Each tensor is copied into the block's own anonymous mapping as it is added (grown by doubling,
    which the kernel remaps without copying), so a packed array is garbage as soon as it is placed:
    the packed weights are never alive twice over, and :meth:`array` hands the mapping itself out."""

    def __init__(self) -> None:
        self.map = private_map(1 << 20)
        self.size = 0
        self.offsets: dict[tuple[str, str | None], list[tuple[int, int]]] = {}  # key -> (offset, bytes) each copy

    def add(self, key: tuple[str, str | None], arr: np.ndarray) -> int:
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        for at, n in self.offsets.get(key, ()):
            if n == len(data) and np.array_equal(np.frombuffer(self.map, np.uint8, n, at), data):
                return at
        at, end = self.size, self.size + len(data)
        if end > len(self.map):
            grow(self.map, max(end, 2 * len(self.map)))
        np.frombuffer(self.map, np.uint8, len(data), at)[:] = data
        self.size = end + -end % ALIGN  # the pad: pages of a fresh mapping are zero
        self.offsets.setdefault(key, []).append((at, len(data)))
        return at

    def tobytes(self) -> bytes:
        return self.map[: self.size]

    def array(self) -> np.ndarray:
        """The block as one read-only, page-aligned uint8 array over the mapping (trimmed to its
        size, no copy); the block takes no more tensors."""
        grow(self.map, max(self.size, 1))
        out = np.frombuffer(self.map, np.uint8, self.size)
        out.flags.writeable = False
        return out
