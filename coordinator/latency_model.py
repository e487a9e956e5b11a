"""Predicted latency for devices whose latency cannot be measured (emulated ones): a cost model.

The model is compiled exactly as the device class would compile it; its object code is read for
the share of vector instructions (:mod:`cuvil.devices.isa_report`), and the graph for its work
(FLOPs, bytes of weights and activations, kernels). With the profile's fp32 lanes, clock and cores:

    cycles = c_flop * FLOPs / effective lanes / threads + c_byte * bytes + c_kernel * kernels + c_call
    effective lanes = 1 / ((1 - v) + v / lanes)      v = vector share of the object code's instructions
    predicted ms = cycles / clock

The four constants are fitted on this kind of host against native measurements of the same models
compiled for the x86 classes (``python benchmarks/latency_model.py``) and shipped as
``latency_calibration.json``; ``docs/dashboard.md`` gives the prediction's error against native
measurement. A prediction is never a measurement: it is stored and shown apart, labelled predicted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources

from ..compiler.errors import CuvilError
from ..compiler.ir.graph import Graph
from ..devices.profile import DeviceProfile

COST_TERMS = ("c_flop", "c_byte", "c_kernel", "c_call")
CALIBRATION_FILE = "latency_calibration.json"
MODEL_VERSION = "1"  # stored with every prediction: bump when the formula or its features change


class PredictionError(CuvilError):
    """No latency can be predicted for this model and profile (no clock in the profile, no code)."""


@dataclass(frozen=True)
class CodeFeatures:
    """What the cost model reads of one model compiled for one profile."""

    profile: str
    flops: float
    bytes: float
    kernels: int
    vector_share: float
    lanes: int
    clock_ghz: float
    threads: int = 1

    @property
    def effective_lanes(self) -> float:
        v = min(max(self.vector_share, 0.0), 1.0)
        return 1.0 / ((1.0 - v) + v / max(self.lanes, 1))

    def terms(self) -> tuple[float, float, float, float]:
        """The cost terms the constants multiply (cycles per unit of each)."""
        return (self.flops / self.effective_lanes / max(self.threads, 1), self.bytes, float(self.kernels), 1.0)


@dataclass(frozen=True)
class Calibration:
    c_flop: float
    c_byte: float
    c_kernel: float
    c_call: float
    host: str = ""
    note: str = ""

    def constants(self) -> tuple[float, ...]:
        return tuple(getattr(self, t) for t in COST_TERMS)


def predict_ms(features: CodeFeatures, calibration: Calibration) -> float:
    cycles = sum(c * t for c, t in zip(calibration.constants(), features.terms()))
    return cycles / (features.clock_ghz * 1e6)


def load_calibration() -> Calibration:
    data = json.loads(resources.files(__package__).joinpath(CALIBRATION_FILE).read_text())
    return Calibration(**{k: data[k] for k in (*COST_TERMS, "host", "note") if k in data})


def code_features(graph: Graph, profile: DeviceProfile, threads: int = 1) -> CodeFeatures:
    """Compile ``graph`` as ``profile`` would (batch 1) and read the cost model's inputs off it."""
    from ..compiler.analysis import summarize
    from ..compiler.codegen.lower import lower
    from ..devices.isa_report import IsaReportError, from_assembly, from_object
    from ..edge_runtime import jit

    if profile.clock_ghz is None:
        raise PredictionError(f"profile {profile.name} gives no clock_ghz: no latency can be predicted for it")
    target = profile.target()
    low = lower(graph, target, 1)
    try:
        isa = from_object(jit.emit_object(low.llvm_ir, target), target.triple)
    except IsaReportError:
        isa = from_assembly(jit.emit_assembly(low.llvm_ir, target), profile.arch)
    vector = sum(isa.counts.values()) - isa["SSE"]  # scalar float on x86 runs in xmm registers: not vector work
    summary = summarize(graph, 1)
    return CodeFeatures(profile.name, float(summary.flops), float(summary.weight_bytes + low.arena_bytes),
                        int(low.kernel_count), vector / isa.total if isa.total else 0.0, profile.lanes_f32,
                        profile.clock_ghz, max(1, min(threads, profile.cores)))


def predict_graph(graph: Graph, profile_name: str) -> tuple[float, dict[str, object]]:
    """(predicted ms, its basis) for ``graph`` on the shipped profile ``profile_name``."""
    from ..devices import resolve_profile

    calibration = load_calibration()
    features = code_features(graph, resolve_profile(profile_name))
    return predict_ms(features, calibration), basis(features, calibration)


def fit(samples: Sequence[tuple[CodeFeatures, float]]) -> Calibration:
    """Non-negative constants minimising the squared *relative* error of (features, measured ms) pairs."""
    from scipy.optimize import nnls

    rows, rhs = [], []
    for feats, measured_ms in samples:
        cycles = measured_ms * feats.clock_ghz * 1e6
        rows.append([t / cycles for t in feats.terms()])
        rhs.append(1.0)
    import numpy as np

    a = np.asarray(rows)
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)  # columns of similar size for the solver
    solution, _ = nnls(a / scale, np.asarray(rhs))
    return Calibration(*(float(x) for x in solution / scale))


def relative_errors(samples: Sequence[tuple[CodeFeatures, float]], calibration: Calibration) -> list[float]:
    """(predicted - measured) / measured for each pair."""
    return [predict_ms(f, calibration) / m - 1.0 for f, m in samples]


def summary(errors: Sequence[float]) -> Mapping[str, float]:
    """Median and worst absolute relative error, and the geometric-mean ratio predicted / measured."""
    if not errors:
        return {}
    absolute = sorted(abs(e) for e in errors)
    mid = len(absolute) // 2
    median = absolute[mid] if len(absolute) % 2 else (absolute[mid - 1] + absolute[mid]) / 2
    geo = math.exp(sum(math.log(max(1 + e, 1e-9)) for e in errors) / len(errors))
    return {"median_abs": median, "max_abs": absolute[-1], "geomean_ratio": geo, "n": float(len(errors))}


def basis(features: CodeFeatures, calibration: Calibration) -> dict[str, object]:
    """What a stored prediction was made from (kept beside it in the results database)."""
    return {"features": asdict(features), "calibration": asdict(calibration)}
