"""What 7-bit weights (``reduce_range``) cost in accuracy against full-range int8, on the zoo.

Per model: Cuvil's own quantization (32 calibration inputs) with full-range weights (|w| <= 127)
and with 7-bit ones (|w| <= 63), both compiled; 1,000 evaluation inputs drawn like the calibration
data (``tests/int8_zoo.py``). Printed: each form's top-1 agreement with fp32 (the issue's goal:
>= 99%), the largest and the mean absolute output error against fp32 (in the output's units and as
a share of the fp32 outputs' standard deviation), the 7-bit form's largest error over the full-range
one's, and whether each compiled int8 output equals its int8 reference interpreter exactly (first
inputs). Not a timing benchmark: ``int8_bench.py --reduce-range`` times the 7-bit form.

    python benchmarks/int8_accuracy.py [--models mlp,small_cnn,resnet18,mobilenet_v2] [--count 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cuvil.compiler.interpreter import run_reference  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.int8_zoo import CNN_AND_MLP, int8_model  # noqa: E402

BATCH, SEED, CHECKED = 100, 7, 4


def outputs(graph, xs: np.ndarray, target: str, exact_check: bool) -> tuple[np.ndarray, bool]:
    """``graph``'s compiled outputs for ``xs`` (in batches) and whether the first ones equal the reference."""
    sess = compile_graph(graph, target=target, batch=BATCH, use_cache=False)
    name, out = graph.inputs[0], graph.outputs[0]
    ys = np.concatenate([sess.run({name: xs[i:i + BATCH]})[out] for i in range(0, len(xs), BATCH)])
    exact = not exact_check or np.array_equal(ys[:CHECKED], run_reference(graph, {name: xs[:CHECKED]})[out])
    return ys, bool(exact)


def compare(name: str, count: int, target: str) -> str:
    full, seven = int8_model(name), int8_model(name, reduce_range=True)
    xs = full.inputs(count, seed=SEED)
    ref, _ = outputs(full.fp32, xs, target, exact_check=False)
    spread = float(ref.std()) or 1.0
    cells, worst = [], []
    for m in (full, seven):
        ys, exact = outputs(m.int8, xs, target, exact_check=True)
        err = np.abs(ys.astype(np.float64) - ref)
        agree = float((ys.argmax(-1) == ref.argmax(-1)).mean())
        worst.append(float(err.max()))
        cells.append(f"{agree:7.1%} {err.max():8.4f} {err.max() / spread:6.3f} {err.mean():8.4f} {str(exact):>5}")
    ratio = worst[1] / worst[0] if worst[0] else float("inf")
    return f"{name:13} | {cells[0]} | {cells[1]} | {ratio:6.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(CNN_AND_MLP))
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--target", default="host")
    args = ap.parse_args()
    print(f"{describe_host()}; target {args.target}; {args.count} inputs; errors against Cuvil fp32 "
          f"(max/std: the largest error over the fp32 outputs' standard deviation)")
    head = f"{'top-1':>7} {'max err':>8} {'/std':>6} {'mean err':>8} {'exact':>5}"
    print(f"{'':13} | {'full-range weights':^38} | {'7-bit weights (reduce_range)':^38} | 7-bit max err")
    print(f"{'model':13} | {head} | {head} | / full")
    for name in args.models.split(","):
        print(compare(name, args.count, args.target), flush=True)


if __name__ == "__main__":
    main()
