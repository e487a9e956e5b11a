"""Static model summary for ``cuvil inspect``: parameters, FLOPs, weight bytes, signature.

FLOPs count one multiply-add as two operations (Conv, Gemm, MatMul = 2 * MACs), follow one rule
per op family from a table, and are given at batch size 1. Pure data movement counts zero.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .ir.graph import Graph, Node
from .ir.types import TensorType

FlopRule = Callable[[Node, Sequence[TensorType], Sequence[TensorType]], int]


def _numel(t: TensorType) -> int:
    return math.prod(t.shape)


def _outputs(node, ins, outs) -> int:
    return sum(_numel(t) for t in outs)


def _inputs(node, ins, outs) -> int:
    return _numel(ins[0])


def _zero(node, ins, outs) -> int:
    return 0


def _conv(node, ins, outs) -> int:
    w = ins[1].shape  # [Cout, Cin/group, k...]: one output element takes prod(w[1:]) MACs
    bias = _numel(outs[0]) if len(ins) > 2 else 0
    return 2 * _numel(outs[0]) * math.prod(w[1:]) + bias


def _gemm(node, ins, outs) -> int:
    a = ins[0].shape
    k = a[0] if node.attr.get("transA", 0) else a[1]
    bias = _numel(outs[0]) if len(ins) > 2 else 0
    return 2 * _numel(outs[0]) * k + bias


def _matmul(node, ins, outs) -> int:
    a = ins[0].shape
    return 2 * _numel(outs[0]) * (a[-1] if a else 1)


def _epilogue(node, outs) -> int:
    """A fused op's extra per-element work: bias, residual add, activation."""
    a = node.attr
    steps = int(a.get("has_bias", 0)) + int(a.get("has_residual", 0)) + (a.get("activation", "none") != "none")
    return steps * _numel(outs[0])


def _fused_conv(node, ins, outs) -> int:
    return 2 * _numel(outs[0]) * math.prod(ins[1].shape[1:]) + _epilogue(node, outs)


def _fused_gemm(node, ins, outs) -> int:
    k = ins[0].shape[0] if node.attr.get("transA", 0) else ins[0].shape[1]
    return 2 * _numel(outs[0]) * k + _epilogue(node, outs)


def _fused_elementwise(node, ins, outs) -> int:
    return _numel(outs[0]) * (str(node.attr.get("program", "")).count(";") + 1)


def _pool(node, ins, outs) -> int:
    return _numel(outs[0]) * math.prod(node.attr.get("kernel_shape", ()) or (1,))


def _times(k: int) -> FlopRule:
    return lambda node, ins, outs: k * _outputs(node, ins, outs)


_DATA_MOVEMENT = ("Identity", "Dropout", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat",
                  "Split", "Slice", "Gather", "Expand", "Shape", "Pad", "Cast")
FLOP_RULES: dict[str, FlopRule] = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul,
    "FusedConv": _fused_conv, "FusedGemm": _fused_gemm, "FusedElementwise": _fused_elementwise,
    "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _inputs, "ReduceMean": _inputs, "ReduceSum": _inputs, "ReduceMax": _inputs,
    "BatchNormalization": _times(2), "LayerNormalization": _times(5), "Softmax": _times(3),
    "LogSoftmax": _times(3), "LRN": _times(5),
    **{op: _zero for op in _DATA_MOVEMENT},
}  # every other op: one operation per output element


@dataclass(frozen=True)
class ModelSummary:
    parameters: int
    flops: int  # at batch size 1
    weight_bytes: int
    inputs: tuple[tuple[str, str], ...]  # (name, type text)
    outputs: tuple[tuple[str, str], ...]
    op_counts: tuple[tuple[str, int], ...]  # most used first

    @property
    def node_count(self) -> int:
        return sum(n for _, n in self.op_counts)


def node_flops(node: Node, graph: Graph, batch: int = 1) -> int:
    ins = [graph.types[i].bind(batch) for i in node.inputs]
    outs = [graph.types[o].bind(batch) for o in node.outputs]
    return int(FLOP_RULES.get(node.op, _outputs)(node, ins, outs))


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
