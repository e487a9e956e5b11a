"""Static model summary for ``cuvil inspect``: parameters, FLOPs, weight bytes, signature.

FLOPs count one multiply-add as two operations (Conv, Gemm, MatMul = 2 * MACs), follow each op's
FLOP rule in the op table (``OpDef.flops``), and are given at batch size 1. Pure data movement counts zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .ir.graph import Graph, Node
from .ops import get_op


@dataclass(frozen=True)
class ModelSummary:
    parameters: int
    flops: int | None  # at batch size 1; None where the graph was not parsed (an untrusted bundle)
    weight_bytes: int
    inputs: tuple[tuple[str, str], ...]  # (name, type text)
    outputs: tuple[tuple[str, str], ...]
    op_counts: tuple[tuple[str, int], ...] | None  # most used first; None where the graph was not parsed

    @property
    def node_count(self) -> int | None:
        return None if self.op_counts is None else sum(n for _, n in self.op_counts)


def node_flops(node: Node, graph: Graph, batch: int = 1) -> int:
    ins = [graph.types[i].bind(batch) for i in node.inputs]
    outs = [graph.types[o].bind(batch) for o in node.outputs]
    return int(get_op(node.op).flops(node.attr, ins, outs))


def summarize(graph: Graph, batch: int = 1) -> ModelSummary:
    counts = Counter(node.op for node in graph.nodes)
    return ModelSummary(
        parameters=graph.parameter_count,
        flops=sum(node_flops(n, graph, batch) for n in graph.nodes),
        weight_bytes=graph.weight_bytes,
        inputs=tuple((n, str(graph.types[n])) for n in graph.inputs),
        outputs=tuple((n, str(graph.types[n])) for n in graph.outputs),
        op_counts=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
