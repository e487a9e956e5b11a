"""A Cuvil IR graph as a trainable PyTorch module, for on-device DP-SGD (imports torch: training only).

The layers that hold weights become real ``nn.Conv2d`` / ``nn.Linear`` modules, so Opacus computes
their per-example gradients with its own hooks; every other op is a parameter-free function from
:data:`FUNCTIONAL`. One table per kind, no ``if`` chain: adding an op is adding an entry. What the
table lacks is refused at once, naming every unsupported op and node (BatchNormalization is refused
on purpose: Opacus cannot bound a per-example gradient through batch statistics).

The module's ``forward`` returns what the loss needs: the logits, so a graph that ends in Softmax
(or LogSoftmax) is run up to that op's input. The first dimension is the batch throughout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...compiler.ir.graph import Graph, Node
from .errors import TrainingUnsupported
from .layers import last_layers, weight_operands

Tensor = torch.Tensor
Functional = Callable[[Sequence[Tensor], Mapping, "_Shapes"], Tensor]


@dataclass(frozen=True)
class _Shapes:
    """Static shapes of a node's inputs and outputs (the batch dimension as the graph declares it)."""

    inputs: tuple[tuple, ...]
    outputs: tuple[tuple, ...]


def _spatial_pads(pads: Sequence[int]) -> tuple[int, ...] | None:
    """Symmetric 2-D pads as (h, w), or None when begin and end differ."""
    pads = tuple(pads) or (0, 0, 0, 0)
    return pads[:2] if pads[:2] == pads[2:] else None


def _padded(x: Tensor, pads: Sequence[int], value: float = 0.0) -> Tensor:
    """Apply [top, left, bottom, right] pads explicitly (F.pad wants last dim first)."""
    top, left, bottom, right = pads
    return F.pad(x, (left, right, top, bottom), value=value)


def _pool(kind: str) -> Functional:
    def run(xs, a, _shapes):
        k, s, d = tuple(a["kernel_shape"]), tuple(a["strides"] or (1, 1)), tuple(a.get("dilations") or (1, 1))
        sym = _spatial_pads(a["pads"])
        x, pad = (xs[0], sym) if sym is not None else (_padded(xs[0], a["pads"], -np.inf if kind == "max" else 0.0),
                                                        (0, 0))
        if kind == "max":
            return F.max_pool2d(x, k, s, pad, d, ceil_mode=bool(a["ceil_mode"]))
        return F.avg_pool2d(x, k, s, pad, ceil_mode=bool(a["ceil_mode"]),
                            count_include_pad=bool(a.get("count_include_pad", 0)))
    return run


def _view(xs, _a, shapes: _Shapes) -> Tensor:
    """Reshape-like ops: the static output shape with the batch in front (they must keep the batch)."""
    out, inp = shapes.outputs[0], shapes.inputs[0]
    if not out or not inp or out[0] != inp[0] or not all(isinstance(d, int) for d in out[1:]):
        raise TrainingUnsupported("a reshape that moves the batch dimension cannot be trained")
    return xs[0].reshape(xs[0].shape[0], *out[1:])


FUNCTIONAL: Mapping[str, Functional] = {
    "Relu": lambda xs, a, s: F.relu(xs[0]),
    "Sigmoid": lambda xs, a, s: torch.sigmoid(xs[0]),
    "Tanh": lambda xs, a, s: torch.tanh(xs[0]),
    "LeakyRelu": lambda xs, a, s: F.leaky_relu(xs[0], a["alpha"]),
    "Clip": lambda xs, a, s: torch.clamp(xs[0], a["min"], a["max"]),
    "Add": lambda xs, a, s: xs[0] + xs[1],
    "Sub": lambda xs, a, s: xs[0] - xs[1],
    "Mul": lambda xs, a, s: xs[0] * xs[1],
    "Div": lambda xs, a, s: xs[0] / xs[1],
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda xs, a, s: xs[0].mean(dim=tuple(range(2, xs[0].dim())), keepdim=True),
    "Reshape": _view, "Flatten": _view, "Squeeze": _view, "Unsqueeze": _view,
    "Identity": lambda xs, a, s: xs[0],
    "Softmax": lambda xs, a, s: torch.softmax(xs[0], a["axis"]),
    "LogSoftmax": lambda xs, a, s: torch.log_softmax(xs[0], a["axis"]),
}
LOGIT_HEADS = frozenset({"Softmax", "LogSoftmax"})  # a final one of these is left out of forward()


@dataclass(frozen=True)
class _Param:
    """Where a graph constant lives in the module, and whether it is stored transposed there."""

    layer: str
    attr: str
    transposed: bool = False


