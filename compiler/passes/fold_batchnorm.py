"""fold_batchnorm: inference BatchNormalization is a per-channel affine map, so it costs nothing.

After a Conv or Gemm whose weights are constants and whose result only the BN reads, the map is
folded into the weights and bias (``W' = W * s``, ``B' = (B - mean) * s + beta`` per output
channel, ``s = scale / sqrt(var + eps)``). Any other BN with constant parameters becomes
``Mul`` + ``Add`` with folded constants. Folding computes in float64 and stores the weight dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import Names, as_constant, rebuild, sole_user, users


def _affine(bn: Node, consts) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale, shift) of a BN node, in float64."""
    scale, bias, mean, var = (consts[i].astype(np.float64) for i in bn.inputs[1:])
    s = scale / np.sqrt(var + bn.attr["epsilon"])
    return s, bias - mean * s


def _fold_conv(base: Node, s, t, consts, names: Names) -> tuple[list[str], dict, dict] | None:
    w = consts.get(base.inputs[1])
    if w is None or (len(base.inputs) > 2 and base.inputs[2] not in consts):
        return None
    b = consts[base.inputs[2]].astype(np.float64) if len(base.inputs) > 2 else np.zeros(len(s))
    # float64 products rounded straight into the weight dtype: no float64 copy of the weights
    new_w = np.multiply(w, s.reshape((-1,) + (1,) * (w.ndim - 1)), out=np.empty(w.shape, w.dtype), dtype=np.float64,
                        casting="unsafe")
    return _with(base, [base.inputs[0]], new_w, b * s + t, w.dtype, names)


def _fold_gemm(base: Node, s, t, consts, names: Names) -> tuple[list[str], dict, dict] | None:
    a = base.attr
    w = consts.get(base.inputs[1])
    if w is None or (len(base.inputs) > 2 and base.inputs[2] not in consts):
        return None
    new_w = w.astype(np.float64) * (s[:, None] if a["transB"] else s[None, :])
    c = a["beta"] * consts[base.inputs[2]].astype(np.float64) if len(base.inputs) > 2 else 0.0
    return _with(base, [base.inputs[0]], new_w, np.asarray(c * s + t), w.dtype, names, beta=1.0)


def _with(base: Node, head: list[str], w, b, dtype, names: Names, **attrs) -> tuple[list[str], dict, dict]:
    """New inputs ``head + [W', B']``, the new constants, and the attributes to change. ``w`` is a
    fresh array of the caller's: it is frozen in place when it has ``dtype`` already, not copied."""
    wn, bn = names.fresh(f"{base.name}.weight_bn"), names.fresh(f"{base.name}.bias_bn")
    w = np.ascontiguousarray(w, dtype=dtype)
    w.flags.writeable = False
    new = {wn: w, bn: as_constant(b, dtype)}
    return head + [wn, bn], new, attrs


FOLD_INTO: dict[str, Callable] = {"Conv": _fold_conv, "Gemm": _fold_gemm}
"""Ops a following BN folds into: each returns (new inputs, new constants, changed attrs) or None."""


def fold_batchnorm(graph: Graph) -> Graph:
    consts = dict(graph.constants)
    producers, uses, names = graph.producers(), users(graph), Names(graph)
    folded_bases: dict[str, Node] = {}  # base node name -> the base with the BN folded in
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.op != "BatchNormalization" or not all(i in consts for i in node.inputs[1:]):
            nodes.append(node)
            continue
        s, t = _affine(node, consts)
        base = producers.get(node.inputs[0])
        folded = None
        if base is not None and base.op in FOLD_INTO and sole_user(graph, node.inputs[0], uses) is node:
            folded = FOLD_INTO[base.op](base, s, t, consts, names)
        if folded is None:
            nodes.extend(_as_mul_add(graph, node, s, t, consts, names))
            continue
        inputs, new_consts, attrs = folded
        consts.update(new_consts)
        # The base keeps its place and takes over the BN's output; only the BN read its old one.
        folded_bases[base.name] = base.replace(inputs=tuple(inputs), outputs=node.outputs, attrs={**base.attr, **attrs})
    if len(nodes) == len(graph.nodes) and not folded_bases:
        return graph
    return rebuild(graph, [folded_bases.get(n.name, n) for n in nodes], consts)


def _as_mul_add(graph: Graph, bn: Node, s, t, consts, names: Names) -> list[Node]:
    x = graph.types[bn.inputs[0]]
    shape = (-1,) + (1,) * (x.rank - 2)
    dtype = x.dtype.numpy
    sn, tn = names.fresh(f"{bn.name}.scale_folded"), names.fresh(f"{bn.name}.shift_folded")
    consts[sn], consts[tn] = as_constant(s.reshape(shape), dtype), as_constant(t.reshape(shape), dtype)
    mid = names.fresh(f"{bn.outputs[0]}_scaled")
    return [Node.make("Mul", [bn.inputs[0], sn], [mid], name=names.fresh(f"{bn.name}/mul")),
            Node.make("Add", [mid, tn], bn.outputs, name=names.fresh(f"{bn.name}/add"))]
