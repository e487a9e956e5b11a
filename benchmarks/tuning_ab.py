"""One model under several ``Tuning`` settings, interleaved in one process: median latency and arena.

Why: a tuning field's default is a measured choice, and on a shared host only runs interleaved in one
process compare (the host's speed moves by up to 2x within minutes). Each ``--set`` is one variant,
``FIELD=VALUE`` pairs separated by spaces, each checked as a profile's ``[tuning]`` table is; the
profile's own tuning is always timed too. Compiles untuned (the cost model decides), so a variant changes only what
its fields decide. ``--model``: a zoo or ``tests/archs.py`` model, or ``CxH`` for one 3x3 conv of C
channels on an HxH image (padding 1, ReLU). ``--joined`` (with ``--threads N``): each variant's split
build with its workers joined, every part on the caller, against the model built for one thread (first):
what a split build kept with its workers off costs (``split_check.keeps_built``).

    python benchmarks/tuning_ab.py --model unet --set 'winograd_block_bytes=4194304 winograd_block_weight_ratio=0.0'
        [--threads 2] [--rounds 25] [--target x86-avx2]
    python benchmarks/tuning_ab.py --model shufflenet_v2 --threads 2 --joined --set parallel_sync_us=1
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.compiler.tuning import parse_overrides  # noqa: E402
from cuvil.devices.detect import resolve_target  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from cold_compile import build as build_model  # noqa: E402  (this folder is on sys.path)
from tests.zoo import export_onnx  # noqa: E402


def build(name: str):
    """(torch module, example inputs): one 3x3 conv ``CxH``, else a zoo or sweep model (``cold_compile.build``)."""
    if "x" in name and name.split("x")[0].isdigit():
        c, h = (int(v) for v in name.split("x"))
        return torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU()).eval(), (torch.randn(1, c, h, h),)
    return build_model(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--set", action="append", default=[], help="a variant: 'FIELD=VALUE [FIELD=VALUE ...]'")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--target", default="host")
    ap.add_argument("--joined", action="store_true", help="time the split builds joined, against the 1-thread build")
    args = ap.parse_args()
    module, example = build(args.model)
    graph = import_onnx(export_onnx(module, example))
    feeds = {n: t.numpy() for n, t in zip(graph.inputs, example)}
    base = resolve_target(args.target)
    print(f"{describe_host()}; target {base.name}; {args.threads} thread(s)", flush=True)
    sessions = {}
    try:
        variants = {text: parse_overrides(text.split()) for text in ["", *args.set]}
    except ValueError as e:
        raise SystemExit(f"tuning_ab: {e}") from None
    for text, fields in variants.items():
        target = dataclasses.replace(base, tuning=base.tuning.replace(**fields))
        sessions[text or "profile's own"] = compile_graph(graph, target=target, cache_dir=tempfile.mkdtemp(),
                                                          tune=False, threads=args.threads)
    if args.joined and args.threads > 1:  # each variant's split build joined, against the 1-thread build first
        joined = {f"{k}: {s.lowered.split_nodes} layers split, workers joined": s for k, s in sessions.items()}
        sessions = {"profile's own": compile_graph(graph, target=base, cache_dir=tempfile.mkdtemp(), tune=False,
                                                   threads=1), **joined}
        for s in joined.values():
            s.set_workers(False)
    medians = {k: [] for k in sessions}
    for _ in range(args.rounds):
        for k, s in sessions.items():
            for _ in range(3):
                s.run(feeds)
            runs = []
            for _ in range(10):
                t0 = time.perf_counter()
                s.run(feeds)
                runs.append(time.perf_counter() - t0)
            medians[k].append(statistics.median(runs))
    first = statistics.median(medians["profile's own"])
    for k, s in sessions.items():
        m = statistics.median(medians[k])
        print(f"{args.model} {k:60s} {m * 1e3:8.3f} ms  {m / first:5.2f}x  arena {s.lowered.arena_bytes / 2**20:6.2f} MiB")


if __name__ == "__main__":
    main()
