"""Cuvil int8 vs ONNX Runtime int8 vs Cuvil fp32 on the zoo (and the sweep's architectures): batch 1,
one thread (``--threads N``: every runtime at N, and Cuvil int8 at one thread beside them), interleaved.

The int8 model is ONNX Runtime's own static QDQ quantization (per-channel int8 weights, uint8
activations, 16 calibration inputs drawn like the example input); Cuvil imports that same QDQ file.
``--reduce-range``: 7-bit weights (``quantize_static(reduce_range=True)``), the form that lets AVX2
without VNNI use ``vpmaddubsw`` (and that ONNX Runtime advises there); both runtimes run it.
ONNX Runtime runs with its default options: on x86 without VNNI its full-range uint8 x int8 products
saturate (``vpmaddubsw``), the fastest and least exact way it has; Cuvil's int8 is exact there.
Printed first: the CPU, the target and ONNX Runtime's version; per model: medians of the interleaved runs, the ratios the int8 goals are about (Cuvil
int8 / ORT int8, Cuvil fp32 / Cuvil int8), the bundle sizes (int8 / fp32), and whether Cuvil's
int8 output equals its int8 reference interpreter exactly.

Times are wall clock and the calling thread's CPU time (every runtime runs on the calling thread at
one thread). On a loaded machine wall-clock medians move with the load from run to run (ratios
near 1 flip); CPU time leaves out the time the thread was descheduled, so the ``cpu`` ratios are
the ones to compare across runs at one thread. At N threads the CPU columns count the calling thread
only, so the wall-clock ratios are the ones to read; each block starts once the threads of the block
before stopped spinning (``zoo_bench.settle``).

``--models`` takes zoo names (``tests/zoo.py``) and architectures of the sweep (``tests/archs.py``:
models beyond the zoo, quantized the same way); a model that does not import, quantize or compile
gets a one-line row naming the error.

    python benchmarks/int8_bench.py [--models mlp,small_cnn,resnet18,mobilenet_v2] [--target host|x86-avx2]
                                    [--rounds 20] [--block 20] [--profile K] [--reduce-range]
                                    [--against FIELD=VALUE] [--threads N]
    python benchmarks/int8_bench.py --models mobilenet_v1,shufflenet_v2,kws_dscnn,squeezenet --rounds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cuvil.compiler.bundle.writer import bundle_bytes as signed_bundle  # noqa: E402
from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.compiler.interpreter import run_reference  # noqa: E402
from cuvil.compiler.passes.pipeline import optimize  # noqa: E402
from cuvil.compiler.quantize import integer_form  # noqa: E402
from cuvil.compiler.tuning import parse_override  # noqa: E402
from cuvil.devices.detect import resolve_target  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.qdq import ort_session, qdq_model  # noqa: E402
from tests.archs import ARCHS  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

MODELS = ZOO | {k: v for k, v in ARCHS.items() if k not in ZOO}


def time_interleaved(runners: dict, rounds: int, block: int, settled: bool = False) -> tuple[dict, dict]:
    """Wall and thread-CPU ms per inference, one sample per block, runners in turn each round
    (``settled``: each block after the threads of the one before stopped spinning)."""
    from zoo_bench import settle  # this folder is on sys.path when run as a script

    wall: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    for fn in runners.values():
        fn()
    for _ in range(rounds):
        for key, fn in runners.items():
            if settled:
                settle()
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            for _ in range(block):
                fn()
            cpu[key].append((time.thread_time_ns() - c0) / 1e6 / block)
            wall[key].append((time.perf_counter_ns() - w0) / 1e6 / block)
    return wall, cpu


def bundle_bytes(graph) -> int:
    """A signed bundle's size: for int8, of the graph in integer form (what ``cuvil import --int8`` signs,
    the weights int8), not of what a device's compile pipeline makes of it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return len(signed_bundle(graph, Ed25519PrivateKey.generate()))


def profile_rows(q8, feeds: dict, qdq, target: str, top: int, runs: int = 50) -> list[str]:
    """The ``top`` int8 nodes with the most cycles (fewest over ``runs``, as a share of the median
    run) beside ONNX Runtime's own time for the same QDQ node (its profile names it ``<node>_token_N``)."""
    from arch_sweep import ort_node_us  # this folder is on sys.path when run as a script

    sess = compile_graph(q8, target=target, threads=1, profile=True, use_cache=False)
    sess.run(feeds)
    cycles = sess.node_cycles(runs, feeds)
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        sess.run(feeds)  # not run_raw: the arena's stale bytes in the float input hold denormals
        walls.append((time.perf_counter_ns() - t0) / 1e3)
    us_per_cycle = float(np.median(walls)) / max(1, sum(cycles.values()))
    theirs: dict[str, float] = {}
    for k, v in ort_node_us(qdq, list(feeds.values()), runs).items():
        node = re.sub(r"_token_\d+$", "", k)
        theirs[node] = theirs.get(node, 0.0) + v
    out = [f"    {'cuvil us':>8} {'ORT us':>7}  node (median {float(np.median(walls)):.0f} us; ORT's profile sums to "
           f"{sum(theirs.values()):.0f} us)"]
    for name, c in sorted(cycles.items(), key=lambda kv: -kv[1])[:top]:
        ort_us = f"{theirs[name]:7.1f}" if name in theirs else f"{'-':>7}"
        out.append(f"    {c * us_per_cycle:8.1f} {ort_us}  {name}")
    return out


def against_target(target: str, against: str | None):
    """``target`` with one tuning field changed (``FIELD=VALUE``), or None without ``against``."""
    if not against:
        return None
    base = resolve_target(target)
    return dataclasses.replace(base, tuning=base.tuning.replace(**parse_override(against)))


