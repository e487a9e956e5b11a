"""What every pass shares: rebuilding a graph from new parts, fresh names, use counts.

Passes never write a type by hand: :func:`rebuild` re-infers every type from the op table, so a
rewrite that changes a shape is caught where it happens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.infer import infer_graph_types


def rebuild(graph: Graph, nodes: Iterable[Node], constants: Mapping[str, np.ndarray] | None = None) -> Graph:
    """``graph`` with new nodes (in schedule order) and constants; all types derived again."""
    consts = dict(graph.constants if constants is None else constants)
    return infer_graph_types(graph.name, graph.input_types, consts, list(nodes), graph.outputs)


def replace_each(graph: Graph, op: str, rewrite: Callable[[Graph, Node, "Names", dict], list[Node] | None]) -> Graph:
    """``graph`` with each ``op`` node replaced by the nodes ``rewrite(graph, node, names, constants)`` returns
    (None: the node stays), its constants added to ``constants``; ``graph`` itself where none is replaced."""
    if not any(n.op == op for n in graph.nodes):
        return graph
    consts, names, nodes, changed = dict(graph.constants), Names(graph), [], False
    for node in graph.nodes:
        new = rewrite(graph, node, names, consts) if node.op == op else None
        nodes.extend(new or [node])
        changed |= new is not None
    return rebuild(graph, nodes, consts) if changed else graph


def users(graph: Graph) -> dict[str, list[Node]]:
    """Each value's consuming nodes, each node once (``Mul(x, x)`` is one user of x)."""
    out: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in dict.fromkeys(node.inputs):
            out.setdefault(name, []).append(node)
    return out


def sole_user(graph: Graph, value: str, uses: Mapping[str, list[Node]]) -> Node | None:
    """The one node reading ``value``, if exactly one does and the value is not a graph output."""
    readers = uses.get(value, [])
    return readers[0] if len(readers) == 1 and value not in graph.outputs else None


class Names:
    """Fresh value and node names: never one the graph already uses."""

    def __init__(self, graph: Graph):
        self.taken = set(graph.types) | {n.name for n in graph.nodes}

    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.taken:
            name, i = f"{hint}_{i}", i + 1
        self.taken.add(name)
        return name


def as_constant(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A read-only contiguous copy in ``dtype`` (how every folded value is stored)."""
    arr = np.array(value, dtype=dtype, order="C", copy=True)
    arr.flags.writeable = False
    return arr


def owned_constants(graph: Graph) -> Graph:
    """``graph`` with the constants that view a buffer mostly used by nothing else copied into their own.
    A bundle read from memory has zero-copy views of that buffer as its arrays, so the few constants no
    pass replaced (a classifier's weights, biases) would keep the whole buffer alive through tuning and
    lowering, beside the folded copies of the rest. Views that still cover half their buffer or more
    stay views: copying them would hold both. (A bundle read from a file has each weight in a buffer of
    its own: nothing to copy.)"""
    views: dict[int, tuple[int, list[str]]] = {}  # buffer id -> (its bytes, the constants viewing it)
    for name, arr in graph.constants.items():
        root = arr
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        if isinstance(root, memoryview):  # numpy makes one per frombuffer: group by what it exports
            root = root.obj
        if root is not arr:
            size = root.nbytes if isinstance(root, (np.ndarray, memoryview)) else len(root) if isinstance(
                root, (bytes, bytearray)) else 0
            views.setdefault(id(root), (size, []))[1].append(name)
    copy = [n for size, names in views.values() if 2 * sum(graph.constants[n].nbytes for n in names) < size
            for n in names]
    if not copy:
        return graph
    return graph.replace(constants={**graph.constants, **{n: as_constant(graph.constants[n], graph.constants[n].dtype)
                                                            for n in copy}})