def _conv(node: Node, consts: Mapping[str, np.ndarray]) -> tuple[nn.Module, dict[str, _Param]]:
    a = node.attr
    w = consts[node.inputs[1]]
    if w.ndim != 4:
        raise TrainingUnsupported(f"Conv {node.name!r}: only 2-D convolutions train on devices")
    bias = len(node.inputs) > 2 and bool(node.inputs[2])
    sym = _spatial_pads(a["pads"])
    layer = nn.Conv2d(w.shape[1] * a["group"], w.shape[0], tuple(w.shape[2:]), tuple(a["strides"] or (1, 1)),
                      sym if sym is not None else 0, tuple(a["dilations"] or (1, 1)), a["group"], bias)
    params = {node.inputs[1]: _Param(node.name, "weight")}
    if bias:
        params[node.inputs[2]] = _Param(node.name, "bias")
    return layer, params


def _conv_call(layer: nn.Module, node: Node, xs: Sequence[Tensor]) -> Tensor:
    sym = _spatial_pads(node.attr["pads"])
    return layer(xs[0] if sym is not None else _padded(xs[0], node.attr["pads"]))


def _gemm(node: Node, consts: Mapping[str, np.ndarray]) -> tuple[nn.Module, dict[str, _Param]]:
    a = node.attr
    if a["transA"] or a["alpha"] != 1.0 or a["beta"] != 1.0:
        raise TrainingUnsupported(f"Gemm {node.name!r}: only transA=0, alpha=beta=1 trains on devices")
    w = consts[node.inputs[1]]
    out_features, in_features = (w.shape if a["transB"] else w.shape[::-1])
    bias = len(node.inputs) > 2 and bool(node.inputs[2])
    if bias and consts[node.inputs[2]].size != out_features:
        raise TrainingUnsupported(f"Gemm {node.name!r}: only a per-output bias trains on devices")
    params = {node.inputs[1]: _Param(node.name, "weight", not a["transB"])}
    if bias:
        params[node.inputs[2]] = _Param(node.name, "bias")
    return nn.Linear(in_features, out_features, bias), params


def _matmul(node: Node, consts: Mapping[str, np.ndarray]) -> tuple[nn.Module, dict[str, _Param]]:
    w = consts[node.inputs[1]]
    if w.ndim != 2:
        raise TrainingUnsupported(f"MatMul {node.name!r}: only a 2-D constant right operand trains on devices")
    return nn.Linear(w.shape[0], w.shape[1], bias=False), {node.inputs[1]: _Param(node.name, "weight", True)}


Builder = Callable[[Node, Mapping[str, np.ndarray]], tuple[nn.Module, dict[str, _Param]]]
TRAINABLE: Mapping[str, tuple[Builder, Callable[[nn.Module, Node, Sequence[Tensor]], Tensor]]] = {
    "Conv": (_conv, _conv_call),
    "Gemm": (_gemm, lambda layer, node, xs: layer(xs[0])),
    "MatMul": (_matmul, lambda layer, node, xs: layer(xs[0])),
}


def _layer_key(name: str, taken: set[str]) -> str:
    key = re.sub(r"\W", "_", name) or "layer"
    key = f"n_{key}" if key[0].isdigit() else key
    while key in taken:
        key += "_"
    taken.add(key)
    return key


