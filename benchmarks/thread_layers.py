"""Where threads gain or lose, layer by layer: each node's fewest cycles at 1 thread, at N threads,
and at N threads with the workers joined (the caller runs every part: what splitting alone costs).

The fewest cycles over many runs is a node's own cost even on a shared machine (other work only
adds cycles); a split layer whose N-thread minimum stays at its 1-thread cost never ran beside a
worker, which is what a machine without a free core shows. A depthwise conv that joined its
producer's job shows no cycles of its own at N threads: they are in the producer's row. The load
average is printed before and after.

    python benchmarks/thread_layers.py [--model resnet18] [--threads 2] [--runs 50] [--top 25]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.zoo import ZOO  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", choices=sorted(ZOO))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    torch.manual_seed(0)
    module, example = ZOO[args.model]()
    graph = import_torch(module.eval(), example)
    feeds = {n: t.numpy() for n, t in zip(graph.inputs, example)}
    one = compile_graph(graph, threads=1, tune=False, profile=True)
    many = compile_graph(graph, threads=args.threads, tune=False, profile=True)
    solo = compile_graph(graph, threads=args.threads, tune=False, profile=True, use_cache=False)
    solo.close()  # joined: the caller runs every part
    for s in (one, many, solo):
        s.run(feeds)
    load0 = os.getloadavg()
    cols = {"1t": one.node_cycles(args.runs), f"{args.threads}t": many.node_cycles(args.runs),
            f"{args.threads}t solo": solo.node_cycles(args.runs)}
    print(f"{describe_host()}; {args.model}; {many.lowered.split_nodes} layers split; load {load0[0]:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; fewest cycles of {args.runs} runs (thousands)")
    base = cols["1t"]
    print(f"{'node':28s} " + " ".join(f"{k:>10s}" for k in cols) + "  gain   split cost")
    total = {k: sum(v.values()) for k, v in cols.items()}
    for name in sorted(base, key=lambda n: -base[n])[:args.top] + ["(all)"]:
        row = total if name == "(all)" else {k: v[name] for k, v in cols.items()}
        print(f"{name:28s} " + " ".join(f"{row[k] / 1e3:10.1f}" for k in cols)
              + f"  {row['1t'] / max(1, row[f'{args.threads}t']):.2f}x  {row[f'{args.threads}t solo'] / max(1, row['1t']):.2f}x")


if __name__ == "__main__":
    main()
