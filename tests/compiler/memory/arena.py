"""Run a graph with every arena value stored at its planned offset in one byte array.

If two live values shared bytes, a later write would corrupt an earlier value and the outputs would
differ from the reference interpreter: a semantic check of a plan, beside ``check_plan``'s proof.
A joined Concat runs no code here either, so an operand off its place would show too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from cuvil.compiler import Graph
from cuvil.compiler.memory.plan import MemoryPlan
from cuvil.compiler.ops import get_op


def run_in_arena(graph: Graph, plan: MemoryPlan, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    arena = np.zeros(plan.arena_bytes, np.uint8)

    def view(name: str) -> np.ndarray:
        t = graph.types[name].bind(plan.batch)
        off = plan.offsets[name]
        return arena[off:off + plan.sizes[name]].view(t.dtype.numpy).reshape(t.shape)

    for name in graph.inputs:
        view(name)[...] = inputs[name]
    for node in graph.nodes:
        if node.outputs[0] in plan.joined_outputs:
            continue  # as the backends do: its operands were computed in place
        args = [graph.constants[i] if i in graph.constants else view(i).copy() for i in node.inputs]
        for name, value in zip(node.outputs, get_op(node.op).reference(args, node.attr)):
            view(name)[...] = value
    return {name: view(name).copy() for name in graph.outputs}
