"""The whole GPU check in one command (well under 5 minutes): every zoo model on the GPU, from PTX
built for Jetson Orin (sm_87) and Jetson Xavier (sm_72), against the reference interpreter.

    python benchmarks/gpu_check.py [--iterations 50] [--only mlp,resnet18] [--arch sm_87]

Per model and architecture it prints compile + load time, the largest absolute and relative
difference from the reference (and whether it is within rtol 1e-4, atol 1e-5), and the latency of
one whole-model run (median and p90 of ``--iterations`` runs, kernels + synchronize, inputs already
on the device). The PTX is JIT-compiled by the driver for the GPU at hand, so on a non-Jetson GPU
the latency is that GPU's, not a Jetson's. Exit status 1 if any output is off, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.zoo from a source checkout

from cuvil.compiler import run_reference  # noqa: E402
from cuvil.edge_runtime.cuda import CudaModel, CudaUnavailable, gpu_available  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
PROFILES = {"sm_87": "jetson-orin", "sm_72": "jetson-xavier"}


def check(name: str, graph, example, profile: str, iterations: int) -> bool:
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(tuple(x.shape)).astype(np.float32) for n, x in zip(graph.inputs, example)}
    want = run_reference(graph, feeds)
    with CudaModel(graph, profile) as gpu:
        got = gpu.run(feeds)
        ok, worst_abs, worst_rel = True, 0.0, 0.0
        for out in graph.outputs:
            diff = np.abs(got[out].astype(np.float64) - want[out])
            worst_abs = max(worst_abs, float(diff.max(initial=0.0)))
            worst_rel = max(worst_rel, float((diff / (np.abs(want[out]) + 1e-12)).max(initial=0.0)))
            ok &= bool(np.allclose(got[out], want[out], rtol=RTOL, atol=ATOL))
        times = sorted(gpu.latency_ms(iterations))
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
        print(f"{name:17s} {gpu.program.target.cpu:6s} {len(gpu.program.launches):4d} launches  "
              f"compile {gpu.compile_ms:7.0f} ms  load {gpu.load_ms:6.0f} ms  "
              f"max|d| {worst_abs:.2e}  max rel {worst_rel:.2e}  {'OK ' if ok else 'OFF'}  "
              f"latency median {statistics.median(times):8.3f} ms  p90 {p90:8.3f} ms", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--only", default="", help="comma-separated zoo model names (default: all)")
    ap.add_argument("--arch", choices=sorted(PROFILES), action="append", help="default: both")
    args = ap.parse_args()
    if not gpu_available():
        print("no NVIDIA GPU / libcuda here: nothing to check", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    import torch

    from cuvil.compiler.frontends.torch import import_torch
    from tests.zoo import ZOO

    names = [n for n in args.only.split(",") if n] or list(ZOO)
    t0 = time.perf_counter()
    ok = True
    try:
        for name in names:
            model, example = ZOO[name]()
            with torch.no_grad():
                graph = import_torch(model, example)
            for arch in args.arch or sorted(PROFILES, reverse=True):
                ok &= check(name, graph, example, PROFILES[arch], args.iterations)
    except CudaUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'all outputs match the reference' if ok else 'SOME OUTPUTS DIFFER'}; "
          f"total {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
