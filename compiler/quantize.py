"""Post-training quantization: a float graph plus calibration inputs -> an int8 QDQ graph and a report.

Weights: per-channel (per output channel) symmetric int8, scale ``max|w| / 127``, or with
``reduce_range`` 7-bit ``max|w| / 63`` (ONNX Runtime's ``reduce_range``): then every weight pair sums
to at most 126 in magnitude, so AVX2 without VNNI can run ``vpmaddubsw`` (twice the products of the
exact int16 ``vpmaddwd``) without saturating, at some accuracy cost. Biases: int32 at
``x_scale * w_scale``. Activations: per-tensor asymmetric u8 (a zero point, so ReLU outputs use the
whole range), from the calibration range of each value (``calibration.py``: ``minmax``, ``percentile``,
``mse``, ``entropy``). ``bias_correction`` takes the mean error the int8 weights add to each output
channel, on the calibration inputs' mean, out of the bias (Nagel et al. 2019). A graph output
made by a Gemm/MatMul (the logits) stays float: its accumulator is dequantized, as in ONNX Runtime's
and PyTorch's int8 models (8-bit logits saturate and cost the MLP 0.3% of its top-1 agreement),
unless ``requantize_outputs`` asks for u8; other outputs (a conv's, an add's) are requantized. The result
is a QDQ graph, the form ONNX Runtime's quantizer writes: ``passes/fuse_qdq.py`` turns it into
integer ops when it is compiled, and the reference interpreter can run it either way.

:func:`integer_form` is the same graph with those patterns fused: what a bundle signs (each scale
once, a smaller manifest than the QDQ form's) and what devices compile.

``float_layers`` keeps named layers in float (mixed precision); the report (``quantize_report.py``)
gives per quantized layer the error of its output against the float graph on the calibration
inputs and, with ``sensitivity``, what it costs the output alone: where to look for that layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .calibration import METHODS, ChannelMean, Observer, bias_shift, u8_params
from .errors import CuvilError
from .ir.dtypes import DType
from .ir.graph import Graph, Node
from .passes.dce import dce
from .passes.fold_batchnorm import fold_batchnorm
from .passes.fold_constants import fold_constants
from .passes.fuse_qdq import FLOAT_OUT, fuse_qdq
from .passes.rewrite import Names, as_constant, rebuild
from .passes.share_constants import share_constants
from .quantize_report import QuantizationReport, agreement, measure, trace
from .quantize_search import FloatSearch, fewest_float

DEFAULT_METHOD = "minmax"  # calibration: the best measured on the zoo (docs/quantization.md)
DEFAULT_BIAS_CORRECTION = True  # as measured there: lower mean error on every zoo model
ANCHORS = ("Conv", "Gemm", "MatMul", "Add")
ACTIVATIONS = ("Relu", "Clip")
PASS_THROUGH = ("MaxPool", "Flatten", "Reshape")  # output keeps the input's parameters
WEIGHT_MAX = {False: 127, True: 63}  # |w| bound by reduce_range
CHUNK = 16  # calibration inputs run through the interpreter at once
LISTED_LAYERS = 8  # an error names this many layers at most (MobileNetV2 has 63: one line must stay readable)


class QuantizationError(CuvilError):
    """Calibration inputs or options that cannot quantize this graph."""


@dataclass(frozen=True)
class QuantizedModel:
    graph: Graph
    report: QuantizationReport


# --- calibration inputs ---------------------------------------------------------------------------
def _batches(graph: Graph, calibration, what: str = "calibration") -> list[dict[str, np.ndarray]]:
    """Calibration (or ``what``) inputs as feeds of at most CHUNK samples (batch axis 0); a graph of a fixed batch
    size gets feeds of that size."""
    if isinstance(calibration, Mapping):
        calibration = [calibration]
    first = graph.types[graph.inputs[0]]
    step = CHUNK if not first.is_static else max(1, int(first.shape[0]) if first.rank else 1)
    feeds = []
    for item in calibration:
        if not isinstance(item, Mapping) or set(item) != set(graph.inputs):
            raise QuantizationError(f"each {what} item must map exactly the inputs {list(graph.inputs)}")
        for name, value in item.items():
            v = np.asarray(value)
            bad = int(v.size - np.isfinite(v).sum()) if v.dtype.kind == "f" else 0
            if bad:
                raise QuantizationError(f"{what} input {name!r} holds NaN or infinite values ({bad} of {v.size}): "
                                        f"int8 ranges cannot be chosen from them")
        n = len(next(iter(item.values())))
        for start in range(0, n - n % step if first.is_static else n, step):
            feeds.append({k: np.asarray(v)[start:start + step] for k, v in item.items()})
    if not feeds:
        raise QuantizationError(f"no {what} inputs")
    return feeds


# --- the rewrite -----------------------------------------------------------------------------------
@dataclass
class _Group:
    anchor: Node
    last: Node  # the anchor, or its activation

    @property
    def output(self) -> str:
        return self.last.outputs[0]


def _groups(graph: Graph) -> list[_Group]:
    uses: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    by_input = {}
    for n in graph.nodes:
        if n.inputs:
            by_input.setdefault(n.inputs[0], []).append(n)
    groups = []
    for n in graph.nodes:
        if n.op not in ANCHORS or not _quantizable(graph, n):
            continue
        last = n
        follow = by_input.get(n.outputs[0], [])
        if uses.get(n.outputs[0]) == 1 and len(follow) == 1 and follow[0].op in ACTIVATIONS \
                and n.outputs[0] not in graph.outputs:
            last = follow[0]
        groups.append(_Group(n, last))
    return groups


def _float_output(graph: Graph, grp: _Group) -> bool:
    """Does the group emit a graph output in float? A bare Gemm/MatMul (QMatMul has a float-output
    form); a conv, an add or a fused activation still requantize."""
    return grp.output in graph.outputs and grp.last is grp.anchor and grp.anchor.op in FLOAT_OUT


def _quantizable(graph: Graph, n: Node) -> bool:
    c = graph.constants
    if n.op == "Conv":
        return n.inputs[1] in c and graph.types[n.inputs[0]].rank in (3, 4) and all(i in c for i in n.inputs[2:])
    if n.op == "Gemm":
        a = n.attr
        return n.inputs[1] in c and not a["transA"] and a["alpha"] > 0 and all(i in c for i in n.inputs[2:])
    if n.op == "MatMul":
        return n.inputs[1] in c and c[n.inputs[1]].ndim == 2 and n.inputs[0] not in c
    return n.op == "Add" and not any(i in c for i in n.inputs) and \
        graph.types[n.inputs[0]].dtype is DType.F32 and graph.types[n.inputs[1]].dtype is DType.F32


def _weight(w: np.ndarray, axis: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric int8 in [-qmax, qmax] along ``axis``: (int8 weights, float32 scales)."""
    moved = np.moveaxis(w.astype(np.float64), axis, 0).reshape(w.shape[axis], -1)
    amax = np.abs(moved).max(axis=1)
    scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape).astype(np.float64)), -qmax, qmax).astype(np.int8)
    return q, scale


