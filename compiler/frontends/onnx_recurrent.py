"""ONNX's recurrent layers (LSTM, GRU, RNN), unrolled over their time steps into op-set-v1 ops.

The lowering is the PyTorch frontend's unrolled layers', so both meet the same kernels:
the input projection of every step is one MatMul over the whole sequence with both biases folded
in (where ONNX's equations allow), then per step one Gemm of the hidden state by the recurrent
weights (all gates at once) and elementwise gate math that the optimizer fuses. A zero initial
state (absent, or a constant of zeros) skips the first step's recurrent product.

ONNX's semantics exactly: gate order iofc (LSTM, peepholes iof) and zrh (GRU), GRU's
``linear_before_reset``, ``clip`` on the activations' inputs, forward/reverse/bidirectional,
``layout`` 0 and 1, initial states. Unsupported (a typed error, not a wrong answer):
``sequence_lens`` other than the full length of every sequence, LSTM's ``input_forget``,
activations that take alpha/beta, a time axis not known at import, more than MAX_STEPS steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.types import Batch
from .builder import Unsupported
from .onnx_node import NodeCtx, OnnxImportError
from .onnx_ops import translates

MAX_STEPS = 4096  # time steps x directions unrolled into one graph: a hostile length must not explode it

_ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}  # ONNX's activation names -> ops


@dataclass(frozen=True)
class Cell:
    """What tells one recurrent op from another: gates per step and the default activations."""

    gates: int
    activations: tuple[str, ...]


CELLS = {"LSTM": Cell(4, ("Sigmoid", "Tanh", "Tanh")), "GRU": Cell(3, ("Sigmoid", "Tanh")), "RNN": Cell(1, ("Tanh",))}


@dataclass(frozen=True)
class Layer:
    """One node's checked attributes and weights."""

    hidden: int
    steps: int
    directions: int
    layout: int
    clip: float | None
    acts: tuple[tuple[str, ...], ...]  # per direction
    w: np.ndarray  # [D, G*H, I]
    r: np.ndarray  # [D, G*H, H]
    b: np.ndarray  # [D, 2*G*H]


def _activations(ctx: NodeCtx, cell: Cell, directions: int) -> tuple[tuple[str, ...], ...]:
    names = ctx.attr("activations", list(cell.activations) * directions)
    if ctx.attr("activation_alpha", None) is not None or ctx.attr("activation_beta", None) is not None:
        raise Unsupported("activations with alpha/beta")
    per = len(cell.activations)
    if len(names) != per * directions:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): {len(names)} activations, expected {per * directions}")
    ops = []
    for name in names:
        if name.lower() not in _ACTIVATIONS:
            raise Unsupported(f"activation {name[:40]}")
        ops.append(_ACTIVATIONS[name.lower()])
    return tuple(tuple(ops[d * per:(d + 1) * per]) for d in range(directions))


def _weights(ctx: NodeCtx, i: int, shape: tuple[int, ...], what: str) -> np.ndarray:
    value = ctx.const(i)
    if value.shape != shape:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): {what} has shape {value.shape}, expected {shape}")
    return value


def _layer(ctx: NodeCtx, cell: Cell) -> Layer:
    t = ctx.type(0)
    if not t.dtype.is_float or t.rank != 3:
        raise Unsupported(f"input of {t.dtype.value} rank {t.rank}")
    layout = ctx.attr("layout", 0) if ctx.opset >= 14 else 0
    if layout not in (0, 1):
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): layout must be 0 or 1, not {layout}")
    steps, features = t.shape[layout], t.shape[2]
    if isinstance(steps, Batch) or not isinstance(features, int):
        raise Unsupported("a time axis or feature size not known at import")
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): direction {direction[:40]!r}")
    d = 2 if direction == "bidirectional" else 1
    if steps * d > MAX_STEPS:
        raise Unsupported(f"more than {MAX_STEPS} steps")
    h = ctx.attr("hidden_size")
    if not isinstance(h, int) or h < 1:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): hidden_size must be a positive int")
    g = cell.gates * h
    w = _weights(ctx, 1, (d, g, features), "W")
    r = _weights(ctx, 2, (d, g, h), "R")
    b = _weights(ctx, 3, (d, 2 * g), "B") if ctx.has(3) else np.zeros((d, 2 * g), w.dtype)
    if ctx.has(4):  # sequence_lens: only the whole length of every sequence has this lowering's meaning
        lens = ctx.const(4)
        if lens.size and not (lens == steps).all():
            raise Unsupported("sequence_lens shorter than the sequence")
    clip = ctx.attr("clip", None)
    if clip is not None and not clip > 0:
        raise OnnxImportError(f"node {ctx.name!r} ({ctx.op}): clip must be positive")
    if ctx.attr("input_forget", 0):
        raise Unsupported("input_forget")
    return Layer(h, steps, d, layout, clip, _activations(ctx, cell, d), w, r, b)