class TorchGraph(nn.Module):
    """The graph's forward pass in torch (to its logits), its weight-holding layers as parameters."""

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        _check_supported(graph)
        _check_per_example(graph)
        consts = graph.constants
        self.layers = nn.ModuleDict()
        self.params: dict[str, _Param] = {}  # graph constant name -> where it lives
        self._keys: dict[str, str] = {}
        taken: set[str] = set()
        for node in graph.nodes:
            if node.op not in TRAINABLE:
                continue
            if not _trainable_operands(node, consts):
                raise TrainingUnsupported(f"{node.op} {node.name!r}: its weights are not float32 constants")
            layer, params = TRAINABLE[node.op][0](node, consts)
            key = _layer_key(node.name, taken)
            self._keys[node.name] = key
            self.layers[key] = layer
            self.params.update({c: _Param(key, p.attr, p.transposed) for c, p in params.items()})
        _check_not_shared(graph, self.params)
        self._nodes = graph.nodes[:-1] if graph.nodes and graph.nodes[-1].op in LOGIT_HEADS else graph.nodes
        self._output = self._nodes[-1].outputs[0] if self._nodes else graph.inputs[0]
        self._const_keys: dict[str, str] = {}  # constants that stay constant: buffers, never trained
        for name, value in consts.items():
            if name not in self.params and value.dtype.kind in "fiub":
                key = _layer_key(f"const_{name}", taken)
                self.register_buffer(key, torch.from_numpy(np.array(value)), persistent=False)
                self._const_keys[name] = key
        self.load_weights({c: consts[c] for c in self.params})

    @property
    def example_shape(self) -> tuple[int, ...]:
        """One example's shape: the graph input's, without its batch axis."""
        return tuple(int(d) for d in self.graph.types[self.graph.inputs[0]].shape[1:])

    # weights --------------------------------------------------------------------------------------
    def _tensor(self, const: str) -> nn.Parameter:
        p = self.params[const]
        return getattr(self.layers[p.layer], p.attr)

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Set trainable weights from arrays in the graph's layout."""
        with torch.no_grad():
            for const, value in weights.items():
                arr = np.asarray(value, dtype=np.float32)
                arr = arr.T if self.params[const].transposed else arr
                target = self._tensor(const)
                target.copy_(torch.from_numpy(np.array(arr, order="C")).reshape(target.shape))

    def train_only_last(self, layers: int) -> None:
        """Freeze every weight layer but the last ``layers`` ones (0: train them all; :mod:`.layers`' rule)."""
        trained = set(last_layers(list(self.layers), layers))
        for key, layer in self.layers.items():
            layer.requires_grad_(key in trained)

    def weights(self, trained_only: bool = False) -> dict[str, np.ndarray]:
        """Weights of the weight layers as arrays in the graph's layout (shapes and dtype of its constants)."""
        out = {}
        for const, p in self.params.items():
            if trained_only and not self._tensor(const).requires_grad:
                continue
            arr = self._tensor(const).detach().cpu().numpy()
            arr = arr.T if p.transposed else arr
            out[const] = np.array(arr, dtype=np.float32, order="C").reshape(self.graph.constants[const].shape)
        return out

    # forward --------------------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        env: dict[str, Tensor] = {self.graph.inputs[0]: x}
        env.update({name: getattr(self, key) for name, key in self._const_keys.items()})
        types = self.graph.types
        for node in self._nodes:
            if node.name in self._keys:  # a weight layer: its weights are the layer's own parameters
                out = TRAINABLE[node.op][1](self.layers[self._keys[node.name]], node, [env[node.inputs[0]]])
            else:
                xs = [env[i] for i in node.inputs if i]
                shapes = _Shapes(tuple(types[i].shape for i in node.inputs if i),
                                 tuple(types[o].shape for o in node.outputs))
                out = FUNCTIONAL[node.op](xs, node.attr, shapes)
            env[node.outputs[0]] = out
        return env[self._output]


def _trainable_operands(node: Node, consts: Mapping[str, np.ndarray]) -> bool:
    """A layer trains when its weight (and bias, if any: :func:`.layers.weight_operands`) are float32 constants."""
    names = weight_operands(node)
    return bool(names) and all(n in consts and consts[n].dtype == np.float32 for n in names)


def _check_supported(graph: Graph) -> None:
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise TrainingUnsupported("only single-input, single-output models train on devices")
    bad = [(n.op, n.name) for n in graph.nodes
           if (n.op not in FUNCTIONAL and n.op not in TRAINABLE) or len(n.outputs) != 1]
    if bad:
        ops = ", ".join(sorted({op for op, _ in bad}))
        nodes = ", ".join(name for _, name in bad[:10]) + (" ..." if len(bad) > 10 else "")
        raise TrainingUnsupported(f"ops {ops} (nodes {nodes}) cannot be fine-tuned on a device; "
                                  f"supported: {', '.join(sorted({*FUNCTIONAL, *TRAINABLE}))}")


def _check_per_example(graph: Graph) -> None:
    """Refuse a graph in which one example's output can depend on another's: Opacus clips each row's
    gradient, which bounds one example's influence only while the rows stay apart. A softmax over the
    batch axis, or an operand with a batch axis of its own that does not come from the input, would let
    a coordinator's model single out one record behind a finite ε."""
    batched = {graph.inputs[0]}
    for node in graph.nodes:
        ins = [i for i in node.inputs if i]
        if not any(i in batched for i in ins):
            continue
        batched.update(node.outputs)
        if node.op in LOGIT_HEADS and node.attr["axis"] % len(graph.types[ins[0]].shape) == 0:
            raise TrainingUnsupported(f"{node.op} {node.name!r} runs across the batch axis; only per-example "
                                      "models fine-tune on devices")
        if node.op in TRAINABLE:
            continue
        rank = len(graph.types[node.outputs[0]].shape)
        mixed = [i for i in ins if i not in batched and len(graph.types[i].shape) == rank
                 and graph.types[i].shape[0] != 1]
        if mixed:
            raise TrainingUnsupported(f"{node.op} {node.name!r}: operand {mixed[0]!r} has a batch axis of its own; "
                                      "only per-example models fine-tune on devices")


def _check_not_shared(graph: Graph, params: Mapping[str, _Param]) -> None:
    users: dict[str, int] = {}
    for node in graph.nodes:
        for name in node.inputs:
            users[name] = users.get(name, 0) + 1
    shared = sorted(c for c in params if users.get(c, 0) > 1)
    if shared:
        raise TrainingUnsupported(f"weights used by more than one layer cannot be fine-tuned: {', '.join(shared[:5])}")