class _Rewriter:
    def __init__(self, graph: Graph, params: Mapping[str, tuple[float, int]], weight_max: int,
                 requantize_outputs: bool, means: Mapping[str, np.ndarray]):
        self.g, self.params, self.weight_max, self.means = graph, params, weight_max, means
        self.requantize_outputs = requantize_outputs
        self.names = Names(graph)
        self.constants = dict(graph.constants)
        self.dq_of: dict[str, str] = {}  # float value -> its quantize-dequantize twin
        self.pre: dict[str, list[Node]] = {}  # node name -> nodes to place before it
        self.post: dict[str, list[Node]] = {}  # node name -> nodes to place after it
        self.rename: dict[str, dict[str, str]] = {}  # node name -> {old input: new input}
        self.attrs: dict[str, dict[str, object]] = {}  # node name -> attributes to change

    def qdq(self, value: str, params: tuple[float, int], before: str | None, after: str | None) -> str:
        if value in self.dq_of:
            return self.dq_of[value]
        scale, zp = params
        q, d = self.names.fresh(f"{value}/q"), self.names.fresh(f"{value}/dq")
        nodes = [Node.make("QuantizeLinear", [value], [q], name=q, scale=[scale], zero_point=[zp], to=DType.U8),
                 Node.make("DequantizeLinear", [q], [d], name=d, scale=[scale], zero_point=[zp])]
        (self.post.setdefault(after, []) if after else self.pre.setdefault(before, [])).extend(nodes)
        self.dq_of[value] = d
        return d

    def const_dq(self, name: str, q: np.ndarray, scale: np.ndarray, axis: int, at: str) -> str:
        cname = self.names.fresh(f"{name}/q")
        self.constants[cname] = as_constant(q, q.dtype)
        d = self.names.fresh(f"{name}/dq")
        self.pre.setdefault(at, []).append(Node.make("DequantizeLinear", [cname], [d], name=d,
                                                     scale=[float(s) for s in scale], zero_point=[0] * scale.size,
                                                     axis=axis))
        return d

    def activation_input(self, node: Node, value: str, producers) -> str:
        prod = producers.get(value)
        return self.qdq(value, self.params[value], before=None if prod else node.name, after=prod.name if prod else None)

    def group(self, grp: _Group, producers) -> None:
        n = grp.anchor
        new_inputs = {}
        if n.op == "Add":
            for v in n.inputs:
                new_inputs[v] = self.activation_input(n, v, producers)
        else:
            x = n.inputs[0]
            new_inputs[x] = self.activation_input(n, x, producers)
            x_scale = self.params[x][0]
            w = self.constants[n.inputs[1]]
            axis = 0 if n.op == "Conv" or (n.op == "Gemm" and n.attr["transB"]) else 1
            wq, ws = _weight(w, axis, self.weight_max)
            new_inputs[n.inputs[1]] = self.const_dq(n.inputs[1], wq, ws, axis, n.name)
            if len(n.inputs) == 3:
                b = self.constants[n.inputs[2]].astype(np.float64).reshape(-1)
                if n.op == "Gemm":
                    b = b * n.attr["beta"]
                if x in self.means:
                    wd = wq.astype(np.float64) * np.expand_dims(ws, [d for d in range(w.ndim) if d != axis])
                    shift = bias_shift(w, wd, self.means[x], axis, n.attr.get("group", 1))
                    b = b - shift * (n.attr["alpha"] if n.op == "Gemm" else 1.0)
                bs = (np.float32(x_scale) * ws).astype(np.float32)
                if b.size == bs.size or b.size == 1:
                    bq = np.rint(b / bs.astype(np.float64)).astype(np.int64)
                    if np.all(np.abs(bq) < 2**31 - 1):
                        new_inputs[n.inputs[2]] = self.const_dq(n.inputs[2], bq.astype(np.int32),
                                                                np.broadcast_to(bs, bq.shape).copy(), 0, n.name)
                        if n.op == "Gemm" and n.attr["beta"] != 1.0:  # the quantized bias holds beta * b
                            self.attrs[n.name] = {"beta": 1.0}
        self.rename[n.name] = new_inputs
        if self.requantize_outputs or not _float_output(self.g, grp):
            self.qdq(grp.output, self.params[grp.output], before=None, after=grp.last.name)

    def pass_through(self, n: Node) -> None:
        x = n.inputs[0]
        if x in self.dq_of and n.outputs[0] not in self.dq_of:
            self.rename[n.name] = {x: self.dq_of[x]}
            self.qdq(n.outputs[0], self.params[x], before=None, after=n.name)

    def build(self) -> Graph:
        """Place the new nodes; every other reader of a quantized value reads its dequantized twin;
        a requantized graph output keeps its name on the twin (its float producer is renamed)."""
        inserted = {n.name for ns in (*self.pre.values(), *self.post.values()) for n in ns}
        nodes = []
        for n in self.g.nodes:
            nodes += self.pre.get(n.name, [])
            ren = self.rename.get(n.name) or ({} if n.name in inserted else self.dq_of)
            attrs = {**n.attr, **self.attrs.get(n.name, {})}
            nodes.append(n.replace(inputs=tuple(ren.get(i, i) for i in n.inputs), attrs=attrs))
            nodes += self.post.get(n.name, [])
        swap = {}
        for o in self.g.outputs:
            if o in self.dq_of:
                swap[o], swap[self.dq_of[o]] = self.names.fresh(f"{o}/float"), o
        if swap:
            nodes = [n.replace(inputs=tuple(swap.get(i, i) for i in n.inputs),
                               outputs=tuple(swap.get(o, o) for o in n.outputs)) for n in nodes]
        return dce(rebuild(self.g, nodes, self.constants))


