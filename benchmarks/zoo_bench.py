"""Cuvil vs ONNX Runtime vs PyTorch eager on the model zoo: batch 1, fp32, interleaved, N threads (default 1).

The Cuvil session is the one a device builds (tuned on this CPU, the profile's default); the same
model compiled untuned (the cost model's choices) runs beside it, so "tuning never makes a model
slower" is read off the tuned/untuned column, with the number of layers whose choice tuning changed
(0: both ran the same code). Both are loaded from the compile cache: a session made by a cold compile
and one loaded from the cache were timed up to 1.2x apart on ResNet-18 with the same code (this VM's
memory placement), which once read as tuning making it 1.12x slower. Each runtime runs ``--block`` inferences in turn (A B C A B C ...) for ``--rounds`` rounds, so noise
from the shared machine hits all of them alike; medians and p99 are over every timed inference.
Also printed: cold compile time (empty cache), warm start (cache hit to first result, median of 3
fresh processes: see ``warm_start.py``), arena vs its lower bound, achieved GFLOP/s and the
largest difference from the reference interpreter, and resident-memory growth over 10,000 inferences.

With ``--threads N`` every runtime uses N threads (ORT's intra-op pool, torch's, Cuvil's workers) and
Cuvil at one thread runs in the same interleaving: the table adds its speed-up over one thread,
p99/p50 at N threads and at one thread, the share of inferences during which the scheduler preempted
a thread of this process (other work on the cores) and p99/p50 over the inferences it did not: the
tail that is the code's own, not the machine's. The steady p99/p50 (back-to-back runs of one runtime)
stands beside that of a native busy loop as long as Cuvil's median (``fixed_work``): no memory, no Python
inside, so its tail is the host's alone (timer ticks, the hypervisor), the floor under any runtime's at
that length. Each block then starts once the threads of the block
before stopped spinning (``settle``): one runtime's spinning pool must not slow the next one's.

    python benchmarks/zoo_bench.py [--models mlp,resnet18] [--rounds 30] [--block 20] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from cuvil.compiler.analysis import summarize  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.compiler.interpreter import run_reference  # noqa: E402
from cuvil.devices.detect import resolve_target  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from cuvil.edge_runtime.pool_probe import Probe  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.zoo import ZOO, export_onnx  # noqa: E402
from warm_start import measure as measure_starts  # noqa: E402  (this folder is on sys.path)


def from_cache(graph, **options):
    """A session as a device gets it on a cache hit (weights mapped from the cache file), compiling
    first where the entry is missing: the sessions compared side by side all load the same way."""
    compile_graph(graph, **options)
    sess = compile_graph(graph, **options)
    if not sess.stats.cache_hit:
        raise RuntimeError("the compile cache did not keep the entry (no device secret?)")
    return sess


def time_block(fn, n: int, preempted: list[bool] | None = None) -> list[float]:
    """``n`` timings in ms; ``preempted`` gets, per call, whether the scheduler took a core from this
    process during it (an involuntary context switch of any of its threads: other work's doing)."""
    out = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
        if preempted is not None:
            preempted.append(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw > before)
    return out


def settle(limit_s: float = 0.25, window_s: float = 0.005) -> None:
    """Wait until no thread of this process spins any more (its CPU time grows by under a tenth of a
    ``window_s`` sleep), at most ``limit_s``. ONNX Runtime's pool threads keep spinning about 45 ms
    after a 2-thread run (Zen 4, 2 cores), on the core the next runtime's worker wants: Cuvil's int8
    ResNet-18 at 2 threads read 0.93x its 1-thread speed in blocks after ORT's, 1.6x alone."""
    end = time.perf_counter() + limit_s
    while time.perf_counter() < end:
        c0 = time.process_time()
        time.sleep(window_s)
        if time.process_time() - c0 < 0.1 * window_s:
            return


def time_interleaved(runners: dict, rounds: int, block: int,
                     settled: bool = False) -> tuple[dict[str, list[float]], dict[str, list[bool]]]:
    """Warm every runner up, then ``rounds`` rounds in which each times ``block`` calls in turn: the
    competitors share the machine's noisy moments alike. ``settled``: each block starts once the
    threads of the one before stopped spinning (``settle``; for runtimes on several threads, as a
    device that runs one model has its cores). Returns the timings and, per call, whether it was
    preempted (see ``time_block``)."""
    for fn in runners.values():
        time_block(fn, 5)
    samples: dict[str, list[float]] = {k: [] for k in runners}
    preempted: dict[str, list[bool]] = {k: [] for k in runners}
    for _ in range(rounds):
        for key, fn in runners.items():
            if settled:
                settle()
            samples[key] += time_block(fn, block, preempted[key])
    return samples, preempted


def steady_tails(runners: dict, medians: dict[str, float], rounds: int = 3, seconds: float = 0.3,
                 warmup: int = 5) -> dict[str, float]:
    """p99/p50 of back-to-back inferences, as a device running one model sees them: in the interleaved
    rounds the first run of each block follows another runtime's block (its caches, its threads still
    spinning: the MLP's first run of a block took 3.8x its median, the rest 1.4x at most), so their p99
    is the switch-over's. Here each runtime runs ``seconds`` of inferences in a row after ``warmup``
    untimed ones, ``rounds`` times in turn (so a noisy moment hits them alike), each once the threads of
    the one before stopped spinning (``settle``: ORT's pool spun through the first ~45 ms of the next
    runtime's 0.3 s, and MobileNetV2 at 2 threads read 1.97 there against 1.34-1.39 in a process alone)."""
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for key, fn in runners.items():
            settle()
            time_block(fn, warmup)
            samples[key] += time_block(fn, int(min(1000, max(50, seconds * 1e3 / medians[key]))))
    return {k: float(np.percentile(xs, 99) / np.median(xs)) for k, xs in samples.items()}


def fixed_work(ms: float):
    """(a native busy loop of about ``ms``, its close): the pool probe's part at one thread, its loop
    count scaled to the length and corrected once by its measured median."""
    probe = Probe(dataclasses.replace(resolve_target("host"), threads=1))
    for _ in range(2):
        probe.iters[0] = max(1, int(probe.iters[0] * ms / float(np.median(time_block(probe.part, 50)))))
    return probe.part, probe.close


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def rss_growth_kib(run, n: int) -> int:
    """Resident memory after ``n`` more inferences minus before (after a warm-up of 100)."""
    for _ in range(100):
        run()
    before = rss_kib()
    for _ in range(n):
        run()
    return rss_kib() - before


def bench_model(name: str, rounds: int, block: int, rss_runs: int, threads: int = 1) -> dict:
    torch.manual_seed(0)
    module, example = ZOO[name]()
    module.eval()
    graph = import_torch(module, example)
    feeds = {n: t.numpy() for n, t in zip(graph.inputs, example)}

    starts, cold = measure_starts(graph, feeds, repeats=3)  # warm start: fresh processes, cache hits
    got = cold.run(feeds)
    ref = run_reference(graph, feeds)
    max_err = max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    onnx_model = export_onnx(module, example, None)
    ort_sess = ort.InferenceSession(onnx_model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: t.numpy() for i, t in zip(ort_sess.get_inputs(), example)}
    torch.set_num_threads(threads)
    del cold
    sess = from_cache(graph, threads=threads)  # the timed sessions all load the same way
    one = from_cache(graph, threads=1) if threads > 1 else sess
    got = sess.run(feeds)
    max_err = max(max_err, *(float(np.max(np.abs(got[k] - ref[k]))) for k in ref))

    def run_torch():
        with torch.no_grad():
            module(*example)

    untuned = from_cache(graph, tune=False, threads=threads)
    runners = {"cuvil": lambda: sess.run(feeds), "untuned": lambda: untuned.run(feeds), "onnxruntime": lambda: ort_sess.run(None, ort_feeds), "torch": run_torch}
    if threads > 1:
        runners["cuvil_1t"] = lambda: one.run(feeds)
    samples, preempted = time_interleaved(runners, rounds, block, settled=threads > 1)
    steady = {}
    if threads > 1:
        medians = {k: float(np.median(xs)) for k, xs in samples.items()}
        medians["fixed"] = medians["cuvil"]
        loop, close = fixed_work(medians["fixed"])
        try:
            steady = steady_tails({**{k: runners[k] for k in ("cuvil", "onnxruntime", "cuvil_1t")}, "fixed": loop},
                                  medians)
        finally:
            close()
    rss = rss_growth_kib(lambda: sess.run(feeds), rss_runs) if rss_runs else 0
    flops = summarize(graph).flops
    plan = sess.memory_plan
    res = {"model": name, "flops": flops, "cold_compile_s": starts["cold_compile_s"], "warm_start_ms": starts["warm_ms"],
           "arena_bytes": plan.arena_bytes, "lower_bound_bytes": plan.lower_bound, "naive_bytes": plan.naive_bytes,
           "max_abs_err": max_err, "rss_runs": rss_runs, "rss_growth_kib": rss, "threads": threads,
           "split_layers": sess.lowered.split_nodes, "split_settled": sess.lowered.split_settled,
           "split_workers": sess.lowered.workers,
           "split_reason": sess.lowered.split_reason,
           "tuned_layers": len(sess.lowered.target.conv_choices) + len(sess.lowered.target.conv_parts)}
    for key, xs in samples.items():
        res[f"{key}_median_ms"] = float(np.median(xs))
        res[f"{key}_p99_ms"] = float(np.percentile(xs, 99))
        kept = [x for x, hit in zip(xs, preempted[key]) if not hit]
        res[f"{key}_preempted_share"] = 1 - len(kept) / len(xs)
        res[f"{key}_p99_unpreempted_ms"] = float(np.percentile(kept, 99)) if kept else float("nan")
    res["cuvil_gflops"] = flops / (res["cuvil_median_ms"] * 1e6)
    res["ratio_vs_ort"] = res["cuvil_median_ms"] / res["onnxruntime_median_ms"]
    res["ratio_vs_torch"] = res["cuvil_median_ms"] / res["torch_median_ms"]
    res["tuned_vs_untuned"] = res["cuvil_median_ms"] / res["untuned_median_ms"]
    res["p99_over_p50"] = res["cuvil_p99_ms"] / res["cuvil_median_ms"]
    res["p99_over_p50_unpreempted"] = res["cuvil_p99_unpreempted_ms"] / res["cuvil_median_ms"]
    res.update({f"{k}_steady_p99_over_p50": v for k, v in steady.items()})
    if threads > 1:
        res["speedup_vs_1t"] = res["cuvil_1t_median_ms"] / res["cuvil_median_ms"]
    return res


def table(results: list[dict]) -> str:
    head = ("model", "cuvil p50/p99 ms", "ORT p50/p99 ms", "torch p50/p99 ms", "cuvil/ORT", "cuvil/torch",
            "tuned/untuned (layers tuned)", "GFLOP/s", "cold s", "warm ms", "arena/LB", "max err", "RSS growth")
    rows = [[r["model"],
             f"{r['cuvil_median_ms']:.3f}/{r['cuvil_p99_ms']:.3f}",
             f"{r['onnxruntime_median_ms']:.3f}/{r['onnxruntime_p99_ms']:.3f}",
             f"{r['torch_median_ms']:.3f}/{r['torch_p99_ms']:.3f}",
             f"{r['ratio_vs_ort']:.2f}", f"{r['ratio_vs_torch']:.2f}", f"{r['tuned_vs_untuned']:.2f} ({r['tuned_layers']})",
             f"{r['cuvil_gflops']:.1f}",
             f"{r['cold_compile_s']:.2f}", f"{r['warm_start_ms']:.1f}",
             f"{r['arena_bytes'] / max(r['lower_bound_bytes'], 1):.3f}", f"{r['max_abs_err']:.1e}",
             f"{r['rss_growth_kib']} KiB/{r['rss_runs']}"] for r in results]
    if results and results[0]["threads"] > 1:
        head += ("threads", "split", "cuvil 1t p50 ms", "speed-up vs 1t", "p99/p50", "preempted", "p99/p50 unpreempted",
                 "1t p99/p50", "steady p99/p50 cuvil / 1t / ORT / fixed loop")
        for row, r in zip(rows, results):
            row += [str(r["threads"]), f"{r['split_layers']}{'' if r['split_settled'] else ' (unsettled)'}"
                    f"{'' if r['split_workers'] else ', workers off'}",
                    f"{r['cuvil_1t_median_ms']:.3f}",
                    f"{r['speedup_vs_1t']:.2f}", f"{r['p99_over_p50']:.2f}", f"{100 * r['cuvil_preempted_share']:.1f}%",
                    f"{r['p99_over_p50_unpreempted']:.2f}", f"{r['cuvil_1t_p99_ms'] / r['cuvil_1t_median_ms']:.2f}",
                    f"{r['cuvil_steady_p99_over_p50']:.2f} / {r['cuvil_1t_steady_p99_over_p50']:.2f} / "
                    f"{r['onnxruntime_steady_p99_over_p50']:.2f} / {r['fixed_steady_p99_over_p50']:.2f}"]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    fmt = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(head), "-+-".join("-" * w for w in widths), *(fmt(r) for r in rows)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--rss-runs", type=int, default=10_000, help="Cuvil inferences for the RSS-growth check (0: skip).")
    ap.add_argument("--threads", type=int, default=1, help="Threads for every runtime (Cuvil also runs at 1).")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(f"{describe_host()}; ONNX Runtime {ort.__version__}; torch {torch.__version__}; {args.threads} thread(s), batch 1", flush=True)
    results = []
    for name in args.models.split(","):
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(bench_model(name, args.rounds, args.block, args.rss_runs, args.threads))
    print(table(results))
    for r in results:
        if r["split_reason"]:
            print(f"{r['model']}: {r['split_reason']}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
