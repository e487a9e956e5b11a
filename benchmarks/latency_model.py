"""Calibrate the latency cost model against native measurements, and say how far it is from them.

Compiles each model for ``x86-avx2`` and ``x86-avx512`` (both run natively on an AVX-512 host),
measures them interleaved, reads the cost model's features, then:

- leave-one-model-out: fit on the other models, predict this one (both classes);
- across vector widths: fit on one x86 class only, predict the other (what predicting an ARM class
  from x86 measurements asks of the model);
- fit on everything and (with ``--write``) store the constants in
  ``coordinator/latency_calibration.json``.

Usage: ``python benchmarks/latency_model.py [--write] [--models mlp,small_cnn,...]``. Needs torch
(the zoo) and scipy; prints one line per model and the error summary.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuvil.compiler.ir.infer import bind_batch  # noqa: E402
from cuvil.coordinator import latency_model as lm  # noqa: E402
from cuvil.devices import load_profile  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph, runnable_here  # noqa: E402
from cuvil.edge_runtime.latency import measure  # noqa: E402

PROFILES = ("x86-avx2", "x86-avx512")
DEFAULT_MODELS = ("digits_mlp", "digits_cnn", "mlp", "small_cnn", "tiny_transformer", "mobilenet_v2", "resnet18")


def _graph(name: str):
    from cuvil import api

    if name == "digits_mlp":
        from tests.coordinator.fleet_helpers import digits_mlp

        return digits_mlp()
    import torch

    if name == "digits_cnn":
        from cuvil.coordinator.fleet import digits
        from cuvil.demo import train_cnn

        x, y = digits("train")
        return api.import_model(train_cnn(x, y, 1, 8), torch.zeros(1, 1, 8, 8))
    from tests import zoo

    model, inputs = zoo.ZOO[name]()
    return api.import_model(model, *inputs)


def _host() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    mhz = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("cpu MHz")), "?")
    import llvmlite.binding as llvm

    return f"{cpu} ({llvm.get_host_cpu_name()}, {mhz} MHz, {platform.machine()})"


def host_clock_ghz() -> float:
    return float(next(ln.split(":", 1)[1] for ln in open("/proc/cpuinfo") if ln.startswith("cpu MHz"))) / 1000


def measure_pair(graph, repeats: int = 5) -> dict[str, float]:
    """Median latency per profile, interleaved runs, the lowest of ``repeats`` medians (least disturbed)."""
    sessions = {}
    for name in PROFILES:
        sessions[name] = compile_graph(graph, load_profile(name).target(), 1)
    (in_name,) = graph.inputs[:1]
    shape = tuple(int(d) for d in bind_batch(graph, 1).input_types[in_name].shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for s in sessions.values():
        s.run({in_name: x})
    best = {n: float("inf") for n in PROFILES}
    for _ in range(repeats):
        for n, s in sessions.items():
            best[n] = min(best[n], measure(s.run_raw, warmup=5, runs=200, budget_s=0.4).p50_ms)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--write", action="store_true", help="store the fitted constants in the package")
    args = ap.parse_args()
    if not all(runnable_here(load_profile(p).target()) for p in PROFILES):
        sys.exit("this host cannot run both x86 classes natively (AVX-512 needed): calibrate on one that can")
    clock = host_clock_ghz()
    samples: dict[str, list[tuple[lm.CodeFeatures, float]]] = {}
    for name in args.models.split(","):
        t0 = time.perf_counter()
        graph = _graph(name)
        measured = measure_pair(graph)
        pairs = []
        for p in PROFILES:
            feats = lm.code_features(graph, load_profile(p))
            feats = lm.CodeFeatures(**{**feats.__dict__, "clock_ghz": clock})  # measured at the host's clock
            pairs.append((feats, measured[p]))
        samples[name] = pairs
        print(f"{name:18s} " + "  ".join(f"{f.profile} {m * 1e3:9.1f} µs (v={f.vector_share:.2f}, "
                                          f"{f.flops / 1e6:.2f} MFLOP)" for f, m in pairs)
              + f"  [{time.perf_counter() - t0:.0f} s]", flush=True)
    report = {}
    loo: dict[str, list[float]] = {p: [] for p in PROFILES}
    for name in samples:
        cal = lm.fit([s for other, ss in samples.items() if other != name for s in ss])
        for (f, m), e in zip(samples[name], lm.relative_errors(samples[name], cal)):
            loo[f.profile].append(e)
    for p in PROFILES:
        report[f"leave-one-model-out {p}"] = lm.summary(loo[p])
    for train, test in (PROFILES, PROFILES[::-1]):
        cal = lm.fit([s for ss in samples.values() for s in ss if s[0].profile == train])
        errs = lm.relative_errors([s for ss in samples.values() for s in ss if s[0].profile == test], cal)
        report[f"fit on {train}, predict {test}"] = lm.summary(errs)
    cal = lm.fit([s for ss in samples.values() for s in ss])
    for what, s in report.items():
        print(f"{what:42s} median |error| {s['median_abs']:.0%}  worst {s['max_abs']:.0%}  "
              f"predicted/measured (geomean) {s['geomean_ratio']:.2f}  ({int(s['n'])} models)")
    print("constants:", {t: f"{getattr(cal, t):.4g}" for t in lm.COST_TERMS})
    if args.write:
        out = ROOT / "coordinator" / lm.CALIBRATION_FILE
        data = {**{t: getattr(cal, t) for t in lm.COST_TERMS}, "host": _host(),
                "note": f"fitted by benchmarks/latency_model.py on {', '.join(samples)}",
                "errors": report}
        out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
