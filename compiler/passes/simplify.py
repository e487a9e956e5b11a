"""simplify: nodes that leave their input's values as they are become ``Identity`` (a view: no code).

Frontends write such nodes when they compose ops: a bfloat16 op computed in f32 (``GraphBuilder``)
widens, moves and narrows back (ONNX's expanded Attention: ``Cast -> Expand -> Cast`` on K and V,
casts of bf16 to bf16), and each one costs a kernel. The rules, each exact:

* ``Cast`` to its input's own dtype (except a saturating float8 cast, which clamps infinities);
* ``Expand`` to its input's own shape;
* ``Cast`` back to ``x``'s dtype of ``Cast(x)`` that widened ``x`` without loss (bf16 -> f32,
  i32 -> i64, ...): ``x`` itself.

The widening cast stays for any other reader; ``dce`` drops it otherwise.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ir.dtypes import SATURABLE, DType
from ..ir.graph import Graph, Node
from .rewrite import rebuild

_EXACT_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})


def exact_widening(a: DType, b: DType) -> bool:
    """True when every value of ``a`` converts to ``b`` and back unchanged (NaN stays NaN)."""
    if a is b or a.is_narrow and a not in _EXACT_FLOATS or b.is_narrow and b not in _EXACT_FLOATS or b is DType.BOOL:
        return False
    if a is DType.BOOL:
        return True
    ka, kb = a.numpy.kind, b.numpy.kind
    if ka in "iu" and kb in "iu":
        ia, ib = np.iinfo(a.numpy), np.iinfo(b.numpy)
        return ib.min <= ia.min and ia.max <= ib.max
    if kb not in "fV":
        return False
    fb = ml_dtypes.finfo(b.numpy)
    if ka in "iu":
        ia = np.iinfo(a.numpy)
        return max(-int(ia.min), int(ia.max)) <= 2 ** (fb.nmant + 1)
    fa = ml_dtypes.finfo(a.numpy)
    return fa.nmant <= fb.nmant and fa.maxexp <= fb.maxexp and fa.minexp - fa.nmant >= fb.minexp - fb.nmant


def _source(graph: Graph, node: Node, made_by: dict[str, Node], same: dict[str, str]) -> str | None:
    """The value ``node``'s output equals, when a rule above applies; else None. ``same``: the value
    each Identity output equals (through chains of them)."""
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return None
    if node.op == "Expand":
        return x if graph.types[x] == graph.types[node.outputs[0]] else None
    if node.op != "Cast":
        return None
    to = node.attr["to"]
    if to is graph.types[x].dtype:
        return None if node.attr["saturate"] and to in SATURABLE else x
    inner = made_by.get(same.get(x, x))
    if inner is not None and inner.op == "Cast":
        origin = inner.inputs[0]
        if graph.types[origin].dtype is to and exact_widening(to, graph.types[x].dtype):
            return origin
    return None


def simplify(graph: Graph) -> Graph:
    made_by = {o: n for n in graph.nodes for o in n.outputs}
    same: dict[str, str] = {}
    nodes, changed = [], False
    for node in graph.nodes:
        src = _source(graph, node, made_by, same)
        if src is not None:
            node = Node.make("Identity", [src], node.outputs, name=node.name)
            changed = True
        if node.op == "Identity":
            same[node.outputs[0]] = same.get(node.inputs[0], node.inputs[0])
        nodes.append(node)
    return rebuild(graph, nodes) if changed else graph
