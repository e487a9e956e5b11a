"""fold_constants: evaluate every node whose inputs are all constants, with the op's reference.

The frontends fold while importing; this pass catches what later passes expose. A node producing a
graph output is kept (outputs are computed into the arena, never read from the weights).
"""

from __future__ import annotations

from .. import ops
from ..ir.graph import Graph
from .rewrite import as_constant, rebuild


def fold_constants(graph: Graph) -> Graph:
    constants = dict(graph.constants)
    nodes = []
    for node in graph.nodes:
        foldable = node.inputs and all(i in constants for i in node.inputs)
        if not foldable or any(o in graph.outputs for o in node.outputs):
            nodes.append(node)
            continue
        values = ops.get_op(node.op).reference([constants[i] for i in node.inputs], node.attr)
        for name, value in zip(node.outputs, values):
            constants[name] = as_constant(value, graph.types[name].dtype.numpy)
    if len(nodes) == len(graph.nodes):
        return graph
    return rebuild(graph, nodes, constants)
