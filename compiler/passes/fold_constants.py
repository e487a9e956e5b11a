"""fold_constants: evaluate every node whose inputs are all constants, with the op's reference.

The frontends fold while importing; this pass catches what later passes expose. A node producing a
graph output is kept (outputs are computed into the arena, never read from the weights). So is a
node whose result would be much bigger than its inputs (an Expand of a scalar, ConstantOfShape):
stored, it would swell the weights, the bundle and the memory of every device; computed, it costs
a fill per run.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import ops
from ..ir.graph import Graph, Node
from .rewrite import as_constant, rebuild


GROWTH_LIMIT_BYTES = 1 << 20  # results above this and above GROWTH_FACTOR x their inputs stay computed
GROWTH_FACTOR = 4


def swells(out_bytes: int, in_bytes: int) -> bool:
    """True when a folded result would be too much bigger than the constants it is made of."""
    return out_bytes > GROWTH_LIMIT_BYTES and out_bytes > GROWTH_FACTOR * in_bytes


def _swells(graph: Graph, node, constants) -> bool:
    return swells(sum(graph.types[o].nbytes() for o in node.outputs), sum(constants[i].nbytes for i in node.inputs))


def fold_constants(graph: Graph) -> Graph:
    return _fold(graph, lambda node: ops.get_op(node.op).foldable)


def fold_dequantized_weights(graph: Graph) -> Graph:
    """Each DequantizeLinear of a constant that ``fuse_qdq`` left (its reader has no integer form, e.g.
    a ConvTranspose) becomes the float constant it computes, on the device at compile time: the bundle
    keeps the int8 weights. That layer then runs in float, as ONNX Runtime runs an op without an
    integer kernel, on constant weights the float passes rewrite and pack; left computed, every
    inference dequantized them and the layer took the generic kernel of a weight that is an
    activation (an int8 U-Net's two 2x2 up-convolutions: 15 ms against 0.05). What that makes constant
    folds too (a LayerNorm scale that ONNX Runtime's quantizer wrote as DequantizeLinear / Identity /
    QuantizeLinear / DequantizeLinear becomes one float constant)."""
    return _fold(graph, lambda node: node.op == "DequantizeLinear" or ops.get_op(node.op).foldable)


def _fold(graph: Graph, may_fold: Callable[[Node], bool]) -> Graph:
    constants = dict(graph.constants)
    nodes = []
    for node in graph.nodes:
        foldable = node.inputs and may_fold(node) and all(i in constants for i in node.inputs)
        if not foldable or any(o in graph.outputs for o in node.outputs) or _swells(graph, node, constants):
            nodes.append(node)
            continue
        values = ops.get_op(node.op).reference([constants[i] for i in node.inputs], node.attr)
        for name, value in zip(node.outputs, values):
            constants[name] = as_constant(value, graph.types[name].dtype.numpy)
    if len(nodes) == len(graph.nodes):
        return graph
    return rebuild(graph, nodes, constants)
