"""simplify: nodes that leave their input's values as they are become ``Identity`` (a view: no code).

Frontends write such nodes when they compose ops: a bfloat16 op computed in f32 (``GraphBuilder``)
widens, moves and narrows back (ONNX's expanded Attention: ``Cast -> Expand -> Cast`` on K and V,
a mask rounded to bf16 and widened again, casts of bf16 to bf16), and each one costs a kernel. The
rules, each exact:

* ``Cast`` to its input's own dtype (except a saturating float8 cast, which clamps infinities);
* ``Expand`` to its input's own shape;
* ``Cast`` back to ``v``'s dtype of ``Cast(v)`` to a narrower type N, when every value ``v`` can
  hold at that point is one of N's (:func:`exact_widening` made it from N, or it only moves,
  selects or picks the maximum of such values: :data:`SELECTS`; a constant is checked): ``v``.

A narrowing cast with no other reader goes in ``dce``.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    fb = b.finfo
    if ka in "iu":
        ia = np.iinfo(a.numpy)
        return max(-int(ia.min), int(ia.max)) <= 2 ** (fb.nmant + 1)
    fa = a.finfo
    return fa.nmant <= fb.nmant and fa.maxexp <= fb.maxexp and fa.minexp - fa.nmant >= fb.minexp - fb.nmant


SELECTS: Mapping[str, tuple[int, ...] | None] = {
    "Identity": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Transpose": (0,),
    "Expand": (0,), "Slice": (0,), "Pad": (0,), "Gather": (0,), "Concat": None, "Where": (1, 2),
    "ReduceMax": (0,), "ReduceMin": (0,), "Max": None, "Min": None, "Relu": (0,), "Neg": (0,), "Abs": (0,),
}
"""Ops whose every output element is one of the listed inputs' elements (None: all inputs), or
zero, or its negation: if those inputs hold only values of a narrower float type, so does the output."""

_NARROWS = (DType.BF16, DType.F16)


def holds_only(c: np.ndarray, d: DType) -> bool:
    """Whether the float array ``c`` holds only values of ``d`` (a NaN counts as one). bf16's values are
    the float32 values whose low 16 bits are zero, so that check reads bits: through ml_dtypes' bf16 it
    imported ml_dtypes into a float model's compile (TextCNN's embedding table, ViT's weights: 0.6 s and
    ~10 MiB of the cold compile's peak)."""
    if d is DType.BF16:
        with np.errstate(over="ignore"):  # a float64 beyond float32's range: inf, unequal to it
            f = c.astype(np.float32, copy=False)
        return bool(np.all(((f.view(np.uint32) & 0xFFFF) == 0) & (f == c) | np.isnan(c)))
    return np.array_equal(c.astype(d.numpy).astype(c.dtype), c, equal_nan=True)


class _Exact:
    """Which values hold only values of a narrower float (bf16 or f16), met in schedule order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.known: dict[str, frozenset[DType]] = {}

    def of(self, name: str) -> frozenset[DType]:
        if name not in self.known and name in self.graph.constants:
            c = np.asarray(self.graph.constants[name])
            self.known[name] = frozenset(d for d in _NARROWS if c.dtype.kind == "f" and holds_only(c, d))
        return self.known.get(name, frozenset())

    def note(self, node: Node) -> None:
        types = self.graph.types
        out = node.outputs[0]
        if node.op == "Cast" and types[out].dtype.is_float:
            src = types[node.inputs[0]].dtype
            self.known[out] = frozenset(d for d in _NARROWS if d is src or d in self.of(node.inputs[0]) and exact_widening(d, src))
        elif node.op in SELECTS and len(node.outputs) == 1:
            picks = SELECTS[node.op]
            ins = [node.inputs[i] for i in (range(len(node.inputs)) if picks is None else picks) if i < len(node.inputs)]
            got = frozenset(_NARROWS).intersection(*(self.of(i) for i in ins)) if ins else frozenset()
            if node.op == "Pad" and node.attr.get("mode", "constant") == "constant":
                value = np.array([node.attr.get("value", 0.0)], np.float64)
                got = frozenset(d for d in got if np.array_equal(value.astype(d.numpy).astype(np.float64), value, equal_nan=True))
            self.known[out] = got


def _source(graph: Graph, node: Node, made_by: dict[str, Node], same: dict[str, str], exact: _Exact) -> str | None:
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
        origin, mid = inner.inputs[0], graph.types[inner.outputs[0]].dtype
        if graph.types[origin].dtype is to and (exact_widening(to, mid) or (
                exact_widening(mid, to) and mid in exact.of(same.get(origin, origin)))):
            return origin
    return None


def simplify(graph: Graph) -> Graph:
    made_by = {o: n for n in graph.nodes for o in n.outputs}
    same: dict[str, str] = {}
    exact = _Exact(graph)
    nodes, changed = [], False
    for node in graph.nodes:
        src = _source(graph, node, made_by, same, exact)
        if src is not None:
            node = Node.make("Identity", [src], node.outputs, name=node.name)
            changed = True
        if node.op == "Identity":
            same[node.outputs[0]] = same.get(node.inputs[0], node.inputs[0])
        exact.note(node)
        nodes.append(node)
    return rebuild(graph, nodes) if changed else graph
