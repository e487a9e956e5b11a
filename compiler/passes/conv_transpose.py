"""conv_transpose: a ConvTranspose with constant weights becomes a Conv, which has packed and GEMM kernels.

The ConvTranspose kernel is a masked gather of every tap per output element (scalar, one product
per tap): a U-Net's 2x2 up-convolutions ran 8x slower than ONNX Runtime on it. Two exact rewrites
(1-d and 2-d, where Conv has its fast paths; other ranks keep the gather):

* **a stride above 1, dilation 1** (U-Net up-convolutions, CenterNet's 4x4 stride-2 ones): output
  phase r (o = s*q + r along each axis) gets taps r, r + s, ... of each input pixel, so all
  s^nd phases are one stride-1 Conv to M * s^nd channels, whose phases are moved beside their
  pixels by Reshape / Transpose / Reshape (then the pads cropped); stride = kernel is its 1x1 case.
  Zeros inserted into the input made three in four of a 4x4 stride-2 layer's multiplies by zero
  (3-7x ONNX Runtime's time). A kernel that is not a multiple of the stride (the decoders' 3x3
  stride-2) gives its phases different numbers of taps: a Conv each, of the cropped output's phases;
* **otherwise** (stride 1, or a dilation): the input with ``stride - 1`` zeros after each element
  (Reshape / Pad / Reshape), convolved at stride 1 with the spatially flipped, channel-transposed
  weights and pads ``dil * (k - 1) - pad`` (a crop where that is negative).

Only the summation order changes.
"""

from __future__ import annotations

import itertools
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


def _phase_weights(w: np.ndarray, strides: Sequence[int]) -> dict[tuple[int, ...], np.ndarray]:
    """Per tap phase r, the (C, M/g, n..) taps r, r + s, ... of ``w`` (those that land on one output phase),
    flipped: a transposed conv's tap t is the conv's tap n - 1 - t."""
    nd = len(strides)
    return {r: np.flip(w[(slice(None), slice(None), *(slice(ri, None, s) for ri, s in zip(r, strides)))],
                       axis=tuple(range(2, 2 + nd)))
            for r in itertools.product(*map(range, strides))}


