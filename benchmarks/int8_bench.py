"""Cuvil int8 vs ONNX Runtime int8 vs Cuvil fp32 on the zoo: batch 1, one thread, interleaved.

The int8 model is ONNX Runtime's own static QDQ quantization (per-channel int8 weights, uint8
activations, 16 calibration inputs drawn like the example input); Cuvil imports that same QDQ file.
Printed first: the CPU, the target and ONNX Runtime's version; per model: medians of the interleaved runs, the ratios the int8 goals are about (Cuvil
int8 / ORT int8, Cuvil fp32 / Cuvil int8), the bundle sizes (int8 / fp32), and whether Cuvil's
int8 output equals its int8 reference interpreter exactly.

    python benchmarks/int8_bench.py [--models mlp,small_cnn,resnet18,mobilenet_v2] [--target host|x86-avx2]
                                    [--rounds 20] [--block 20]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cuvil.compiler.bundle.writer import bundle_bytes as signed_bundle  # noqa: E402
from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.compiler.interpreter import run_reference  # noqa: E402
from cuvil.compiler.passes.pipeline import optimize  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.qdq import ort_session, qdq_model  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from zoo_bench import time_interleaved  # noqa: E402  (this folder is on sys.path)


def bundle_bytes(graph) -> int:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return len(signed_bundle(graph, Ed25519PrivateKey.generate()))


def bench(name: str, target: str, rounds: int, block: int) -> dict:
    model, example = ZOO[name]()
    f32_onnx, qdq = qdq_model(model, example)
    f32 = optimize(import_onnx(f32_onnx))
    q8 = optimize(import_onnx(qdq))
    x = example[0].numpy()
    feeds = {f32.inputs[0]: x}
    s32 = compile_graph(f32, target=target, threads=1)  # a profile's default is its cores: 8 for x86-avx2
    s8 = compile_graph(q8, target=target, threads=1)
    exact = bool(np.array_equal(s8.run(feeds)[q8.outputs[0]], run_reference(q8, feeds)[q8.outputs[0]]))
    ort8 = ort_session(qdq)
    ort_feeds = {qdq.graph.input[0].name: x}
    runners = {"cuvil_int8": lambda: s8.run(feeds), "ort_int8": lambda: ort8.run(None, ort_feeds),
               "cuvil_fp32": lambda: s32.run(feeds)}
    med = {k: float(np.median(v)) for k, v in time_interleaved(runners, rounds, block).items()}
    return {"model": name, **med, "int8/ort": med["cuvil_int8"] / med["ort_int8"],
            "fp32/int8": med["cuvil_fp32"] / med["cuvil_int8"], "bundle int8/fp32": bundle_bytes(q8) / bundle_bytes(f32),
            "exact": exact}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,small_cnn,resnet18,mobilenet_v2")
    ap.add_argument("--target", default="host")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=20)
    args = ap.parse_args()
    import onnxruntime

    print(f"{describe_host()}; target {args.target}; ONNX Runtime {onnxruntime.__version__}; 1 thread, batch 1")
    print(f"{'model':14} {'cuvil int8 ms':>13} {'ort int8 ms':>11} {'cuvil fp32 ms':>13} {'int8/ort':>8} "
          f"{'fp32/int8':>9} {'bundle':>7} exact")
    for name in args.models.split(","):
        r = bench(name, args.target, args.rounds, args.block)
        print(f"{name:14} {r['cuvil_int8']:13.3f} {r['ort_int8']:11.3f} {r['cuvil_fp32']:13.3f} {r['int8/ort']:8.2f} "
              f"{r['fp32/int8']:9.2f} {r['bundle int8/fp32']:7.3f} {r['exact']}", flush=True)


if __name__ == "__main__":
    main()
