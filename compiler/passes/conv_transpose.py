"""conv_transpose: a ConvTranspose with constant weights becomes a Conv, which has packed and GEMM kernels.

The ConvTranspose kernel is a masked gather of every tap per output element (scalar, one product
per tap): a U-Net's 2x2 up-convolutions ran 8x slower than ONNX Runtime on it. Two exact rewrites
(1-d and 2-d, where Conv has its fast paths; other ranks keep the gather):

* **stride = kernel, dilation 1, no output_padding** (the U-Net up-convolution): each output pixel
  gets exactly one tap, so ``y = shuffle(Conv1x1(x, W'))`` with ``W'[m*K + t, c] = w[c, m, t]``,
  the bias repeated per tap, and the K = prod(kernel) taps moved beside their pixel by
  Reshape / Transpose / Reshape (then the pads cropped);
* **otherwise**: the input with ``stride - 1`` zeros after each element (Reshape / Pad / Reshape),
  convolved at stride 1 with the spatially flipped, channel-transposed weights and pads
  ``dil * (k - 1) - pad`` (a crop where that is negative).

Only the summation order changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import Names, as_constant, rebuild

_SPATIAL = (1, 2)
"""Spatial ranks rewritten: Conv's packed paths are 1-d and 2-d."""


class _Emit:
    """Nodes and constants of one rewrite, with fresh names."""

    def __init__(self, node: Node, names: Names, consts: dict, dtype: np.dtype):
        self.node, self.names, self.consts, self.dtype, self.nodes = node, names, consts, dtype, []

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.names.fresh(f"{self.node.name}.{hint}")
        self.consts[name] = as_constant(value, self.dtype)
        return name

    def __call__(self, op: str, ins: Sequence[str], hint: str, out: str | None = None, **attrs) -> str:
        y = out or self.names.fresh(f"{self.node.outputs[0]}_{hint}")
        self.nodes.append(Node.make(op, list(ins), [y], name=self.names.fresh(f"{self.node.name}/{hint}"), **attrs))
        return y


def _pad_or_crop(emit: _Emit, x: str, begins: Sequence[int], ends: Sequence[int], hint: str, out: str | None) -> str:
    """Pad (or crop, where negative) the spatial axes of the (N, C, *spatial) value ``x``."""
    if not any(begins) and not any(ends) and out is None:
        return x
    return emit("Pad", [x], hint, out, pads=[0, 0, *begins, 0, 0, *ends])


def _by_taps(emit: _Emit, x: str, spatial: Sequence[int], w: np.ndarray, b: np.ndarray | None) -> None:
    """stride == kernel: a 1x1 Conv to M*K channels, then each tap's channel moved beside its pixel."""
    a, (c, mg, *kernel) = emit.node.attr, w.shape
    g, nd, k = a["group"], len(kernel), math.prod(kernel)
    # W'[(g*mg + ml) * K + t, cl] = w[g*cg + cl, ml, t]
    wk = w.reshape(g, c // g, mg, k).transpose(0, 2, 3, 1).reshape(g * mg * k, c // g, *(1,) * nd)
    ins = [x, emit.const("taps_weight", wk)] + ([emit.const("taps_bias", np.repeat(b, k))] if b is not None else [])
    cols = emit("Conv", ins, "taps", strides=[1] * nd, pads=[0] * 2 * nd, dilations=[1] * nd, group=g)
    m = g * mg
    split = emit("Reshape", [cols], "split", shape=[0, m, *kernel, *spatial])
    # (N, M, k1.., s1..) -> (N, M, s1, k1, s2, k2, ...)
    perm = [0, 1] + [i for d in range(nd) for i in (2 + nd + d, 2 + d)]
    moved = emit("Transpose", [split], "interleave", perm=perm)
    pads, y = a["pads"], emit.node.outputs[0]
    whole = y if not any(pads) else None
    full = emit("Reshape", [moved], "full", whole, shape=[0, m, *(s * kk for s, kk in zip(spatial, kernel))])
    if whole is None:
        _pad_or_crop(emit, full, [-p for p in pads[:nd]], [-p for p in pads[nd:]], "crop", y)


def _by_zeros(emit: _Emit, x: str, spatial: Sequence[int], w: np.ndarray, b: np.ndarray | None) -> None:
    """Any stride: zeros inserted into x, then a stride-1 Conv with flipped weights."""
    a, (c, mg, *kernel) = emit.node.attr, w.shape
    g, nd = a["group"], len(kernel)
    strides, dil, pads, extra = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    if any(s > 1 for s in strides):
        gaps = emit("Reshape", [x], "gaps", shape=[0, c, *(v for s in spatial for v in (s, 1))])
        wide = emit("Pad", [gaps], "zeros", pads=[0] * (2 + 2 * nd) + [0, 0, *(v for s in strides for v in (0, s - 1))])
        x = emit("Reshape", [wide], "spread", shape=[0, c, *(s * n for s, n in zip(strides, spatial))])
    # (C, M/g, k..) -> (M, C/g, k..), flipped: the transposed conv's tap t is the conv's tap k-1-t
    wc = w.reshape(g, c // g, mg, *kernel).swapaxes(1, 2).reshape(g * mg, c // g, *kernel)
    wc = np.flip(wc, axis=tuple(range(2, 2 + nd)))
    begins = [d * (k - 1) - p for d, k, p in zip(dil, kernel, pads[:nd])]
    # the spread input has stride - 1 zeros after its last element, which the end pad takes back
    ends = [d * (k - 1) - p + e - (s - 1) for d, k, p, e, s in zip(dil, kernel, pads[nd:], extra, strides)]
    inside = all(v >= 0 for v in (*begins, *ends))
    if not inside:
        x = _pad_or_crop(emit, x, begins, ends, "border", None)
    ins = [x, emit.const("flipped_weight", wc)] + ([emit.const("bias", b)] if b is not None else [])
    emit("Conv", ins, "conv", emit.node.outputs[0], strides=[1] * nd,
         pads=[*begins, *ends] if inside else [0] * 2 * nd, dilations=list(dil), group=g)


def _rewrite(graph: Graph, node: Node, names: Names, consts: dict) -> list[Node] | None:
    x, wn = node.inputs[0], node.inputs[1]
    xt = graph.types[x]
    if wn not in consts or (len(node.inputs) > 2 and node.inputs[2] not in consts) or xt.rank - 2 not in _SPATIAL:
        return None
    if 0 in graph.types[node.outputs[0]].shape:  # nothing to compute; the Conv it becomes would not fit
        return None
    w = np.asarray(consts[wn])
    b = np.asarray(consts[node.inputs[2]]) if len(node.inputs) > 2 else None
    a, spatial = node.attr, list(xt.shape[2:])
    emit = _Emit(node, names, consts, w.dtype)
    by_taps = (tuple(a["strides"]) == w.shape[2:] and all(d == 1 for d in a["dilations"])
               and not any(a["output_padding"]))
    (_by_taps if by_taps else _by_zeros)(emit, x, spatial, w, b)
    return emit.nodes


def conv_transpose(graph: Graph) -> Graph:
    if not any(n.op == "ConvTranspose" for n in graph.nodes):
        return graph
    consts, names, nodes, changed = dict(graph.constants), Names(graph), [], False
    for node in graph.nodes:
        new = _rewrite(graph, node, names, consts) if node.op == "ConvTranspose" else None
        nodes.extend(new or [node])
        changed |= new is not None
    return rebuild(graph, nodes, consts) if changed else graph
