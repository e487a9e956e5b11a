"""Resource limits on a graph: what a device will parse, plan and compile, checked before it does.

A signed bundle under the size caps can still ask for unbounded work and memory: 200,000 nodes, a million
one-element inputs (15 MB of text, 219 MB parsed), a Concat of
20,000 inputs (LLVM's time grows with the square of a kernel's operands: 1,000 took 19 s, 4,000
took 246 s), activations of exabytes. Every limit here is checked where the work would start (the
parser counts nodes and operands as it reads; :func:`check_graph` runs at load and again before
lowering, at the batch size being compiled), and every violation is a :class:`LimitError`.

Defaults leave room for models far larger than an edge device runs (ResNet-50 has ~180 nodes, a
12-layer transformer ~1,000, at most a few dozen operands per node).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import LimitError
from .graph import Graph
from .types import Batch, Dim

GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    max_nodes: int = 65_536
    max_values: int = 1 << 18  # inputs, constants and node outputs together (parsed, each a few hundred bytes)
    max_node_inputs: int = 256
    max_operands: int = 1 << 20  # node inputs, all nodes together (65,536 nodes of 256 took the parser 37 s)
    max_node_outputs: int = 256
    max_rank: int = 32
    max_attr_items: int = 65_536  # a list attribute is per axis (pads: 2 per axis) or per output channel (scales)
    max_dim: int = 1 << 48
    max_activation_bytes: int = 8 * GiB  # every activation at once (the arena can only be smaller)
    max_compile_work: int = 1 << 18  # see compile_work()


DEFAULT_LIMITS = Limits()


def compile_work(graph: Graph) -> int:
    """Work units for lowering and LLVM: each distinct kernel (op, attributes, operand types) once,
    costing the square of its operand count (at least 16), as LLVM's time on one kernel grows."""
    kernels = {(n.op, n.attrs, tuple(graph.types[v] for v in n.inputs), tuple(graph.types[v] for v in n.outputs))
               for n in graph.nodes}
    return sum(max(len(k[2]) + len(k[3]), 4) ** 2 for k in kernels)


def activation_bytes(graph: Graph, batch: int = 1) -> int:
    """Bytes of every value that is not a constant, all live at once (the naive arena)."""
    total = 0
    for name, t in graph.types.items():
        if name not in graph.constants:
            total += t.nbytes(batch)
    return total


def check_graph(graph: Graph, batch: int = 1, limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Raise LimitError for the first limit ``graph`` exceeds at ``batch``; return it for chaining."""
    if len(graph.nodes) > limits.max_nodes:
        raise LimitError(f"the graph has {len(graph.nodes)} nodes, more than the limit of {limits.max_nodes}")
    check_values(len(graph.types), limits)
    check_values(len(graph.outputs), limits, "outputs")
    check_operands(sum(len(n.inputs) for n in graph.nodes), limits)
    for node in graph.nodes:
        check_node_arity(f"node {node.name[:80]!r}", len(node.inputs), len(node.outputs), limits)
        longest = max((len(v) for _, v in node.attrs if isinstance(v, (tuple, list))), default=0)
        if longest > limits.max_attr_items:  # the parser's own limit: a writer checks it before signing
            raise LimitError(f"node {node.name[:80]!r} has a list attribute of {longest} items, more than the "
                             f"limit of {limits.max_attr_items}")
    for name, t in graph.types.items():
        check_type(f"value {name[:80]!r}", t.shape, limits)
    act = activation_bytes(graph, batch)
    if act > limits.max_activation_bytes:
        raise LimitError(f"the graph's activations take {act} bytes at batch {batch}, more than the limit of "
                         f"{limits.max_activation_bytes}")
    work = compile_work(graph)
    if work > limits.max_compile_work:
        raise LimitError(f"compiling the graph is {work} units of work, more than the limit of "
                         f"{limits.max_compile_work} (too many distinct kernels, or kernels with too many operands)")
    return graph


def check_values(count: int, limits: Limits = DEFAULT_LIMITS, what: str = "named values") -> None:
    """The graph's values (or its outputs) are at most ``limits.max_values``: a million one-element inputs
    were 15 MB of IR text and 219 MB parsed, and took 10 s."""
    if count > limits.max_values:
        raise LimitError(f"the graph has more than {limits.max_values} {what}, the limit")


def check_operands(count: int, limits: Limits = DEFAULT_LIMITS) -> None:
    """The nodes' inputs, all together, are at most ``limits.max_operands``."""
    if count > limits.max_operands:
        raise LimitError(f"the graph's nodes read more than {limits.max_operands} operands, the limit")


def check_node_arity(where: str, inputs: int, outputs: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if inputs > limits.max_node_inputs:
        raise LimitError(f"{where} has {inputs} inputs, more than the limit of {limits.max_node_inputs}")
    if outputs > limits.max_node_outputs:
        raise LimitError(f"{where} has {outputs} outputs, more than the limit of {limits.max_node_outputs}")


def check_type(where: str, shape: Sequence[Dim], limits: Limits = DEFAULT_LIMITS) -> None:
    if len(shape) > limits.max_rank:
        raise LimitError(f"{where}: rank {len(shape)} is more than the limit of {limits.max_rank}")
    for d in shape:
        size = d.factor if isinstance(d, Batch) else d
        if size > limits.max_dim:
            raise LimitError(f"{where}: a dimension of {size} is more than the limit of {limits.max_dim}")
