"""Cold compile and fresh-process warm start of the model zoo, the way a device meets them.

Each model is exported as a signed bundle (a throwaway key) and loaded back verified; the cold
compile (empty cache, in this process) keys the cache by the bundle's hash, as the device does.
Warm start is then measured in new processes (``python -c``), so nothing of the cold compile is
still in memory: from ``compile_graph`` (cache hit) to the first ``Session.run`` result. Python
start-up, imports and the bundle's signature check (``load(lazy=True)``: its signed head; the
weights are never read on a hit) come before the clock starts and are printed apart. ``--graph``
also times the bare-Graph path, whose key hashes the whole graph and weights.

    python benchmarks/warm_start.py [--models resnet18,mlp] [--repeats 5] [--graph] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = """
import sys, time
t0 = time.perf_counter()
import cuvil  # first, as in a device's own process: numpy's BLAS keeps to one thread (cuvil/__init__.py)
import numpy as np
from cuvil.edge_runtime.compile import compile_graph, compile_model
from cuvil.edge_runtime.loader import load
imports = time.perf_counter() - t0
bundle, pub, npz, cache, by_hash = sys.argv[1:6]
model = load(bundle, [pub], lazy=by_hash == "1")
feeds = dict(np.load(npz))
t0 = time.perf_counter()
sess = compile_model(model, cache_dir=cache) if by_hash == "1" else compile_graph(model.graph, cache_dir=cache)
sess.run(feeds)
warm = time.perf_counter() - t0
s = sess.stats
print(int(s.cache_hit), warm * 1e3, s.cache_ms, s.load_ms, imports * 1e3)
"""


def fresh_warm_start(bundle: Path, pub: Path, npz: Path, cache: Path, by_hash: bool = True) -> dict:
    """One warm start in a new interpreter; raises if it was not a cache hit."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", CHILD, str(bundle), str(pub), str(npz), str(cache), str(int(by_hash))],
                         capture_output=True, text=True, env=env, check=True).stdout.split()
    hit, warm, cache_ms, load_ms, imports = int(out[0]), *map(float, out[1:])
    if not hit:
        raise RuntimeError(f"warm start of {bundle.name} missed the cache")
    return {"warm_ms": warm, "cache_ms": cache_ms, "load_ms": load_ms, "imports_ms": imports}


def prepare(graph, feeds: dict[str, np.ndarray], workdir: Path):
    """Signed bundle, public key and inputs for the children; returns (model, bundle, pub, npz)."""
    from cuvil import api

    keys = api.keygen(workdir / "keys", "bench")
    bundle = workdir / f"{graph.name or 'model'}.cuvil"
    api.export(graph, bundle, keys.private_path)
    np.savez(workdir / "feeds.npz", **feeds)
    return api.load(bundle, [keys.public_path]), bundle, keys.public_path, workdir / "feeds.npz"


def measure(graph, feeds: dict[str, np.ndarray], repeats: int = 5, bare_graph: bool = False):
    """Cold compile (s, empty cache, by bundle hash) and median fresh-process warm start (ms);
    returns (results, the cold session: the same code, for latency runs)."""
    from cuvil.edge_runtime.cache import finish_writes
    from cuvil.edge_runtime.compile import compile_graph

    with tempfile.TemporaryDirectory(prefix="cuvil-warm-") as tmp:
        work = Path(tmp)
        model, bundle, pub, npz = prepare(graph, feeds, work)
        cache = work / "cache"
        t0 = time.perf_counter()
        cold = compile_graph(model.graph, cache_dir=cache, content_hash=model.content_hash)
        cold.run(feeds)
        res = {"cold_compile_s": time.perf_counter() - t0, "cold_lower_ms": cold.stats.lower_ms,
               "cold_llvm_ms": cold.stats.llvm_ms}
        finish_writes()  # the entry, written behind the compile, is there for the fresh processes
        runs = [fresh_warm_start(bundle, pub, npz, cache) for _ in range(repeats)]
        for key in runs[0]:
            res[key] = float(np.median([r[key] for r in runs]))
        res["warm_ms_max"] = max(r["warm_ms"] for r in runs)
        if bare_graph:
            compile_graph(model.graph, cache_dir=cache)  # populate the Graph-keyed entry
            finish_writes()
            res["graph_warm_ms"] = float(np.median([fresh_warm_start(bundle, pub, npz, cache, False)["warm_ms"]
                                                    for _ in range(repeats)]))
    return res, cold


def main() -> None:
    from cuvil.compiler.frontends.torch import import_torch

    from tests.zoo import ZOO

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--graph", action="store_true", help="also time the bare-Graph key (hashes the weights)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    for name in args.models.split(","):
        module, example = ZOO[name]()
        graph = import_torch(module, example)
        got, _ = measure(graph, {n: t.numpy() for n, t in zip(graph.inputs, example)}, args.repeats, args.graph)
        res = {"model": name, **got}
        extra = f", bare Graph {res['graph_warm_ms']:.1f} ms" if args.graph else ""
        print(f"{name:17s} cold {res['cold_compile_s']:.2f} s (lower {res['cold_lower_ms']:.0f} ms, "
              f"LLVM {res['cold_llvm_ms']:.0f} ms) | warm {res['warm_ms']:.1f} ms median, {res['warm_ms_max']:.1f} max "
              f"(key+read {res['cache_ms']:.1f}, load {res['load_ms']:.1f}; imports before {res['imports_ms']:.0f} ms){extra}",
              flush=True)
        results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