def integer_form(graph: Graph) -> Graph:
    """A QDQ graph (``quantize``'s, or an imported one) with its patterns as integer ops; identical int8
    weights held once (an LSTM's one recurrent matrix, quantized once per time step, made the int8
    bundle 6.5x the fp32 one)."""
    return share_constants(dce(fuse_qdq(fold_constants(graph))))


def _rewrite(g: Graph, groups: Sequence[_Group], params: Mapping[str, tuple[float, int]], weight_max: int,
             requantize_outputs: bool, means: Mapping[str, np.ndarray]) -> tuple[Graph, dict[str, str]]:
    """The QDQ graph with ``groups`` quantized (every other layer float) and its dequantized twins."""
    params = dict(params)
    rw = _Rewriter(g, params, weight_max, requantize_outputs, means)
    producers = g.producers()
    by_anchor = {grp.anchor.name: grp for grp in groups}
    for n in g.nodes:
        if n.name in by_anchor:
            rw.group(by_anchor[n.name], producers)
        elif n.op in PASS_THROUGH and n.inputs[0] in rw.dq_of:
            params[n.outputs[0]] = params[n.inputs[0]]
            rw.pass_through(n)
    return rw.build(), rw.dq_of


def quantize(graph: Graph, calibration_inputs, *, method: str = DEFAULT_METHOD, percentile: float = 99.99,
             reduce_range: bool = False, requantize_outputs: bool = False,
             bias_correction: bool = DEFAULT_BIAS_CORRECTION, float_layers: Sequence[str] = (),
             sensitivity: bool = False, target_agreement: float | None = None,
             check_inputs=None) -> QuantizedModel:
    """Quantize ``graph`` to int8 from ``calibration_inputs`` (a mapping input name -> array with the
    samples along axis 0, or a sequence of such mappings); returns the QDQ graph and its report.

    ``reduce_range``: 7-bit weights (|w| <= 63), the fast form for AVX2 CPUs without VNNI; off by
    default because a bundle is target-independent and full-range weights are more accurate.
    ``requantize_outputs``: graph outputs made by a Gemm/MatMul quantized to u8 and dequantized too
    (off by default: that last layer emits float, e.g. unsaturated logits).
    ``method``: how each activation's range is calibrated (``calibration.METHODS``).
    ``bias_correction``: each Conv/Gemm bias absorbs the mean error its int8 weights add (from the
    per-channel means of its input on the calibration inputs); a layer without a bias is left as it is.
    ``float_layers``: layers (the report's names) kept in float, weights and all; their input is
    quantized only where an int8 layer reads it too. ``sensitivity``: the report gives each layer's
    cost alone (one more pass over the calibration inputs a layer).
    ``target_agreement``: keep the fewest leading layers in float (``quantize_search.py``) that give
    this top-1 agreement with the float graph on ``check_inputs`` (same form as the calibration
    inputs; default: the calibration inputs themselves). Agreement moves by whole inputs, so a target
    of 99% needs a hundred check inputs or more to mean anything, and held-out data the model was not
    trained on: a model agrees with itself more readily on its training data."""
    if method not in METHODS:
        raise QuantizationError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not 50.0 < percentile <= 100.0:
        raise QuantizationError(f"percentile must be in (50, 100], got {percentile}")
    if target_agreement is not None and not 0.0 < target_agreement <= 1.0:
        raise QuantizationError(f"target_agreement must be in (0, 1], got {target_agreement}")
    if check_inputs is not None and target_agreement is None:
        raise QuantizationError("check_inputs are for target_agreement")
    g = dce(fold_batchnorm(fold_constants(graph)))
    feeds = _batches(g, calibration_inputs)
    groups = _groups(g)
    if not groups:
        raise QuantizationError("the graph has no Conv, Gemm, MatMul or Add that int8 can run")
    unknown = sorted(set(float_layers) - {grp.anchor.name for grp in groups})
    if unknown:
        names = [grp.anchor.name for grp in groups]
        listed = ", ".join(names[:LISTED_LAYERS]) + (f" and {len(names) - LISTED_LAYERS} more (the report lists "
                                                     f"them all)" if len(names) > LISTED_LAYERS else "")
        raise QuantizationError(f"float_layers {unknown[:LISTED_LAYERS]} are not layers int8 runs here; those are "
                                f"{listed}")
    groups = [grp for grp in groups if grp.anchor.name not in float_layers]
    if not groups:
        raise QuantizationError("float_layers leaves no layer to quantize")
    watched = [v for grp in groups for v in list(grp.anchor.inputs[:1 if grp.anchor.op != "Add" else 2]) + [grp.output]]
    ranges = {v: Observer() for v in watched}
    means = {grp.anchor.inputs[0]: ChannelMean(1 if grp.anchor.op == "Conv" else -1) for grp in groups
             if bias_correction and grp.anchor.op != "Add" and len(grp.anchor.inputs) == 3}
    for values in trace(g, feeds, watched):
        for v in watched:
            ranges[v].add(values[v])
        for v, m in means.items():
            m.add(values[v])
    unbounded = [v for v, r in ranges.items() if not (math.isfinite(r.lo) and math.isfinite(r.hi))]
    if unbounded:  # an overflow inside the float model: a scale of 1 would have been signed as if it were fine
        raise QuantizationError(f"{len(unbounded)} value(s) of the model reach NaN or infinity on the calibration "
                                f"inputs (first: {unbounded[0][:80]!r}): int8 ranges cannot be chosen for them")
    params = {v: u8_params(*r.bounds(method, percentile)) for v, r in ranges.items()}
    options = (WEIGHT_MAX[bool(reduce_range)], bool(requantize_outputs), {v: m.mean for v, m in means.items()})
    search = None
    if target_agreement is not None:
        check = feeds if check_inputs is None else _batches(g, check_inputs, "check")
        search = _float_search(g, groups, params, options, check, target_agreement)
        float_layers = tuple(float_layers) + tuple(grp.anchor.name for grp in groups[:search.chosen])
        groups = groups[search.chosen:]
    qgraph, twins = _rewrite(g, groups, params, *options)
    alone = {grp.anchor.name: _rewrite(g, [grp], params, *options)[0] for grp in groups} if sensitivity else None
    how = ", ".join([f"{method} calibration" + (f" ({percentile:g}th)" if method == "percentile" else "")]
                    + (["bias correction"] if bias_correction else []))
    return QuantizedModel(qgraph, measure(g, qgraph, groups, twins, feeds, how, tuple(float_layers), alone, search))


def _float_search(g: Graph, groups: Sequence[_Group], params, options, check: list[dict[str, np.ndarray]],
                  target: float) -> FloatSearch:
    """How many leading ``groups`` to keep in float for ``target`` agreement on ``check``; at least one
    layer stays int8."""
    want = list(trace(g, check, ()))
    if not any(values[o].ndim >= 2 and values[o].shape[-1] > 1 for values in want[:1] for o in g.outputs):
        raise QuantizationError("target_agreement needs an output with classes along its last axis (top-1 agreement)")
    chosen, steps = fewest_float(len(groups) - 1, lambda k: agreement(_rewrite(g, groups[k:], params, *options)[0],
                                                                          check, want), target)
    inputs = sum(len(next(iter(f.values()))) for f in check)
    if chosen is None:
        raise QuantizationError(f"top-1 agreement {target:.1%} on {inputs} check inputs is not reached even with "
                                f"{len(groups) - 1} of {len(groups)} layers in float (best "
                                f"{max(s.agreement for s in steps):.1%}): lower the target or check the inputs")
    return FloatSearch(target, inputs, steps, chosen)
