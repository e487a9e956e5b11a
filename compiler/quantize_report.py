"""The report of post-training quantization: how far each int8 layer and the output are from fp32.

Per quantized layer: the relative RMS error and SQNR of its output in the int8 (QDQ) graph against
the float graph on the calibration inputs (which accumulates the error of every layer before it),
and, when asked (``sensitivity``), the output's relative RMS error with that layer alone in int8
and every other in float: the layer that costs most is the one to keep in float
(``quantize(float_layers=...)``), and the layers kept in float are listed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .interpreter import run_reference
from .ir.graph import Graph
from .quantize_search import FloatSearch


@dataclass(frozen=True)
class LayerError:
    node: str
    op: str
    rel_rms: float  # ||int8 - fp32|| / ||fp32|| of the layer's output
    sqnr_db: float
    alone_rel_rms: float | None = None  # the graph output's rel. RMS with only this layer in int8


@dataclass(frozen=True)
class QuantizationReport:
    method: str  # the calibration method, and "bias correction" where it was on
    layers: tuple[LayerError, ...]
    top1_agreement: float  # fraction of calibration inputs whose argmax is unchanged
    output_rel_rms: float
    float_layers: tuple[str, ...] = ()  # layers kept in float
    float_search: FloatSearch | None = None  # how ``target_agreement`` chose the leading float layers

    def format(self) -> str:
        alone = any(e.alone_rel_rms is not None for e in self.layers)
        lines = [f"{'layer':40} {'op':7} {'rel. RMS':>9} {'SQNR dB':>8}" + (f" {'alone':>9}" if alone else "")]
        lines += [f"{e.node[:40]:40} {e.op:7} {e.rel_rms:9.4f} {e.sqnr_db:8.1f}"
                  + (f" {e.alone_rel_rms:9.4f}" if e.alone_rel_rms is not None else "") for e in self.layers]
        if alone:
            worst = max((e for e in self.layers if e.alone_rel_rms is not None), key=lambda e: e.alone_rel_rms)
            lines.append(f"alone: the output's rel. RMS with only that layer in int8; costs most: {worst.node}")
        if self.float_layers:
            lines.append(f"kept in float: {', '.join(self.float_layers)}")
        if self.float_search is not None:
            lines.append(self.float_search.format())
        lines.append(f"output: rel. RMS {self.output_rel_rms:.4f}, top-1 agreement {self.top1_agreement:.1%} "
                     f"({self.method})")
        return "\n".join(lines)


def trace(graph: Graph, feeds: Iterable[Mapping[str, np.ndarray]], names: Sequence[str]):
    """Run the reference interpreter and yield each feed's values of ``names``."""
    wanted = [n for n in dict.fromkeys(names) if n not in graph.constants]
    g = graph.replace(outputs=tuple(dict.fromkeys(list(graph.outputs) + wanted)))
    for feed in feeds:
        yield run_reference(g, feed)


def _top1(want: np.ndarray, got: np.ndarray) -> tuple[int, int]:
    """(inputs whose argmax over the last axis is unchanged, inputs); (0, 0) for an output with no
    class axis."""
    if want.ndim < 2:
        return 0, 0
    return int((want.argmax(-1) == got.argmax(-1)).sum()), want.reshape(-1, want.shape[-1]).shape[0]


def agreement(q: Graph, feeds: Sequence[Mapping[str, np.ndarray]],
              want: Sequence[Mapping[str, np.ndarray]]) -> float:
    """Top-1 agreement of ``q``'s outputs for ``feeds`` with ``want`` (the float graph's for them)."""
    agree = total = 0
    for values, ref in zip(trace(q, feeds, ()), want):
        for o in ref:
            a, t = _top1(ref[o], values[o])
            agree, total = agree + a, total + t
    return agree / total if total else 1.0


def _rel(err_and_signal: Sequence[float]) -> float:
    e, s = err_and_signal
    return math.sqrt(e / s) if s else 0.0


def _output_error(g: Graph, q: Graph, feeds) -> float:
    """The outputs' relative RMS error of ``q`` against ``g``."""
    total = [0.0, 0.0]
    for values, want in zip(trace(q, feeds, ()), trace(g, feeds, ())):
        for o in g.outputs:
            f, d = want[o].astype(np.float64), values[o].astype(np.float64)
            total[0] += float(((d - f) ** 2).sum())
            total[1] += float((f ** 2).sum())
    return _rel(total)


def measure(g: Graph, q: Graph, groups, twins: Mapping[str, str], feeds, method: str,
            float_layers: Sequence[str] = (), alone: Mapping[str, Graph] | None = None,
            float_search: FloatSearch | None = None) -> QuantizationReport:
    """Each quantized layer's output error, int8 (QDQ graph ``q``) against float (``g``), over the
    calibration inputs; ``alone`` maps a layer to the graph where it alone is int8."""
    def int8_name(grp) -> str | None:  # a graph output keeps its name (on its dequantized twin if requantized)
        name = grp.output if grp.output in g.outputs else twins.get(grp.output)
        return name if name in q.types else None

    names = [n for n in map(int8_name, groups) if n]
    layer_err: dict[str, list[float]] = {}
    agree, total, out_err = 0, 0, [0.0, 0.0]
    floats = trace(g, feeds, [grp.output for grp in groups])
    for values, want in zip(trace(q, feeds, names), floats):
        for grp in groups:
            t = int8_name(grp)
            if t in values:
                f, d = want[grp.output].astype(np.float64), values[t].astype(np.float64)
                acc = layer_err.setdefault(grp.anchor.name, [0.0, 0.0])
                acc[0] += float(((d - f) ** 2).sum())
                acc[1] += float((f ** 2).sum())
        for o in g.outputs:
            f, d = want[o].astype(np.float64), values[o].astype(np.float64)
            out_err[0] += float(((d - f) ** 2).sum())
            out_err[1] += float((f ** 2).sum())
            a, t = _top1(f, d)
            agree, total = agree + a, total + t
    alone = alone or {}
    layers = []
    for grp in groups:
        if grp.anchor.name in layer_err:
            e, s = layer_err[grp.anchor.name]
            solo = alone.get(grp.anchor.name)
            layers.append(LayerError(grp.anchor.name, grp.anchor.op, _rel((e, s)),
                                     10 * math.log10(s / e) if e else math.inf,
                                     _output_error(g, solo, feeds) if solo is not None else None))
    return QuantizationReport(method, tuple(layers), agree / total if total else 1.0, _rel(out_err),
                              tuple(float_layers), float_search)