def bench(name: str, target: str, rounds: int, block: int, top: int = 0, reduce_range: bool = False,
          against=None, threads: int = 1) -> dict:
    model, example = MODELS[name]()
    f32_onnx, qdq = qdq_model(model, example, reduce_range=reduce_range)
    x = example[0].numpy()
    batch = x.shape[0]  # bound at import: a recurrent or attention model builds batch-sized constants
    f32 = optimize(import_onnx(f32_onnx, batch_size=batch))
    imported = import_onnx(qdq, batch_size=batch)
    q8 = optimize(imported)
    feeds = {f32.inputs[0]: x}
    s32 = compile_graph(f32, target=target, threads=threads)  # a profile's default is its cores: 8 for x86-avx2
    s8 = compile_graph(q8, target=target, threads=threads)
    exact = bool(np.array_equal(s8.run(feeds)[q8.outputs[0]], run_reference(q8, feeds)[q8.outputs[0]]))
    ort8 = ort_session(qdq, threads, exact_int8=False)  # its default, the fastest it runs (saturating without VNNI)
    ort_feeds = {qdq.graph.input[0].name: x}
    runners = {"cuvil_int8": lambda: s8.run(feeds), "ort_int8": lambda: ort8.run(None, ort_feeds),
               "cuvil_fp32": lambda: s32.run(feeds)}
    if against is not None:
        s8b = compile_graph(q8, target=against, threads=threads)
        runners["against"] = lambda: s8b.run(feeds)
    if threads > 1:
        s8_one = compile_graph(q8, target=target, threads=1)
        runners["int8_1t"] = lambda: s8_one.run(feeds)
    wall, cpu = time_interleaved(runners, rounds, block, settled=threads > 1)
    med = {k: float(np.median(v)) for k, v in wall.items()}
    cmed = {k: float(np.median(v)) for k, v in cpu.items()}
    return {"model": name, **med, "int8/ort": med["cuvil_int8"] / med["ort_int8"],
            "fp32/int8": med["cuvil_fp32"] / med["cuvil_int8"], "cpu": cmed,
            "cpu int8/ort": cmed["cuvil_int8"] / cmed["ort_int8"], "cpu fp32/int8": cmed["cuvil_fp32"] / cmed["cuvil_int8"],
            "bundle int8/fp32": bundle_bytes(integer_form(imported)) / bundle_bytes(f32), "exact": exact,
            "profile": profile_rows(q8, feeds, qdq, target, top) if top else [],
            "split": s8.lowered.split_nodes, "speedup": med["int8_1t"] / med["cuvil_int8"] if threads > 1 else 1.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,small_cnn,resnet18,mobilenet_v2")
    ap.add_argument("--target", default="host")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0, metavar="K", help="per model, the K int8 nodes with the most cycles beside ORT's")
    ap.add_argument("--reduce-range", action="store_true", help="7-bit weights (ONNX Runtime's reduce_range) in the int8 model")
    ap.add_argument("--threads", type=int, default=1, help="threads for every runtime (Cuvil int8 also runs at 1)")
    ap.add_argument("--against", metavar="FIELD=VALUE", help="also time the int8 model compiled with this tuning field "
                    "set (e.g. int8_direct_min_width=0), interleaved with the others")
    args = ap.parse_args()
    other = against_target(args.target, args.against)
    import onnxruntime

    print(f"{describe_host()}; target {args.target}; ONNX Runtime {onnxruntime.__version__}; {args.threads} thread(s), batch 1; "
          f"{'7-bit (reduce_range)' if args.reduce_range else 'full-range'} int8 weights")
    print(f"{'model':14} {'cuvil int8 ms':>13} {'ort int8 ms':>11} {'cuvil fp32 ms':>13} {'int8/ort':>8} "
          f"{'fp32/int8':>9} | {'cpu: int8':>9} {'ort':>6} {'fp32':>6} {'int8/ort':>8} {'fp32/int8':>9} | {'bundle':>7} exact")
    for name in args.models.split(","):
        try:
            r = bench(name, args.target, args.rounds, args.block, args.profile, args.reduce_range, other, args.threads)
        except Exception as e:  # a model beyond the zoo may not quantize or compile: its row says why
            print(f"{name:14} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        print(f"{name:14} {r['cuvil_int8']:13.3f} {r['ort_int8']:11.3f} {r['cuvil_fp32']:13.3f} {r['int8/ort']:8.2f} "
              f"{r['fp32/int8']:9.2f} | {r['cpu']['cuvil_int8']:9.3f} {r['cpu']['ort_int8']:6.3f} {r['cpu']['cuvil_fp32']:6.3f} "
              f"{r['cpu int8/ort']:8.2f} {r['cpu fp32/int8']:9.2f} | {r['bundle int8/fp32']:7.3f} {r['exact']}", flush=True)
        if args.threads > 1:
            print(f"{'':14} int8 at {args.threads} threads {r['speedup']:.2f}x its 1-thread speed "
                  f"({r['int8_1t']:.3f} ms), {r['split']} layers split", flush=True)
        if other is not None:
            print(f"{'':14} {r['against']:13.3f} with {args.against}: int8/ort {r['against'] / r['ort_int8']:.2f}, cpu "
                  f"{r['cpu']['against']:.3f} ms, {r['cpu']['against'] / r['cpu']['ort_int8']:.2f}", flush=True)
        if r["profile"]:
            print("\n".join(r["profile"]), flush=True)


if __name__ == "__main__":
    main()
