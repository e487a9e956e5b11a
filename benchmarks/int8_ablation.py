"""Which quantization point costs the zoo's int8 models their top-1 agreement with fp32.

Per model: Cuvil's QDQ graph (32 calibration inputs, ``tests/int8_zoo.py``) run by the reference
interpreter on 1,000 evaluation inputs drawn alike, in forms where one quantization point at a time
is quantized and every other stays fp32 (an activation's QuantizeLinear/DequantizeLinear pair, or a
weight or bias with its original fp32 values), then the whole graph, then the whole graph without the
output's requantization (the logits left in float) where the graph still requantizes it (cuvil.quantize
leaves a Gemm/MatMul output float unless ``requantize_outputs=True``). Printed: top-1 agreement with fp32 and the
largest absolute output error of each form. Not a timing benchmark.

    python benchmarks/int8_ablation.py [--models mlp,small_cnn] [--count 1000]
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
from cuvil.compiler.ir.graph import Graph, Node  # noqa: E402
from cuvil.compiler.passes.rewrite import rebuild  # noqa: E402
from tests.int8_zoo import int8_model  # noqa: E402

BATCH, SEED = 100, 7
QDQ = ("QuantizeLinear", "DequantizeLinear")


def floated(q: Graph, fp32: Graph, keep) -> Graph:
    """``q`` with every QDQ node not kept by ``keep`` made an Identity: an activation passes in float,
    a constant weight or bias reads its fp32 original (named as in ``fp32``, the suffix ``/q`` off)."""
    nodes, consts = [], dict(q.constants)
    for n in q.nodes:
        if n.op not in QDQ or keep(n):
            nodes.append(n)
            continue
        src = n.inputs[0]
        if src in q.constants:
            src = f"{src}/fp32"
            consts[src] = np.asarray(fp32.constants[n.inputs[0][:-2]], np.float32)
        nodes.append(Node.make("Identity", [src], list(n.outputs), name=n.name))
    return rebuild(q, nodes, consts)


def run(g: Graph, xs: np.ndarray) -> np.ndarray:
    return np.concatenate([run_reference(g, {g.inputs[0]: xs[i:i + BATCH]})[g.outputs[0]]
                           for i in range(0, len(xs), BATCH)])


def points(q: Graph) -> list[tuple[str, frozenset[str]]]:
    """Each quantization point: (label, the names of its QDQ nodes)."""
    found = []
    for n in q.nodes:
        if n.op == "QuantizeLinear":
            dqs = [d.name for d in q.nodes if d.op == "DequantizeLinear" and d.inputs[0] == n.outputs[0]]
            found.append((f"activation {n.inputs[0]}", frozenset([n.name, *dqs])))
        elif n.op == "DequantizeLinear" and n.inputs[0] in q.constants:
            found.append((f"constant {n.inputs[0][:-2]}", frozenset([n.name])))
    return found


def ablate(name: str, count: int) -> None:
    m = int8_model(name)
    fp32, q = m.fp32, m.qdq
    xs = m.inputs(count, seed=SEED)
    ref = run(fp32, xs)
    top = np.sort(ref, -1)
    print(f"{name}: fp32 logits std {ref.std():.4f}, median top-1/top-2 gap {np.median(top[:, -1] - top[:, -2]):.4f}")

    def row(label: str, g: Graph) -> None:
        ys = run(g, xs)
        print(f"  {label[:56]:56} top-1 {float((ys.argmax(-1) == ref.argmax(-1)).mean()):7.1%} "
              f"max err {float(np.abs(ys - ref).max()):.4f}", flush=True)

    pts = points(q)
    out_point = next((names for label, names in pts if label.startswith("activation") and
                      any(n.outputs[0] == q.outputs[0] for n in q.nodes if n.name in names)), None)
    for label, names in pts:
        row(f"only {label}", floated(q, fp32, lambda n, names=names: n.name in names))
    if out_point is None:
        row("whole graph (its output already float)", q)
        return
    row("whole graph", q)
    row("whole graph, output not requantized", floated(q, fp32, lambda n: n.name not in out_point))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,small_cnn")
    ap.add_argument("--count", type=int, default=1000)
    args = ap.parse_args()
    for name in args.models.split(","):
        ablate(name, args.count)


if __name__ == "__main__":
    main()
