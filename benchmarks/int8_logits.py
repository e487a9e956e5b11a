"""Float logits against requantized ones: what leaving the last layer's output in float costs in time.

Per model: Cuvil's own quantization (``tests/int8_zoo.py``: 32 calibration inputs) in its default
form (the graph outputs float: the last QMatMul's float-output form) and with
``requantize_outputs=True`` (the last QMatMul requantizes to u8, a DequantizeLinear follows), both
compiled for ``--target``, batch 1, one thread, timed interleaved (``int8_bench.time_interleaved``).
Printed: the medians of wall and thread-CPU time, float / requantized, and whether each compiled
output equals its int8 reference interpreter exactly. ``int8_accuracy.py`` gives the accuracy.

    python benchmarks/int8_logits.py [--models mlp,small_cnn] [--target host|x86-avx2] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from int8_bench import time_interleaved  # noqa: E402  (this folder is on sys.path)
from cuvil.compiler.interpreter import run_reference  # noqa: E402
from cuvil.compiler.quantize import integer_form, quantize  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.int8_zoo import CALIBRATION, int8_model  # noqa: E402
from tests.qdq import draws  # noqa: E402


def row(name: str, target: str, rounds: int, block: int) -> str:
    m = int8_model(name)
    calib = {m.fp32.inputs[0]: np.stack(draws(m.shape, CALIBRATION, 100))}
    forms = {"float": m.int8, "requant": integer_form(quantize(m.fp32, calib, requantize_outputs=True).graph)}
    x = m.inputs(1, seed=7)
    runners, exact = {}, []
    for key, g in forms.items():
        sess = compile_graph(g, target=target, batch=1, threads=1, use_cache=False)
        feeds = {g.inputs[0]: x}
        exact.append(bool(np.array_equal(sess.run(feeds)[g.outputs[0]], run_reference(g, feeds)[g.outputs[0]])))
        runners[key] = lambda s=sess, f=feeds: s.run(f)
    wall, cpu = time_interleaved(runners, rounds, block)
    w = {k: float(np.median(v)) for k, v in wall.items()}
    c = {k: float(np.median(v)) for k, v in cpu.items()}
    return (f"{name:13} {w['float']:9.4f} {w['requant']:9.4f} {w['float'] / w['requant']:6.3f} "
            f"{c['float']:9.4f} {c['requant']:9.4f} {c['float'] / c['requant']:6.3f}  {exact[0]!s:>5} {exact[1]!s:>5}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,small_cnn")
    ap.add_argument("--target", default="host")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=50)
    args = ap.parse_args()
    print(f"{describe_host()}; target {args.target}; batch 1, 1 thread; medians of {args.rounds} interleaved "
          f"rounds of {args.block}; load {os.getloadavg()[0]:.2f}")
    print(f"{'model':13} {'float ms':>9} {'requ. ms':>9} {'ratio':>6} {'cpu float':>9} {'cpu requ.':>9} {'ratio':>6}"
          f"  exact (float, requ.)")
    for name in args.models.split(","):
        print(row(name, args.target, args.rounds, args.block), flush=True)


if __name__ == "__main__":
    main()