class _Steps:
    """Emits one direction's ops; ``h``/``c`` None is a zero state."""

    def __init__(self, ctx: NodeCtx, layer: Layer, d: int, reverse: bool):
        self.ctx, self.layer, self.d, self.reverse = ctx, layer, d, reverse
        self.tag = f"d{d}"

    def op(self, op: str, inputs: list[str], suffix: str, **attrs) -> str:
        return self.ctx.tmp(op, inputs, f"{self.tag}/{suffix}", **attrs)

    def const(self, value: np.ndarray, suffix: str) -> str:
        return self.ctx.constant(np.ascontiguousarray(value, self.layer.w.dtype), f"{self.ctx.name}/{self.tag}/{suffix}")

    def act(self, k: int, x: str, suffix: str) -> str:
        if self.layer.clip is not None:
            x = self.op("Clip", [x], f"{suffix}_clip", min=-self.layer.clip, max=self.layer.clip)
        return self.op(self.layer.acts[self.d][k], [x], suffix)

    def projection(self, x: str, bias: np.ndarray) -> list[str]:
        """X W^T + bias for every step at once, then one [B, G*H] slice per step, in the order they run."""
        xw = self.op("MatMul", [x, self.const(self.layer.w[self.d].T, "wT")], "xw")
        xw = self.op("Add", [xw, self.const(bias, "bias")], "xwb")
        return [self.op("Squeeze", [self.op("Slice", [xw], f"x{t}", starts=[t], ends=[t + 1], axes=[0], steps=[1])],
                        f"x{t}s", axes=[0]) for t in self.order()]

    def order(self) -> range:
        return range(self.layer.steps - 1, -1, -1) if self.reverse else range(self.layer.steps)

    def recurrent(self, h: str, rows: slice, suffix: str) -> str:
        """H R^T as a Gemm: the Add of the step's projection that follows fuses into it as its residual."""
        return self.op("Gemm", [h, self.const(self.layer.r[self.d][rows].T, f"{suffix}T")], suffix)

    def split(self, x: str, parts: int, suffix: str) -> list[str]:
        h = self.layer.hidden
        return self.ctx.b.add("Split", [x], name=f"{self.ctx.name}/{self.tag}/{suffix}", n_outputs=parts,
                              axis=-1, split=[h] * parts)

    def lstm(self, x: str, h: str | None, c: str | None, peep: np.ndarray | None) -> tuple[list[str], str, str]:
        hs, lay = [], self.layer
        wb, rb = np.split(lay.b[self.d], 2)
        for t, xt in enumerate(self.projection(x, wb + rb)):
            s = f"t{t}"
            gates = xt if h is None else self.op("Add", [self.recurrent(h, slice(None), f"{s}/hr"), xt], f"{s}/gates")
            i, o, f, g = self.split(gates, 4, f"{s}/iofc")
            if peep is not None and c is not None:
                i = self.op("Add", [i, self.op("Mul", [c, self.const(peep[0], "pi")], f"{s}/pic")], f"{s}/ip")
                f = self.op("Add", [f, self.op("Mul", [c, self.const(peep[2], "pf")], f"{s}/pfc")], f"{s}/fp")
            ig = self.op("Mul", [self.act(0, i, f"{s}/i"), self.act(1, g, f"{s}/g")], f"{s}/ig")
            c = ig if c is None else self.op("Add", [self.op("Mul", [self.act(0, f, f"{s}/f"), c], f"{s}/fc"), ig],
                                             f"{s}/c")
            if peep is not None:
                o = self.op("Add", [o, self.op("Mul", [c, self.const(peep[1], "po")], f"{s}/poc")], f"{s}/op")
            h = self.op("Mul", [self.act(0, o, f"{s}/o"), self.act(2, c, f"{s}/hc")], f"{s}/h")
            hs.append(h)
        return hs, h, c

    def gru(self, x: str, h: str | None, before_reset: bool) -> list[str]:
        hs, lay, n = [], self.layer, self.layer.hidden
        wb, rb = np.split(lay.b[self.d], 2)
        folded = wb + np.concatenate([rb[:2 * n], np.zeros(n, rb.dtype) if before_reset else rb[2 * n:]])
        one = self.const(np.ones((), lay.w.dtype), "one")
        for t, xt in enumerate(self.projection(x, folded)):
            s = f"t{t}"
            xz, xr, xh = self.split(xt, 3, f"{s}/xzrh")
            if h is None:
                z, r = self.act(0, xz, f"{s}/z"), self.act(0, xr, f"{s}/r")
                rh = self.op("Mul", [r, self.const(rb[2 * n:], "rbh")], f"{s}/rh") if before_reset else None
            else:
                if before_reset:
                    hz, hr, hh = self.split(self.recurrent(h, slice(None), f"{s}/hrzrh"), 3, f"{s}/hzrh")
                else:
                    hz, hr = self.split(self.recurrent(h, slice(0, 2 * n), f"{s}/hrzr"), 2, f"{s}/hzr")
                z = self.act(0, self.op("Add", [xz, hz], f"{s}/zin"), f"{s}/z")
                r = self.act(0, self.op("Add", [xr, hr], f"{s}/rin"), f"{s}/r")
                if before_reset:  # r * (H R_h^T + Rb_h)
                    rh = self.op("Mul", [r, self.op("Add", [hh, self.const(rb[2 * n:], "rbh")], f"{s}/hb")], f"{s}/rh")
                else:  # (r * H) R_h^T; Rb_h is in the projection
                    rh = self.recurrent(self.op("Mul", [r, h], f"{s}/rhp"), slice(2 * n, 3 * n), f"{s}/rhh")
            cand = self.act(1, xh if rh is None else self.op("Add", [xh, rh], f"{s}/hin"), f"{s}/hcand")
            keep = self.op("Sub", [one, z], f"{s}/1mz")
            h = self.op("Mul", [keep, cand], f"{s}/new") if h is None else self.op(
                "Add", [self.op("Mul", [keep, cand], f"{s}/new"), self.op("Mul", [z, h], f"{s}/old")], f"{s}/h")
            hs.append(h)
        return hs

    def rnn(self, x: str, h: str | None) -> list[str]:
        hs = []
        wb, rb = np.split(self.layer.b[self.d], 2)
        for t, xt in enumerate(self.projection(x, wb + rb)):
            pre = xt if h is None else self.op("Add", [self.recurrent(h, slice(None), f"t{t}/hr"), xt], f"t{t}/pre")
            h = self.act(0, pre, f"t{t}/h")
            hs.append(h)
        return hs


