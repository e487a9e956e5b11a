"""conv_transpose: a ConvTranspose with constant weights becomes a Conv, which has packed and GEMM kernels.

The ConvTranspose kernel is a masked gather of every tap per output element (scalar, one product
per tap): a U-Net's 2x2 up-convolutions ran 8x slower than ONNX Runtime on it. Two exact rewrites
(1-d and 2-d, where Conv has its fast paths; other ranks keep the gather):

* **a stride above 1, dilation 1** (U-Net up-convolutions, CenterNet's 4x4 stride-2 ones): output
  phase r (o = s*q + r along each axis) gets taps r, r + s, ... of each input pixel, so all
  s^nd phases are one stride-1 Conv to M * s^nd channels, whose phases are moved beside their
  pixels by Reshape / Transpose / Reshape (then the pads cropped); stride = kernel is its 1x1 case.
  Zeros inserted into the input made three in four of a 4x4 stride-2 layer's multiplies by zero
  (3-7x ONNX Runtime's time);
* **otherwise** (stride 1, or a dilation): the input with ``stride - 1`` zeros after each element
  (Reshape / Pad / Reshape), convolved at stride 1 with the spatially flipped, channel-transposed
  weights and pads ``dil * (k - 1) - pad`` (a crop where that is negative).

Only the summation order changes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..ir.graph import Graph, Node
from .rewrite import Names, as_constant, replace_each

_SPATIAL = (1, 2)
"""Spatial ranks rewritten: Conv's packed paths are 1-d and 2-d."""


class _Emit:
    """Nodes and constants of one rewrite, with fresh names."""

    def __init__(self, node: Node, names: Names, consts: dict, dtype: np.dtype, out_shape: Sequence):
        self.node, self.names, self.consts, self.dtype, self.nodes = node, names, consts, dtype, []
        self.out_shape = tuple(out_shape)

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


def _by_phases(emit: _Emit, x: str, spatial: Sequence[int], w: np.ndarray, b: np.ndarray | None) -> None:
    """stride > 1, dilation 1: output phase r (o = s*q + r along each axis) gets the taps r, r + s, r + 2s...
    of every input pixel, so all s^nd phases are one stride-1 Conv of x to M*P channels (each phase's
    taps flipped, zero past the kernel), then each phase's channel moved beside its pixel by Reshape /
    Transpose / Reshape, then the pads cropped. Stride = kernel is its 1x1 case (the U-Net up-conv)."""
    a, (c, mg, *kernel) = emit.node.attr, w.shape
    g, nd, strides = a["group"], len(kernel), a["strides"]
    taps = [-(-k // s) for k, s in zip(kernel, strides)]  # per phase, the most taps that land on it
    full = [-(-((n - 1) * s + k + e) // s) for n, s, k, e in zip(spatial, strides, kernel, a["output_padding"])]
    wp = np.zeros((c, mg, *strides, *taps), w.dtype)  # wp[c, m, r.., j..] = w[c, m, r + (taps - 1 - j) * s ..]
    for r in itertools.product(*map(range, strides)):
        for j in itertools.product(*map(range, taps)):
            tap = tuple(ri + (tn - 1 - ji) * s for ri, ji, tn, s in zip(r, j, taps, strides))
            if all(ti < k for ti, k in zip(tap, kernel)):
                wp[(slice(None), slice(None), *r, *j)] = w[(slice(None), slice(None), *tap)]
    phases = math.prod(strides)
    # (g, C/g, M/g, P, j..) -> (g, M/g, P, C/g, j..): output channel (g*mg + m) * P + phase, group-major
    wc = wp.reshape(g, c // g, mg, phases, *taps).transpose(0, 2, 3, 1, *range(4, 4 + nd))
    ins = [x, emit.const("phase_weight", wc.reshape(g * mg * phases, c // g, *taps))]
    ins += [emit.const("phase_bias", np.repeat(b, phases))] if b is not None else []
    around = [tn - 1 for tn in taps] + [f - n for f, n in zip(full, spatial)]  # out: every phase's full length
    cols = emit("Conv", ins, "phases", strides=[1] * nd, pads=around, dilations=[1] * nd, group=g)
    m = g * mg
    split = emit("Reshape", [cols], "split", shape=[0, m, *strides, *full])
    # (N, M, r1.., q1..) -> (N, M, q1, r1, q2, r2, ...)
    moved = emit("Transpose", [split], "interleave", perm=[0, 1] + [i for d in range(nd) for i in (2 + nd + d, 2 + d)])
    pads, y, out = a["pads"], emit.node.outputs[0], emit.out_shape[2:]
    ends = [f * s - p - o for f, s, p, o in zip(full, strides, pads[:nd], out)]
    whole = y if not any(pads[:nd]) and not any(ends) else None
    joined = emit("Reshape", [moved], "full", whole, shape=[0, m, *(f * s for f, s in zip(full, strides))])
    if whole is None:
        _pad_or_crop(emit, joined, [-p for p in pads[:nd]], [-e for e in ends], "crop", y)


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
    emit = _Emit(node, names, consts, w.dtype, graph.types[node.outputs[0]].shape)
    by_phases = any(s > 1 for s in a["strides"]) and all(d == 1 for d in a["dilations"])
    (_by_phases if by_phases else _by_zeros)(emit, x, spatial, w, b)
    return emit.nodes


def conv_transpose(graph: Graph) -> Graph:
    return replace_each(graph, "ConvTranspose", _rewrite)
