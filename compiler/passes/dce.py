"""dce: drop nodes whose results nothing needs, then constants no remaining node reads.

Graph inputs stay even when unused: they are the model's interface.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .rewrite import rebuild


def dce(graph: Graph) -> Graph:
    needed = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if needed.intersection(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    kept.reverse()
    constants = {k: v for k, v in graph.constants.items() if k in needed}
    if len(kept) == len(graph.nodes) and len(constants) == len(graph.constants):
        return graph
    return rebuild(graph, kept, constants)
