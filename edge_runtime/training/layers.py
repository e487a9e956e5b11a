"""Which of a graph's constants a device's DP-SGD round trains (no torch): the one rule for both sides.

The weight layers are the graph's Conv, Gemm and MatMul nodes, in graph order; a round trains the last
``train_layers`` of them (0: all). :class:`.torch_graph.TorchGraph` freezes the others by this rule, so
an honest device's update names exactly :func:`trained_weights`, which the coordinator requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from ...compiler.ir.graph import Graph, Node

T = TypeVar("T")
WEIGHT_INPUTS = {"Conv": 3, "Gemm": 3, "MatMul": 2}  # weight layer op -> end of its trained inputs (from input 1)


def last_layers(layers: Sequence[T], train_layers: int) -> Sequence[T]:
    """The layers a round trains: the last ``train_layers`` (0, or at least as many as there are: all)."""
    return layers[-train_layers:] if 0 < train_layers < len(layers) else layers


def weight_operands(node: Node) -> tuple[str, ...]:
    """A weight layer's trained constants: its weight and, where the op has one and it is given, its bias."""
    return tuple(name for name in node.inputs[1:WEIGHT_INPUTS[node.op]] if name)


def trained_weights(graph: Graph, train_layers: int) -> frozenset[str]:
    """The constants a round with ``train_layers`` moves: the names of every honest device's update."""
    layers = [node for node in graph.nodes if node.op in WEIGHT_INPUTS]
    return frozenset(name for node in last_layers(layers, train_layers) for name in weight_operands(node))