def _conv_layout(w: np.ndarray, g: int) -> np.ndarray:
    """(C, M/g, k..) -> (M, C/g, k..): a transposed conv's weights as a grouped Conv's."""
    c, mg, *kernel = w.shape
    return w.reshape(g, c // g, mg, *kernel).swapaxes(1, 2).reshape(g * mg, c // g, *kernel)


def _by_phases(emit: _Emit, x: str, spatial: Sequence[int], w: np.ndarray, b: np.ndarray | None) -> None:
    """stride > 1, dilation 1: output phase r (o = s*q + r along each axis) gets the taps r', r' + s, r' + 2s..
    of every input pixel (r' = r + pad, mod s), a stride-1 Conv of x; the phases' channels are then moved beside
    their pixels by Reshape / Transpose / Reshape. Where the kernel is a multiple of the stride, every phase has
    as many taps and all are one Conv to M*P channels (stride = kernel is its 1x1 case: the U-Net up-conv).
    Else each phase is a Conv of its own taps (:func:`_conv_a_phase`): as one Conv, a 3x3 stride-2 layer's
    phases had 2x2 kernels, 16 taps for its 9, and ran 1.6-1.9x ONNX Runtime's time."""
    a, kernel, strides = emit.node.attr, w.shape[2:], emit.node.attr["strides"]
    if any(k % s for k, s in zip(kernel, strides)):
        plan = _phase_plan(spatial, kernel, strides, a["pads"], emit.out_shape[2:])
        if plan is not None:
            _conv_a_phase(emit, x, w, b, plan)
            return
    _one_conv(emit, x, spatial, w, b)


def _phase_plan(spatial, kernel, strides, pads, out) -> list[list[tuple[int, int, int]]] | None:
    """Per axis, per output phase r: the phase of its taps r', and the left and right pads of its Conv over
    the input, so that each phase's Conv gives ceil(out / s) outputs from the first (a cropped output starts
    inside a phase of the uncropped one: its pad carries over); None where a phase has no taps or its Conv
    would need a negative pad (it would start past the input's first pixel)."""
    plan = []
    for n_in, k, s, p, o in zip(spatial, kernel, strides, pads, out):
        axis, q = [], -(-o // s)
        for r in range(s):
            tap_phase, carry = (r + p) % s, (r + p) // s
            taps = -(-(k - tap_phase) // s)
            left = taps - 1 - carry
            right = q - n_in - left + taps - 1
            if taps < 1 or left < 0 or right < 0:
                return None
            axis.append((tap_phase, left, right))
        plan.append(axis)
    return plan


def _conv_a_phase(emit: _Emit, x: str, w: np.ndarray, b: np.ndarray | None, plan) -> None:
    """A Conv of each output phase's own taps (:func:`_phase_plan`), concatenated (in place) and interleaved;
    the last phases' one extra output cropped where the output is not a multiple of the stride."""
    a, (_, mg, *kernel) = emit.node.attr, w.shape
    g, nd, strides = a["group"], len(kernel), a["strides"]
    weights, bias = _phase_weights(w, strides), [emit.const("bias", b)] if b is not None else []
    outs = []
    for r in itertools.product(*map(range, strides)):
        at = [axis[ri] for axis, ri in zip(plan, r)]
        wr, name = weights[tuple(t for t, _, _ in at)], "".join(map(str, r))
        outs.append(emit("Conv", [x, emit.const(f"phase{name}_weight", _conv_layout(wr, g)), *bias], f"phase{name}",
                         strides=[1] * nd, pads=[lo for _, lo, _ in at] + [hi for _, _, hi in at], dilations=[1] * nd,
                         group=g))
    cols = emit("Concat", outs, "phases", axis=1)
    counts = [-(-o // s) for o, s in zip(emit.out_shape[2:], strides)]
    split = emit("Reshape", [cols], "split", shape=[0, *strides, g * mg, *counts])
    _interleave(emit, split, [0, 1 + nd] + [i for d in range(nd) for i in (2 + nd + d, 1 + d)], g * mg, counts,
                [0] * nd)


def _one_conv(emit: _Emit, x: str, spatial: Sequence[int], w: np.ndarray, b: np.ndarray | None) -> None:
    """Every phase in one Conv to M*P channels, each phase's taps padded with zeros to the most any has, its
    output every phase's whole length; the pads cropped after."""
    a, (c, mg, *kernel) = emit.node.attr, w.shape
    g, nd, strides = a["group"], len(kernel), a["strides"]
    full = [-(-((n - 1) * s + k + e) // s) for n, s, k, e in zip(spatial, strides, kernel, a["output_padding"])]
    taps = [-(-k // s) for k, s in zip(kernel, strides)]  # per phase, the most taps that land on it
    phases = _phase_weights(w, strides)
    wp = np.zeros((c, mg, *strides, *taps), w.dtype)  # a phase of fewer taps: zeros before its own
    for r, wr in phases.items():
        wp[(slice(None), slice(None), *r, *(slice(t - n, None) for t, n in zip(taps, wr.shape[2:])))] = wr
    # (g, C/g, M/g, P, j..) -> (g, M/g, P, C/g, j..): output channel (g*mg + m) * P + phase, group-major
    wc = wp.reshape(g, c // g, mg, len(phases), *taps).transpose(0, 2, 3, 1, *range(4, 4 + nd))
    m = g * mg
    ins = [x, emit.const("phase_weight", wc.reshape(m * len(phases), c // g, *taps))]
    ins += [emit.const("phase_bias", np.repeat(b, len(phases)))] if b is not None else []
    grow = [f - n for f, n in zip(full, spatial)]  # after the input's end: each phase's output is ``full`` long
    cols = emit("Conv", ins, "phases", strides=[1] * nd, pads=[t - 1 for t in taps] + grow, dilations=[1] * nd, group=g)
    split = emit("Reshape", [cols], "split", shape=[0, m, *strides, *full])
    _interleave(emit, split, [0, 1] + [i for d in range(nd) for i in (2 + nd + d, 2 + d)], m, full, a["pads"][:nd])


def _interleave(emit: _Emit, split: str, order: list[int], m: int, counts: Sequence[int], begins: Sequence[int]) -> None:
    """``split`` (phases and pixels on axes of their own) transposed by ``order`` to (N, M, q1, r1, q2, r2, ..),
    joined to (N, M, q1*s1, ..), and cropped to the output: ``begins`` in front, what is left over at the end."""
    strides, y, out = emit.node.attr["strides"], emit.node.outputs[0], emit.out_shape[2:]
    moved = emit("Transpose", [split], "interleave", perm=order)
    ends = [q * s - p - o for q, s, p, o in zip(counts, strides, begins, out)]
    whole = y if not any(begins) and not any(ends) else None
    joined = emit("Reshape", [moved], "full", whole, shape=[0, m, *(q * s for q, s in zip(counts, strides))])
    if whole is None:
        _pad_or_crop(emit, joined, [-p for p in begins], [-e for e in ends], "crop", y)


def _by_zeros(emit: _Emit, x: str, spatial: Sequence[int], w: np.ndarray, b: np.ndarray | None) -> None:
    """Any stride: zeros inserted into x, then a stride-1 Conv with flipped weights."""
    a, (c, _, *kernel) = emit.node.attr, w.shape
    g, nd = a["group"], len(kernel)
    strides, dil, pads, extra = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    if any(s > 1 for s in strides):
        gaps = emit("Reshape", [x], "gaps", shape=[0, c, *(v for s in spatial for v in (s, 1))])
        wide = emit("Pad", [gaps], "zeros", pads=[0] * (2 + 2 * nd) + [0, 0, *(v for s in strides for v in (0, s - 1))])
        x = emit("Reshape", [wide], "spread", shape=[0, c, *(s * n for s, n in zip(strides, spatial))])
    wc = np.flip(_conv_layout(w, g), axis=tuple(range(2, 2 + nd)))  # the transposed conv's tap t: the conv's k-1-t
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
