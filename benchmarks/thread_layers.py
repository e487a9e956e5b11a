"""Where threads gain or lose, layer by layer: each node's fewest cycles at 1 thread, at N threads,
and at N threads with the workers joined (the caller runs every part: what splitting alone costs).

The fewest cycles over many runs is a node's own cost even on a shared machine (other work only
adds cycles); a split layer whose N-thread minimum stays at its 1-thread cost never ran beside a
worker, which is what a machine without a free core shows. A depthwise conv that joined its
producer's job is counted in the producer's row (its cycles at N threads are the job's). The last
column says how each layer runs at N threads: its parts, joined to its producer's job, or (a conv) why it
stays whole (too few multiply-adds for two parts worth a handoff, one vector of output channels, ...). ``--sync-us`` sets the handoff the cost model assumes (what the tuner would measure
here; default the profile's); ``--set`` other tuning fields, as ``tuning_ab.py`` takes them. The load average
is printed before and after.

    python benchmarks/thread_layers.py [--model resnet18] [--threads 2] [--runs 50] [--top 25] [--sync-us 2]
        [--set 'winograd_row_split_channels=0']
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cuvil.compiler.codegen.cpu.kernels.conv import geometry  # noqa: E402
from cuvil.compiler.codegen.cpu.kernels.base import KernelKey  # noqa: E402
from cuvil.compiler.codegen.cpu.kernels.split import SPLITTERS, decide_split  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.compiler.ir.infer import bind_batch  # noqa: E402
from cuvil.compiler.passes.pipeline import optimize  # noqa: E402
from cuvil.edge_runtime.compile import resolve  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.archs import ARCHS, UNSUPPORTED  # noqa: E402
from tests.zoo import ZOO  # noqa: E402
from cuvil.compiler.tuning import parse_overrides  # noqa: E402


def how_split(graph, target) -> dict[str, str]:
    """Node -> its parts at ``target.threads`` by the cost model (a conv: or why it stays whole), for
    every node a splitter takes (the optimized graph's names); a node that joins its producer's job is
    marked in the table from the cycles."""
    g = bind_batch(optimize(graph), 1)
    found = {}
    for node in g.nodes:
        splitter = SPLITTERS.get(node.op)
        if splitter is None:
            continue
        packed = tuple("const" if i in g.constants else None for i in node.inputs)
        key = KernelKey(node.op, node.attrs, tuple(g.types[i] for i in node.inputs),
                        tuple(g.types[o] for o in node.outputs), (), (), packed)
        geo = geometry(key) if node.op in ("Conv", "FusedConv") and packed[1:2] == ("const",) else None
        if geo is not None:
            geom = (*geo["in_shape"], geo["w_shape"][0], *geo["w_shape"][2:], geo["strides"], geo["pads"],
                    geo["dilations"], geo["group"])
            ranges, why = decide_split(target, geom)
            found[node.name] = (f"{len(ranges)} parts" + (" if right after a job" if ranges[0].after_job_only else "")
                                if ranges else why)
        elif (parts := splitter(key, target)) is not None:
            found[node.name] = f"{len(parts)} parts"
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", choices=sorted(ZOO) + sorted(set(ARCHS) - set(UNSUPPORTED)),
                    help="a zoo model or a torch-importable one of tests/archs.py")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sync-us", type=float, help="the handoff the cost model assumes, in microseconds")
    ap.add_argument("--set", default="", help="tuning fields for every column: 'FIELD=VALUE [FIELD=VALUE ...]'")
    args = ap.parse_args()
    try:
        fields = parse_overrides(args.set.split())
    except ValueError as e:
        raise SystemExit(f"thread_layers: {e}") from None
    torch.manual_seed(0)
    module, example = ZOO[args.model]() if args.model in ZOO else ARCHS[args.model]()[:2]
    graph = import_torch(module.eval(), example)
    feeds = {n: t.numpy() for n, t in zip(graph.inputs, example)}
    host = resolve("host")
    if args.sync_us is not None:
        fields["parallel_sync_us"] = args.sync_us
    host = dataclasses.replace(host, tuning=host.tuning.replace(**fields))
    one = compile_graph(graph, host, threads=1, tune=False, profile=True)
    many = compile_graph(graph, host, threads=args.threads, tune=False, profile=True)
    solo = compile_graph(graph, host, threads=args.threads, tune=False, profile=True, use_cache=False)
    split = how_split(graph, dataclasses.replace(host, threads=args.threads))
    solo.close()  # joined: the caller runs every part
    for s in (one, many, solo):
        s.run(feeds)
    load0 = os.getloadavg()
    cols = {"1t": one.node_cycles(args.runs, feeds), f"{args.threads}t": many.node_cycles(args.runs, feeds),
            f"{args.threads}t solo": solo.node_cycles(args.runs, feeds)}
    print(f"{describe_host()}; {args.model}; {many.lowered.split_nodes} layers split; load {load0[0]:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; fewest cycles of {args.runs} runs (thousands)")
    many_t = f"{args.threads}t"
    base, label = {}, {}
    for name, cyc in cols["1t"].items():  # a layer that joined its producer's job is counted in its producer's row
        if cols[many_t][name] == 0 and name in split and base:
            prev = next(reversed(base))
            base[prev] = {k: base[prev][k] + v[name] for k, v in cols.items()}
            label[prev] += f" + {name} (joined)"
        else:
            base[name] = {k: v[name] for k, v in cols.items()}
            label[name] = split.get(name, "")
    print(f"{'node':28s} " + " ".join(f"{k:>10s}" for k in cols) + f"  gain   split cost  at {args.threads} threads")
    total = {k: sum(v.values()) for k, v in cols.items()}
    for name in sorted(base, key=lambda n: -base[n]["1t"])[:args.top] + ["(all)"]:
        row = total if name == "(all)" else base[name]
        print(f"{name:28s} " + " ".join(f"{row[k] / 1e3:10.1f}" for k in cols)
              + f"  {row['1t'] / max(1, row[many_t]):.2f}x  {row[f'{many_t} solo'] / max(1, row['1t']):.2f}x"
              + f"       {label.get(name, '')}")

if __name__ == "__main__":
    main()