def _state(ctx: NodeCtx, i: int, layer: Layer, d: int) -> str | None:
    """Direction ``d``'s initial state as [B, H], or None for zeros (absent, or a constant of zeros)."""
    if not ctx.has(i):
        return None
    value = ctx.b.value_of(ctx.x(i))
    if value is not None and not value.any():
        return None
    axis = 1 if layer.layout else 0
    part = ctx.tmp("Slice", [ctx.x(i)], f"state{i}/d{d}", starts=[d], ends=[d + 1], axes=[axis], steps=[1])
    return ctx.tmp("Squeeze", [part], f"state{i}/d{d}s", axes=[axis])


def _outputs(ctx: NodeCtx, layer: Layer, seqs: list[list[str]], lasts: list[list[str]]) -> list:
    """Y [S, D, B, H] (layout 1: [B, S, D, H]) and the last states [D, B, H] ([B, D, H])."""
    def name(j: int) -> str:
        return ctx.outputs[j] if j < len(ctx.outputs) and ctx.outputs[j] else f"{ctx.name}:{j}"

    def stack(values: list[str], axis: int, suffix: str) -> str:
        parts = [ctx.tmp("Unsqueeze", [v], f"{suffix}{k}", axes=[axis]) for k, v in enumerate(values)]
        return parts[0] if len(parts) == 1 else ctx.tmp("Concat", parts, suffix, axis=axis)

    def final(j: int, value: str, perm: list[int]) -> str:
        op, attrs = ("Transpose", {"perm": perm}) if layer.layout else ("Identity", {})
        return ctx.b.add(op, [value], name=ctx.name, output_names=[name(j)], **attrs)[0]

    wanted = [j < len(ctx.outputs) and bool(ctx.outputs[j]) for j in range(1 + len(lasts))]
    out: list = [None] * len(wanted)
    if wanted[0]:  # per direction [S, B, H] -> [S, 1, B, H], directions side by side
        y = stack([stack(s, 0, f"y{d}") for d, s in enumerate(seqs)], 1, "y")
        out[0] = final(0, y, [2, 0, 1, 3])
    for j, states in enumerate(lasts, 1):
        if wanted[j]:
            out[j] = final(j, stack(states, 0, f"last{j}"), [1, 0, 2])
    return out


def _translate(ctx: NodeCtx) -> list:
    cell = CELLS[ctx.op]
    layer = _layer(ctx, cell)
    x = ctx.x(0)
    if layer.layout:
        x = ctx.tmp("Transpose", [x], "time_major", perm=[1, 0, 2])
    peep = None
    if ctx.op == "LSTM" and ctx.has(7):
        peep = _weights(ctx, 7, (layer.directions, 3 * layer.hidden), "P")
    seqs, hs, cs = [], [], []
    for d in range(layer.directions):
        reverse = ctx.attr("direction", "forward") == "reverse" or d == 1
        steps, h0 = _Steps(ctx, layer, d, reverse), _state(ctx, 5, layer, d)
        if ctx.op == "LSTM":
            seq, h, c = steps.lstm(x, h0, _state(ctx, 6, layer, d), None if peep is None else np.split(peep[d], 3))
            cs.append(c)
        elif ctx.op == "GRU":
            seq = steps.gru(x, h0, bool(ctx.attr("linear_before_reset", 0)))
        else:
            seq = steps.rnn(x, h0)
        hs.append(seq[-1])
        seqs.append(seq[::-1] if reverse else seq)
    return _outputs(ctx, layer, seqs, [hs, cs] if ctx.op == "LSTM" else [hs])


translates(LSTM=(7, 14, 22), GRU=(7, 14, 22), RNN=(7, 14, 22))(_translate)
