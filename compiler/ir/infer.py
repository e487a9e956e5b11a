"""Type inference over the op table's shape rules, with the batch symbol handled by probing.

Shape rules are written over plain integers. For a node whose operands contain ``N`` the rule is
evaluated twice, with ``N`` bound to two large distinct primes; a dimension equal in both results
is static, one equal to ``k*probe`` in both is ``k*N``, anything else is rejected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ShapeError
from .. import ops
from .graph import Graph, Node
from .types import Batch, Dim, TensorType

PROBES = (1009, 1013)


def infer_op(op: str, in_types: Sequence[TensorType], attrs: Mapping) -> tuple[TensorType, ...]:
    opdef = ops.get_op(op)
    if all(t.is_static for t in in_types):
        return tuple(opdef.infer(list(in_types), attrs))
    results = [tuple(opdef.infer([t.bind(p) for t in in_types], attrs)) for p in PROBES]
    if len(results[0]) != len(results[1]):
        raise ShapeError(f"{op}: output count depends on the batch size")
    return tuple(_unprobe(op, a, b) for a, b in zip(*results))


def _unprobe(op: str, a: TensorType, b: TensorType) -> TensorType:
    if a.dtype != b.dtype or a.rank != b.rank or a.bounded_axis != b.bounded_axis:
        raise ShapeError(f"{op}: output type depends on the batch size")
    dims: list[Dim] = []
    p, q = PROBES
    for x, y in zip(a.shape, b.shape):
        if x == y:
            dims.append(x)
        elif x % p == 0 and y % q == 0 and x // p == y // q:
            dims.append(Batch(x // p))
        else:
            raise ShapeError(f"{op}: an output dimension depends on the batch size in a way Cuvil cannot express")
    return TensorType(a.dtype, tuple(dims), a.bounded_axis)


def infer_node(node: Node, types: Mapping[str, TensorType]) -> tuple[TensorType, ...]:
    try:
        return infer_op(node.op, [types[i] for i in node.inputs], node.attr)
    except ShapeError as e:
        raise ShapeError(f"node {node.name!r}: {e}") from None


def infer_graph_types(
    name: str,
    inputs: Mapping[str, TensorType],
    constants: Mapping,
    nodes: Sequence[Node],
    outputs: Sequence[str],
) -> Graph:
    """Build a Graph from its parts, deriving every node output's type."""
    from .dtypes import DType

    types: dict[str, TensorType] = dict(inputs)
    for cname, arr in constants.items():
        types[cname] = TensorType(DType.from_numpy(arr.dtype), tuple(int(d) for d in arr.shape))
    for node in nodes:
        missing = [i for i in node.inputs if i not in types]
        if missing:
            raise ShapeError(f"node {node.name!r} uses undefined value(s) {missing}")
        outs = infer_node(node, types)
        if len(outs) != len(node.outputs):
            raise ShapeError(f"node {node.name!r}: {node.op} yields {len(outs)} outputs, node names {len(node.outputs)}")
        types.update(zip(node.outputs, outs))
    return Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), types, dict(constants))


def bind_batch(graph: Graph, batch: int) -> Graph:
    """The same graph with the batch symbol replaced by a concrete size (attributes never hold N)."""
    if batch < 1:
        raise ShapeError(f"batch size must be >= 1, got {batch}")
    return graph.replace(types={k: t.bind(batch) for k, t in graph.types.items()})
