"""Cuvil vs ONNX Runtime on architectures beyond the zoo (``tests/archs.py``): batch 1, fp32, one thread
(``--threads N``: both at N, Cuvil at one thread beside them).

Why: the compile path is judged on models nobody tuned for, so this finds, per architecture, an
import or compile failure (its one-line error), outputs outside rtol 1e-4 / atol 1e-5 of ONNX
Runtime, or a latency above 1.5x ONNX Runtime's, and marks the row FAIL. Each model is exported to
ONNX and imported from that export (what a user hands over); where the ONNX import is unsupported
the torch frontend is tried as well, in a row of its own. Timing is interleaved like ``zoo_bench``:
Cuvil and ORT each run ``--block`` inferences in turn for ``--rounds`` rounds; medians over all, and
("unpreempted") over the inferences the scheduler did not interrupt, which shared cores disturb less.
``--profile K`` prints, for every slow or wrong row (``--profile-all``: every row), the K nodes with
the most cycles, their shapes and conv method, beside ORT's own profile of the same node.

``--target PROFILE`` compiles Cuvil's side for a device profile whose code runs here: ``x86-avx2`` on
an AVX-512 host stands in for an AVX2 host's row (on Zen 4, whose 512-bit units are two 256-bit halves,
ONNX Runtime's AVX-512 kernels have the FLOPs of its AVX2 ones). The first line names the host.

``--threads N`` compiles Cuvil's side for N threads (and once more for one, timed beside it) and gives
ONNX Runtime N intra-op threads; the table adds Cuvil's 1-thread time, its speed-up and the layers
split, and each block starts once the threads of the one before stopped spinning
(``zoo_bench.settle``). A model slower at N threads than at one is marked FAIL (slower).

Timing runs share the machine, so run it under the benchmark lock:

    flock /tmp/pf/bench.lock python benchmarks/arch_sweep.py [--models vgg_small,squeezenet] [--rounds 20]
        [--block 10] [--frontends onnx,torch] [--profile 12 [--profile-all]] [--size 32] [--target x86-avx2]
        [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

import cuvil  # noqa: E402
from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.archs import ARCHS  # noqa: E402
from tests.zoo import export_onnx  # noqa: E402
from zoo_bench import time_block, time_interleaved  # noqa: E402  (this folder is on sys.path)

RTOL, ATOL, MAX_RATIO = 1e-4, 1e-5, 1.5
MIN_SPEEDUP = 0.95  # at N threads a model must not run slower than this share of its 1-thread speed (noise aside)


def ort_session(proto, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def random_like(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """Fresh values of ``x``'s shape and dtype: normal floats, or integers in the example's range (token ids)."""
    if x.dtype.kind == "f":
        return rng.standard_normal(x.shape).astype(x.dtype)
    return rng.integers(int(x.min()), int(x.max()) + 1, x.shape).astype(x.dtype)


def errors(got: np.ndarray, ref: np.ndarray) -> dict:
    """Max abs and rel error, and the worst |d| / (atol + rtol |ref|): at most 1 means allclose passes."""
    if got.shape != ref.shape:
        return {"max_abs_err": float("inf"), "max_rel_err": float("inf"), "tol_used": float("inf"), "close": False}
    d = np.abs(got.astype(np.float64) - ref)
    nz = np.abs(ref) > 0
    return {"max_abs_err": float(d.max()), "max_rel_err": float((d[nz] / np.abs(ref[nz])).max()) if nz.any() else 0.0,
            "tol_used": float((d / (ATOL + RTOL * np.abs(ref))).max()),
            "close": bool(np.allclose(got, ref, rtol=RTOL, atol=ATOL))}


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def import_graph(frontend: str, proto, module, example):
    return import_onnx(proto) if frontend == "onnx" else import_torch(module, example)


def bench_row(name: str, frontend: str, module, example, proto, rounds: int, block: int, target: str = "host",
              threads: int = 1) -> dict:
    """One (architecture, frontend): import, cold compile for ``target``, error vs ORT, interleaved medians."""
    row: dict = {"model": name, "frontend": frontend, "_target": target, "threads": threads}
    rng = np.random.default_rng(1234)  # not the export's inputs: a baked-in activation would show
    inputs = [random_like(rng, x.numpy()) for x in example]
    stage = "import"
    try:
        t0 = time.perf_counter()
        graph = import_graph(frontend, proto, module, example)
        stage, t1 = "compile", time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cuvil-arch-") as cache:  # cold: an empty cache
            sess = cuvil.compile(graph, target=target, cache_dir=cache, threads=threads)  # the default: the cores
            stage, t2 = "run", time.perf_counter()
            feeds = dict(zip(graph.inputs, inputs))
            got = sess.run(feeds)[graph.outputs[0]]
            if threads > 1:  # compiled again in the same directory, as on a device: its tuning record is shared
                one = cuvil.compile(graph, target=target, cache_dir=cache, threads=1)
                if one.run(feeds)[graph.outputs[0]].tobytes() != got.tobytes():
                    raise RuntimeError(f"the output at {threads} threads differs from the output at 1")
            cuvil.finish_writes()  # the entries written behind the compiles, before the directory goes
    except Exception as e:  # a non-Cuvil type here is itself a finding: one_line names the type
        return row | {"error": one_line(e), "stage": stage}
    # ORT's session runs only now: its threads spin after a run, and at 2 threads they held the cores through
    # Cuvil's compile-time split check, which then kept models whole that fresh compiles split (Zen 4, 2026-12-06)
    ort_sess = ort_session(proto, threads)
    ort_feeds = {i.name: x for i, x in zip(ort_sess.get_inputs(), inputs)}
    ref = ort_sess.run(None, ort_feeds)[0]
    row.update(import_s=t1 - t0, compile_s=t2 - t1, _graph=graph, _proto=proto, _inputs=inputs)
    row.update(errors(got, ref))
    runners = {"cuvil": lambda: sess.run(feeds), "onnxruntime": lambda: ort_sess.run(None, ort_feeds)}
    if threads > 1:
        runners["cuvil_1t"] = lambda: one.run(feeds)
        row["split"] = sess.lowered.split_nodes
    samples, preempted = time_interleaved(runners, rounds, block, settled=threads > 1)
    for key, xs in samples.items():
        row[f"{key}_median_ms"] = float(np.median(xs))
        kept = [x for x, hit in zip(xs, preempted[key]) if not hit]
        row[f"{key}_unpreempted_median_ms"] = float(np.median(kept)) if kept else float("nan")
    row["ratio_vs_ort"] = row["cuvil_median_ms"] / row["onnxruntime_median_ms"]
    # on shared cores: the calls no other process's work interrupted (zoo_bench.time_block), alike for both
    row["unpreempted_ratio_vs_ort"] = row["cuvil_unpreempted_median_ms"] / row["onnxruntime_unpreempted_median_ms"]
    if threads > 1:
        row["speedup"] = row["cuvil_1t_median_ms"] / row["cuvil_median_ms"]
    return row


def verdict(r: dict) -> str:
    if "error" in r:
        return f"FAIL ({r['stage']})"
    bad = (["wrong"] if not r["close"] else []) + (["slow"] if r["ratio_vs_ort"] > MAX_RATIO else [])
    bad += ["slower than 1 thread"] if r.get("speedup", 1.0) < MIN_SPEEDUP else []
    return f"FAIL ({', '.join(bad)})" if bad else "ok"


def conv_method(node, graph, target: str = "host") -> str:
    """The conv plan the lowering picks for this node (diagnosis only: '' when it cannot tell)."""
    try:
        from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
        from cuvil.devices.detect import resolve_target

        xs, ws, a = graph.types[node.inputs[0]].shape, graph.types[node.inputs[1]].shape, dict(node.attrs)
        if len(xs) == 3:
            xs, ws = (xs[0], xs[1], 1, xs[2]), (ws[0], ws[1], 1, ws[2])
            a = {"strides": (1, *a["strides"]), "pads": (0, a["pads"][0], 0, a["pads"][1]),
                 "dilations": (1, *a["dilations"]), "group": a["group"]}
        p = conv_plan(resolve_target(target), *xs, ws[0], *ws[2:], tuple(a["strides"]), tuple(a["pads"]),
                      tuple(a["dilations"]), a["group"])
        return p.method
    except Exception:  # private API that other work is changing; the profile still stands without it
        return ""


def ort_node_us(proto, inputs: list[np.ndarray], runs: int) -> dict[str, float]:
    """ORT's own per-node profile: median microseconds per node. Its NCHWc rewrite names a node
    ``<output>_nchwc``: the output of the ONNX node, or of the activation fused into it, which is
    what Cuvil's fused node outputs; ORT's time for nodes it did not fuse is not counted there."""
    sess_dir = tempfile.mkdtemp(prefix="cuvil-ortprof-")
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.enable_profiling, so.profile_file_prefix = True, os.path.join(sess_dir, "ort")
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    durs: dict[str, list[float]] = {}
    for e in json.loads(Path(path).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durs.setdefault(e["name"][:-len("_kernel_time")].removesuffix("_nchwc"), []).append(e["dur"])
    shutil.rmtree(sess_dir, ignore_errors=True)
    return {k: float(np.median(v)) for k, v in durs.items()}


def profile_rows(r: dict, runs: int = 50, top: int = 12) -> list[str]:
    """Per-node microseconds (share of the nodes' fewest cycles x the fastest run) with shapes, the largest first,
    beside ORT's time for the same node where its profile has one (onnx rows)."""
    from cuvil.compiler.ir.infer import bind_batch
    from cuvil.compiler.passes.pipeline import optimize
    from cuvil.edge_runtime.compile import compile_graph

    graph = r["_graph"]
    sess = compile_graph(graph, target=r["_target"], use_cache=False, profile=True, threads=1)
    feeds = dict(zip(graph.inputs, r["_inputs"]))
    sess.run(feeds)
    time_block(sess.run_raw, 20)
    med_us = float(np.min(time_block(sess.run_raw, runs))) * 1e3
    cycles = sess.node_cycles(runs, feeds)  # each node's fewest: on a shared host others' work only adds cycles
    share = {k: v / (sum(cycles.values()) or 1) for k, v in cycles.items()}
    theirs = ort_node_us(r["_proto"], r["_inputs"], runs) if r["frontend"] == "onnx" else {}
    og = bind_batch(optimize(graph), 1)
    nodes = {n.name: n for n in og.nodes}
    ort_total = f"; ORT's profile sums to {sum(theirs.values()) / 1e3:.3f} ms" if theirs else ""
    out = [f"    fastest run {med_us / 1e3:.3f} ms (profiled build){ort_total}",
           f"    {'cuvil us':>8s} {'share':>6s} {'ORT us':>7s}  op / node / input shapes"]
    for name, v in sorted(share.items(), key=lambda kv: -kv[1])[:top]:
        n = nodes[name]
        ort_us = next((theirs[k] for k in (name, f"{name}_output_0", *n.outputs) if k in theirs), None)
        shapes = " ".join(str(og.types[i].shape) for i in n.inputs[:2])
        a = dict(n.attrs)
        extra = ""
        if n.op in ("Conv", "FusedConv"):
            extra = (f" k={og.types[n.inputs[1]].shape[2:]} s={a['strides']} d={a['dilations']} g={a['group']}"
                     f" -> {og.types[n.outputs[0]].shape} [{conv_method(n, og, r['_target'])}]")
        ort_s = f"{ort_us:7.0f}" if ort_us is not None else f"{'-':>7s}"
        out.append(f"    {v * med_us:8.0f} {v * 100:5.1f}% {ort_s}  {n.op} {name[:32]} {shapes}{extra}")
    return out


def table(rows: list[dict]) -> str:
    threaded = any(r.get("threads", 1) > 1 for r in rows)
    head = ("model", "frontend", "cuvil ms", "ORT ms", "cuvil/ORT", "unpreempted", "max abs", "max rel", "compile s",
            *(("cuvil 1t ms", "speed-up", "split") if threaded else ()), "verdict")
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([r["model"], r["frontend"], *["-"] * (len(head) - 3), f"{verdict(r)} {r['error']}"])
            continue
        more = [f"{r['cuvil_1t_median_ms']:.3f}", f"{r['speedup']:.2f}", str(r["split"])] if threaded else []
        cells.append([r["model"], r["frontend"], f"{r['cuvil_median_ms']:.3f}", f"{r['onnxruntime_median_ms']:.3f}",
                      f"{r['ratio_vs_ort']:.2f}", f"{r['unpreempted_ratio_vs_ort']:.2f}", f"{r['max_abs_err']:.1e}",
                      f"{r['max_rel_err']:.1e}", f"{r['compile_s']:.1f}", *more, verdict(r)])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head[:-1])] + [0]
    fmt = lambda cs: " | ".join(c.ljust(w) for c, w in zip(cs, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), "-+-".join("-" * (w or 7) for w in widths), *(fmt(c) for c in cells)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ARCHS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--frontends", default="onnx", help="comma list of onnx,torch (torch is added where onnx is unsupported)")
    ap.add_argument("--profile", type=int, default=0, metavar="K", help="top-K node profile of each slow or wrong row")
    ap.add_argument("--profile-all", action="store_true", help="--profile every row that compiled, not only failures")
    ap.add_argument("--size", type=int, help="input side for the image models that take one (default: each model's own)")
    ap.add_argument("--target", default="host", help="device profile Cuvil compiles for (its code must run here): "
                    "x86-avx2 on an AVX-512 host approximates an AVX2 host's row")
    ap.add_argument("--threads", type=int, default=1, help="threads for both runtimes (Cuvil also runs at 1)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{describe_host()}; target {args.target}; ONNX Runtime {ort.__version__}; {args.threads} thread(s), batch 1",
          flush=True)
    rows = []
    for name in args.models.split(","):
        sized = args.size and "size" in inspect.signature(ARCHS[name]).parameters
        module, example = ARCHS[name](**({"size": args.size} if sized else {}))
        proto = export_onnx(module, example, None)
        frontends = args.frontends.split(",")
        for fe in frontends:  # grows by "torch" when the ONNX import is unsupported
            print(f"{name} ({fe}) ...", file=sys.stderr, flush=True)
            rows.append(bench_row(name, fe, module, example, proto, args.rounds, args.block, args.target, args.threads))
            if fe == "onnx" and rows[-1].get("stage") == "import" and "torch" not in frontends:
                frontends.append("torch")
    print(table(rows))
    if args.profile:
        for r in rows:
            if "error" not in r and (args.profile_all or verdict(r) != "ok"):
                print(f"\n{r['model']} ({r['frontend']}): {verdict(r)}, cuvil/ORT {r['ratio_vs_ort']:.2f}")
                print("\n".join(profile_rows(r, top=args.profile)))
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], indent=2))


if __name__ == "__main__":
    main()
