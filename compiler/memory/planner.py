"""The static memory planner: every graph input, intermediate and output at a fixed arena offset.

1. **Liveness.** Over the schedule (step 0: graph inputs written; step i+1: node i runs; the last
   step reads the outputs) each value lives from the step that writes it to the last step that
   reads it, both included: a node's inputs and outputs are live together. A backend may hold a
   value longer (the CPU backend: a job's tensors, until the job's last layer has run).
2. **In-place reuse.** A node's output takes over an input's storage when the op table's in-place
   rule allows it (``OpDef.shares``: a view re-labels the same bytes; otherwise the input has the
   output's exact type and the op reads element i only to compute element i) and that input dies at
   this node and is not a graph input (the caller owns those bytes). Values sharing storage form one
   buffer.
3. **Joins.** A Concat whose output is its operands' bytes end to end (``OpDef.joins``: batch 1,
   channels) copies nothing when each operand is computed straight into its place in the output:
   the operand's storage becomes a slice of the output's, so the Concat needs no code. Only where
   every operand is a value computed here that dies at the Concat, appears once, starts at an
   aligned offset and has its in-place chain to itself (ASPP's four branches, a fire module's two).
4. **Offsets.** Greedy by size (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net
   Inference", 2020): buffers in non-increasing size order, each at the smallest gap between
   already-placed buffers whose lifetimes intersect its own, or after them; sizes rounded up to the
   alignment, so every offset is aligned.

Constants are not in the arena (they live in the read-only weight block).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..ir.graph import Graph
from ..ops import get_op
from .plan import MemoryPlan


@dataclass(frozen=True)
class Lifetime:
    start: int  # step that writes the value
    end: int  # last step that reads it (>= start)

    def overlaps(self, other: Lifetime) -> bool:
        return self.start <= other.end and other.start <= self.end


def lifetimes(graph: Graph, held: Mapping[str, int] | None = None) -> dict[str, Lifetime]:
    """The live interval of every arena value (graph inputs and node outputs) over the schedule;
    ``held``: values that must stay live at least until these steps (a backend's own reasons)."""
    final = len(graph.nodes) + 1
    start = {name: 0 for name in graph.inputs}
    end = dict(start)
    for step, node in enumerate(graph.nodes, start=1):
        for name in node.inputs:
            if name in start:
                end[name] = step
        for name in node.outputs:
            start[name] = end[name] = step
    for name in graph.outputs:
        end[name] = final
    for name, step in (held or {}).items():
        end[name] = max(end[name], min(step, final))
    return {name: Lifetime(start[name], end[name]) for name in start}


def value_sizes(graph: Graph, batch: int, names) -> dict[str, int]:
    return {name: graph.types[name].nbytes(batch) for name in names}


def choose_aliases(graph: Graph, live: dict[str, Lifetime]) -> dict[str, str]:
    """value -> the value owning the storage it reuses (the root of its in-place chain)."""
    root: dict[str, str] = {}
    inputs = set(graph.inputs)
    for step, node in enumerate(graph.nodes, start=1):
        if len(node.outputs) != 1:
            continue
        op, out = get_op(node.op), node.outputs[0]
        for name in node.inputs:
            dies = name in live and live[name].end == step and name not in inputs
            fits = op.shares_value(node.attr, node.inputs, name) and \
                (op.view or graph.types[name] == graph.types[out])
            if dies and fits and graph.types[name].dtype.itemsize == graph.types[out].dtype.itemsize:
                root[out] = root.get(name, name)
                break
    return root


def choose_joins(graph: Graph, live: dict[str, Lifetime], aliases: dict[str, str], batch: int,
                 alignment: int) -> dict[str, tuple[str, int]]:
    """Storage root of a joined operand -> (the joining node's output, the operand's byte offset in it)."""
    chains: dict[str, list[str]] = {}
    for value, root in aliases.items():
        chains.setdefault(root, []).append(value)
    joined: dict[str, tuple[str, int]] = {}
    for step, node in enumerate(graph.nodes, start=1):
        op = get_op(node.op)
        if op.joins is None or len(node.outputs) != 1 or len(node.inputs) < 2 or len(set(node.inputs)) < len(node.inputs):
            continue
        out = node.outputs[0]
        ins = [graph.types[i].bind(batch) for i in node.inputs]
        offsets = op.operand_offsets(node.attr, ins, graph.types[out].bind(batch))
        if offsets is None or any(o % alignment for o in offsets):
            continue
        roots = [aliases.get(i, i) for i in node.inputs]

        def joinable(name: str, root: str, size: int) -> bool:
            return (name not in graph.constants and root not in graph.inputs and name in live
                    and live[name].end == step and root != aliases.get(out, out) and root not in joined
                    and all(graph.types[v].nbytes(batch) == size for v in [root, *chains.get(root, [])]))

        if all(joinable(n, r, t.nbytes()) for n, r, t in zip(node.inputs, roots, ins)):
            joined.update({r: (out, o) for r, o in zip(roots, offsets)})
    return joined


def place_greedy_by_size(sizes: dict[str, int], live: dict[str, Lifetime], alignment: int) -> tuple[dict[str, int], int]:
    """Offsets for buffers (name -> aligned size) with lifetimes; returns (offsets, arena bytes)."""
    order = sorted(sizes, key=lambda b: (-sizes[b], live[b].start, b))
    placed: list[tuple[int, int, str]] = []  # (offset, size, name), kept sorted by offset
    offsets: dict[str, int] = {}
    for buf in order:
        size, best, best_gap, prev_end = sizes[buf], None, None, 0
        for off, sz, other in placed:
            if not live[other].overlaps(live[buf]):
                continue
            gap = off - prev_end
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = prev_end, gap
            prev_end = max(prev_end, off + sz)
        offsets[buf] = prev_end if best is None else best
        placed.append((offsets[buf], size, buf))
        placed.sort()
    return offsets, max((offsets[b] + sizes[b] for b in sizes), default=0)


def peak_live_bytes(sizes: dict[str, int], live: dict[str, Lifetime]) -> int:
    """The most bytes live at any one step: no placement can use a smaller arena."""
    steps = max((t.end for t in live.values()), default=0) + 1
    delta = [0] * (steps + 1)
    for name, size in sizes.items():
        delta[live[name].start] += size
        delta[live[name].end + 1] -= size
    peak = running = 0
    for d in delta:
        running += d
        peak = max(peak, running)
    return peak


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def plan_memory(graph: Graph, batch: int = 1, alignment: int = 64, held: Mapping[str, int] | None = None) -> MemoryPlan:
    """Plan one arena for ``graph`` at ``batch``: offsets, aliases, arena, lower bound, naive sum.
    ``held``: see :func:`lifetimes` (the CPU backend keeps a job's tensors until its last layer)."""
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    live = lifetimes(graph, held)
    sizes = value_sizes(graph, batch, live)
    aliases = choose_aliases(graph, live)
    joined = choose_joins(graph, live, aliases, batch, alignment)

    def storage(name: str) -> tuple[str, int]:
        """(the buffer holding ``name``, its byte offset there): through in-place chains and joins."""
        root, at = aliases.get(name, name), 0
        while root in joined:
            owner, off = joined[root]
            root, at = aliases.get(owner, owner), at + off
        return root, at

    where = {name: storage(name) for name in live}
    buffers: dict[str, Lifetime] = {}
    raw: dict[str, int] = {}
    for name, t in live.items():
        owner, at = where[name]
        old = buffers.get(owner, t)
        buffers[owner] = Lifetime(min(old.start, t.start), max(old.end, t.end))
        raw[owner] = max(raw.get(owner, 0), at + sizes[name])
    offsets, arena = place_greedy_by_size({b: _align(s, alignment) for b, s in raw.items()}, buffers, alignment)
    return MemoryPlan(
        batch=batch,
        offsets={v: offsets[owner] + at for v, (owner, at) in where.items()},
        sizes=sizes,
        arena_bytes=arena,
        lower_bound=peak_live_bytes(raw, buffers),
        naive_bytes=sum(sizes.values()),
        alignment=alignment,
        aliases=aliases,
        joined=joined,
    )
