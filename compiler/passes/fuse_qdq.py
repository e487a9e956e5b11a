"""fuse_qdq: QDQ patterns -> integer ops, so a quantized model runs on integer kernels end to end.

A QDQ model says "this float op computes on dequantized int8 values and its result is quantized":

    DequantizeLinear(x) -> Conv(., DequantizeLinear(W)[, DequantizeLinear(B)]) [-> Relu | Clip] -> QuantizeLinear

becomes one ``QConv`` (likewise Gemm / MatMul with a constant 2-D weight -> ``QMatMul``, Add ->
``QAdd``). A fused ReLU/Clip becomes the requantization's ``clamp``: quantization is monotonic and
maps 0 to the zero point, so ``Q(relu(v)) = max(Q(v), Q(0))`` exactly. MaxPool, the views
(Flatten, Reshape, Squeeze, Unsqueeze), data movement (Transpose, Slice, Pad) and Concat, between
DequantizeLinears and a QuantizeLinear all of the same parameters, run on the int8 values
themselves, which is exact. A 1-D Conv becomes a QConv over a height of one between int8 views.
Weights must be symmetric (zero point 0) constant i8, activations per tensor; anything else stays
as it was (correct, in float).

A Gemm / MatMul of dequantized operands whose float result is not quantized again (a model's
logits) becomes QMatMul's float-output form: integer products, the accumulator dequantized to
float32 (its bias, as in the requantized form, rounded to int32 at ``x_scale * w_scale``).

The fused node takes the QuantizeLinear's output name and place; dce drops what it no longer reads.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ops.quant import QUANT_DTYPES, clamp_bounds, dtype_range
from .rewrite import Names, as_constant, rebuild, sole_user, users

QParams = tuple[float, int, DType]  # per-tensor scale, zero point, dtype
_SAME_PARAMS_OPS = ("MaxPool", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Concat")


class _Ctx:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.uses = users(graph)
        self.producers = graph.producers()
        self.constants = dict(graph.constants)
        self.names = Names(graph)

    def dq(self, value: str) -> Node | None:
        node = self.producers.get(value)
        return node if node is not None and node.op == "DequantizeLinear" else None

    def activation_in(self, value: str) -> tuple[str, QParams] | None:
        """``value`` = DequantizeLinear(q) per tensor, q an i8/u8 value: (q, its parameters)."""
        node = self.dq(value)
        if node is None:
            return None
        a, q = node.attr, node.inputs[0]
        dtype = self.graph.types[q].dtype
        if len(a["scale"]) != 1 or dtype not in QUANT_DTYPES:
            return None
        return q, (a["scale"][0], a["zero_point"][0], dtype)

    def const_weight(self, value: str) -> tuple[np.ndarray, tuple[float, ...], int] | None:
        """``value`` = DequantizeLinear(W) of a constant symmetric i8 W: (W, scales, axis)."""
        node = self.dq(value)
        if node is None or node.inputs[0] not in self.constants:
            return None
        w, a = self.constants[node.inputs[0]], node.attr
        if w.dtype != np.int8 or any(a["zero_point"]):
            return None
        return w, a["scale"], a["axis"] % max(w.ndim, 1)

    def quantize_after(self, value: str) -> tuple[Node, list[Node], tuple[int, ...]] | None:
        """The chain ``value [-> Relu | Clip] -> QuantizeLinear`` (per tensor), each link the only
        reader of the one before: (the Q node, the links, the clamp the activation implies)."""
        links: list[Node] = []
        node = sole_user(self.graph, value, self.uses)
        if node is not None and node.op in ("Relu", "Clip"):
            links.append(node)
            node = sole_user(self.graph, node.outputs[0], self.uses)
        if node is None or node.op != "QuantizeLinear" or len(node.attr["scale"]) != 1:
            return None
        clamp: tuple[int, ...] = ()
        if links:
            scale, zp, to = node.attr["scale"][0], node.attr["zero_point"][0], node.attr["to"]
            act = links[0].attr
            lo, hi = (0.0, np.inf) if links[0].op == "Relu" else (act["min"], act["max"])
            clamp = (_quantized(lo, scale, zp, to), _quantized(hi, scale, zp, to))
        return node, links, clamp


def _quantized(v: float, scale: float, zp: int, to: DType) -> int:
    lo, hi = dtype_range(to)
    if np.isinf(v):
        return lo if v < 0 else hi
    return int(np.clip(np.rint(np.float32(v) / np.float32(scale)) + zp, lo, hi))


def _out_attrs(q: Node | None, clamp: tuple[int, ...]) -> dict:
    """The fused op's output attributes: the QuantizeLinear's, or without one the float-output form."""
    if q is None:
        return dict(y_scale=1.0, y_zero_point=0, to=DType.F32, clamp=())
    a = q.attr
    lo, hi = clamp_bounds(a["to"], clamp)
    full = clamp_bounds(a["to"], ())
    return dict(y_scale=a["scale"][0], y_zero_point=a["zero_point"][0], to=a["to"],
                clamp=() if (lo, hi) == full else (lo, hi))


def _int_bias(ctx: _Ctx, value: str, x_scale: float, w_scale: np.ndarray, m: int) -> np.ndarray | None:
    """The bias as int32 at scale ``x_scale * w_scale``: the DequantizeLinear's own ints when its scale
    is exactly that, else the float bias rounded to it."""
    node = ctx.dq(value)
    want = np.broadcast_to(np.float32(x_scale) * w_scale.astype(np.float32), (m,))
    if node is not None and node.inputs[0] in ctx.constants:
        b = ctx.constants[node.inputs[0]]
        a = node.attr
        scale = np.broadcast_to(np.asarray(a["scale"], np.float32), (m,))
        if b.dtype == np.int32 and not any(a["zero_point"]) and np.array_equal(scale, want):
            return np.broadcast_to(b.reshape(-1), (m,)).astype(np.int32)
        fb = (b.astype(np.float64).reshape(-1) - np.asarray(a["zero_point"], np.float64)) * scale
    elif value in ctx.constants and ctx.constants[value].dtype.kind == "f":
        fb = ctx.constants[value].astype(np.float64).reshape(-1)
    else:
        return None
    if fb.size not in (1, m):
        return None
    q = np.rint(np.broadcast_to(fb, (m,)) / want.astype(np.float64))
    return q.astype(np.int32) if np.all(np.abs(q) < 2**31 - 1) else None


def _fuse_conv(ctx: _Ctx, node: Node, tail) -> tuple[Node | tuple[Node, ...], dict] | None:
    x, w = ctx.activation_in(node.inputs[0]), ctx.const_weight(node.inputs[1])
    if x is None or w is None or (len(w[1]) > 1 and w[2] != 0) or w[0].ndim not in (3, 4):
        return None
    q, _, clamp = tail
    (xq, (xs, xz, _)), (wv, ws, _) = x, w
    inputs, consts = [xq, _weight_name(ctx, node.inputs[1])], {}
    if len(node.inputs) == 3:
        bias = _int_bias(ctx, node.inputs[2], xs, np.asarray(ws), wv.shape[0])
        if bias is None:
            return None
        name = ctx.names.fresh(f"{node.name}/bias_q")
        consts[name] = as_constant(bias, np.int32)
        inputs.append(name)
    a = node.attr
    geometry = dict(strides=a["strides"], pads=a["pads"], dilations=a["dilations"])
    if wv.ndim == 3:
        return _conv1d_as_2d(ctx, node, inputs, consts, wv, geometry, dict(
            group=a["group"], x_scale=xs, x_zero_point=xz, w_scale=ws, **_out_attrs(q, clamp)), q.outputs)
    fused = Node.make("QConv", inputs, q.outputs, name=node.name, **geometry, group=a["group"], x_scale=xs,
                      x_zero_point=xz, w_scale=ws, **_out_attrs(q, clamp))
    return fused, consts


def _conv1d_as_2d(ctx: _Ctx, node: Node, inputs: list, consts: dict, wv: np.ndarray, geometry: dict, attrs: dict,
                  outputs) -> tuple[tuple[Node, ...], dict]:
    """A 1-D conv as a QConv over (N, C, 1, L): int8 views in and out (exact), weights (M, C/g, 1, K)."""
    x4, y4 = ctx.names.fresh(f"{node.name}/x_2d"), ctx.names.fresh(f"{node.name}/y_2d")
    w4 = ctx.names.fresh(f"{node.name}/weight_2d")
    consts[w4] = as_constant(wv[:, :, None, :], np.int8)
    (s,), (p0, p1), (d,) = geometry["strides"], geometry["pads"], geometry["dilations"]
    return (Node.make("Unsqueeze", [inputs[0]], [x4], name=f"{node.name}/unsqueeze", axes=(2,)),
            Node.make("QConv", [x4, w4, *inputs[2:]], [y4], name=node.name, strides=(1, s), pads=(0, p0, 0, p1),
                      dilations=(1, d), **attrs),
            Node.make("Squeeze", [y4], outputs, name=f"{node.name}/squeeze", axes=(2,))), consts


def _weight_name(ctx: _Ctx, value: str) -> str:
    return ctx.dq(value).inputs[0]


def _fuse_matmul(ctx: _Ctx, node: Node, tail) -> tuple[Node, dict] | None:
    a = node.attr
    x, w = ctx.activation_in(node.inputs[0]), ctx.const_weight(node.inputs[1])
    if x is None or w is None or w[0].ndim != 2 or a.get("transA", 0):
        return None
    (xq, (xs, xz, _)), (wv, ws, axis) = x, w
    trans = a.get("transB", 0)
    if len(ws) > 1 and axis != (0 if trans else 1):  # per-column scales only
        return None
    alpha = a.get("alpha", 1.0)
    if alpha <= 0:
        return None
    ws = tuple(float(np.float32(s) * np.float32(alpha)) for s in ws) if alpha != 1.0 else ws
    q, _, clamp = tail
    consts, inputs = {}, [xq]
    if trans:
        name = ctx.names.fresh(f"{node.name}/weight_kn")
        consts[name] = as_constant(wv.T, np.int8)
        inputs.append(name)
    else:
        inputs.append(_weight_name(ctx, node.inputs[1]))
    n = wv.shape[0] if trans else wv.shape[1]
    if len(node.inputs) == 3:
        bias = _int_bias(ctx, node.inputs[2], xs, np.asarray(ws), n)
        if bias is None or a.get("beta", 1.0) != 1.0:
            return None
        name = ctx.names.fresh(f"{node.name}/bias_q")
        consts[name] = as_constant(bias, np.int32)
        inputs.append(name)
    fused = Node.make("QMatMul", inputs, q.outputs if q is not None else node.outputs, name=node.name, a_scale=xs,
                      a_zero_point=xz, b_scale=ws, **_out_attrs(q, clamp))
    return fused, consts


def _fuse_add(ctx: _Ctx, node: Node, tail) -> tuple[Node, dict] | None:
    a, b = ctx.activation_in(node.inputs[0]), ctx.activation_in(node.inputs[1])
    if a is None or b is None:
        return None
    q, _, clamp = tail
    fused = Node.make("QAdd", [a[0], b[0]], q.outputs, name=node.name, a_scale=a[1][0], a_zero_point=a[1][1],
                      b_scale=b[1][0], b_zero_point=b[1][1], **_out_attrs(q, clamp))
    return fused, {}


def _fuse_same_params(ctx: _Ctx, node: Node, tail) -> tuple[Node, dict] | None:
    """An op that commutes with quantization when its inputs and output share scale and zero point."""
    xs = [ctx.activation_in(v) for v in node.inputs]
    q, links, _ = tail
    qa = q.attr
    params = (qa["scale"][0], qa["zero_point"][0], qa["to"])
    if links or not xs or any(x is None or x[1] != params for x in xs):
        return None
    return node.replace(inputs=tuple(x[0] for x in xs), outputs=q.outputs), {}


def _fuse_pad(ctx: _Ctx, node: Node, tail) -> tuple[Node, dict] | None:
    """A Pad between the same parameters copies int8 values as the others above do, and what it pads with
    is the QuantizeLinear's image of its float value: a TCN's causal pads had run in float, dequantized
    and quantized again (10-19 us each, ORT's 8)."""
    done = _fuse_same_params(ctx, node, tail)
    if done is None or done[0].attr.get("mode", "constant") != "constant":
        return done
    qa = tail[0].attr
    value = _quantized(done[0].attr.get("value", 0.0), qa["scale"][0], qa["zero_point"][0], qa["to"])
    return Node.make("Pad", list(done[0].inputs), list(done[0].outputs), name=node.name,
                     **{**done[0].attr, "value": float(value)}), {}


FUSERS = {"Conv": _fuse_conv, "Gemm": _fuse_matmul, "MatMul": _fuse_matmul, "Add": _fuse_add, "Pad": _fuse_pad,
          **{op: _fuse_same_params for op in _SAME_PARAMS_OPS}}
FLOAT_OUT = frozenset({"Gemm", "MatMul"})  # ops whose fused form has a float output (QMatMul to=f32)
_FLOAT_TAIL = (None, [], ())  # no QuantizeLinear after the node: the fuser makes the float-output form


def fuse_qdq(graph: Graph) -> Graph:
    if not any(n.op == "QuantizeLinear" for n in graph.nodes):
        return graph
    ctx = _Ctx(graph)
    replaced: dict[str, Node | tuple[Node, ...]] = {}  # name of the Q node -> the fused node(s) taking its place
    dropped: set[str] = set()
    for node in graph.nodes:
        fuser = FUSERS.get(node.op)
        if fuser is None or len(node.outputs) != 1:
            continue
        tail = ctx.quantize_after(node.outputs[0])
        if tail is None and node.op in FLOAT_OUT:
            tail = _FLOAT_TAIL
        if tail is None:
            continue
        done = fuser(ctx, node, tail)
        if done is None:
            continue
        fused, consts = done
        ctx.constants.update(consts)
        q = tail[0]
        replaced[(q if q is not None else node).name] = fused  # in the Q's place, or (float output) the node's own
        if q is not None:
            dropped.update([node.name] + [link.name for link in tail[1]])
    if not replaced:
        return graph
    nodes = []
    for n in graph.nodes:
        if n.name not in dropped:
            got = replaced.get(n.name, n)
            nodes.extend(got if isinstance(got, tuple) else (got,))
    return rebuild(graph, nodes, ctx.constants)

