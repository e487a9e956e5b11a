"""Cold compile, warm start and peak memory of a device process, beside ONNX Runtime's.

Why: a device compiles the model for itself, so the first start must not make it wait (goals:
ResNet-18 <= 1 s, every ``tests/archs.py`` model <= 3 s cold on 2 cores, warm start <= 10 ms) and
its process must fit where ONNX Runtime's fits (peak RSS <= ORT's, cold and warm). Each model is
exported as a signed bundle and as ONNX; every measurement runs in a fresh process that loads the
bundle (no torch), so the numbers are what a device sees:

- cold: empty cache, ``load(lazy=True)`` (the signed head, as a device loads a bundle it holds) and
  the code generator's imports before the clock, then ``compile_model`` by the bundle's hash, which
  reads and checks the weights and keeps none of them once folded; wall time and CPU time (this
  process plus its LLVM helpers: on a loaded machine CPU time is the steadier figure), then 100
  inferences; ``builds``: the models it built, cold / again (each plan the split check tried next
  adds one: where a slow cold compile's time went);
- warm: the cache that cold run left, ``load(lazy=True)`` before the clock, then
  ``compile_model`` + the first result (median of ``--repeats`` processes; the bundle's weights
  are never read, the code generator never imported), then 100 inferences;
- again: cold once more in that cache with the model's own files removed (its entry, hint and the
  tuning record), the CPU's remembered facts kept: a device that compiled before, as for a new model
  version. Its path differs (the graph is optimized before the LLVM helper starts), and it once ran
  without a helper;
- ort: ``InferenceSession`` of the ONNX export and 100 inferences; its start (the session made and the
  first result, in a fresh process) is printed beside Cuvil's warm start: what a device waits for
  either way. ``ready``: Cuvil's warm start to the session alone, before the first inference (a model
  whose one inference takes longer than 10 ms cannot start within 10 ms counting it).

``--threads N`` (default 1): the threads the session runs on, ONNX Runtime's ``intra_op_num_threads``
alike. A device runs at its cores' count (``cuvil.compile``'s default), and above one thread a cold
compile also measures the pool's handoff and times the built model with and without its workers
(``docs/threads.md``); a warm start also starts the workers.

Peak RSS is each process's own high-water mark (``VmHWM``; ``ru_maxrss`` would carry this
parent's over the fork). A cold compile's LLVM helper processes (:mod:`cuvil.edge_runtime.llvm_worker`)
are not in that figure: the column ``helper`` is the largest one's own peak (sampled every 20 ms),
alive beside the device process while it compiles. The first line names the host CPU and vector ISA.

``--steps``: each warm-start step (``CompileStats.steps``: opening the entry, host facts, fingerprint,
code load, arena, the wait for the weights' check, ...; then the first inference), median wall and
main-thread CPU ms, so where a warm start's time goes is read off the benchmark itself.

    python benchmarks/cold_compile.py [--models resnet18,resnet50] [--repeats 3] [--no-tune] [--threads N] [--steps]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = r"""
import glob, json, os, resource, sys, threading, time
mode, bundle, pub, npz, cache, onnx_path, tune, threads = sys.argv[1:9]
helper = [0.0]  # the LLVM helpers' own peak (VmHWM: ru_maxrss would count this process's pages at the fork)
def children():  # this process's children, as each thread's /proc children file lists them; else a scan of /proc
    me, listed = os.getpid(), glob.glob("/proc/self/task/*/children")
    if listed:
        return [p for f in listed for p in open(f).read().split()]
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) > me
            and int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) == me]
def watch():  # a few small reads every 20 ms: a scan of all of /proc here slowed the compile's timed runs
    while True:
        try:
            for pid in children():
                hwm = [ln for ln in open(f"/proc/{pid}/status") if ln.startswith("VmHWM:")]
                helper[0] = max(helper[0], int(hwm[0].split()[1]) / 1024 if hwm else 0.0)
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)
if mode == "cold":
    threading.Thread(target=watch, daemon=True).start()
def cpu_s():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
import numpy as np
feeds = dict(np.load(npz))
out = {}
if mode == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.intra_op_num_threads = int(threads); so.inter_op_num_threads = 1
    w0, c0 = time.perf_counter(), cpu_s()
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in sess.get_inputs()], feeds.values()))
    sess.run(None, feeds)
    out["start_ms"], out["start_cpu_ms"] = (time.perf_counter() - w0) * 1e3, (cpu_s() - c0) * 1e3
    run = lambda: sess.run(None, feeds)
else:
    from cuvil.edge_runtime.compile import compile_model
    from cuvil.edge_runtime.loader import load
    if mode == "cold":  # the code generator is imported on a miss only: import it before the clock, as ever
        import cuvil.compiler.codegen.lower, cuvil.edge_runtime.autotune, cuvil.edge_runtime.parallel
    model = load(bundle, [pub], lazy=True)  # as a device loads a bundle it holds
    w0, c0 = time.perf_counter(), cpu_s()
    sess = compile_model(model, cache_dir=cache, tune=tune == "1", threads=int(threads))
    r0, rc0 = time.perf_counter(), time.thread_time()
    sess.run(feeds)
    out["start_ms"], out["start_cpu_ms"] = (time.perf_counter() - w0) * 1e3, (cpu_s() - c0) * 1e3
    out["ready_ms"] = (r0 - w0) * 1e3
    s = sess.stats
    out.update(hit=s.cache_hit, lower_ms=s.lower_ms, llvm_ms=s.llvm_ms, tune_ms=s.tune_ms, builds=s.builds,
               kernels=s.kernel_count,
               nodes=s.node_count, steps=[*s.steps, ("first inference", (time.perf_counter() - r0) * 1e3,
                                                     (time.thread_time() - rc0) * 1e3)])
    run = lambda: sess.run(feeds)
for _ in range(100):
    run()
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")]
out["peak_rss_mib"] = int(hwm[0].split()[1]) / 1024 if hwm else float("nan")
out["helper_rss_mib"] = helper[0]
print(json.dumps(out))
"""

COLD_GOAL_S = {"resnet18": 1.0}
SWEEP_GOAL_S, WARM_GOAL_MS = 3.0, 10.0


def child(mode: str, files: dict[str, Path], tune: bool, threads: int = 1) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    args = [str(files[k]) for k in ("bundle", "pub", "npz", "cache", "onnx")]
    done = subprocess.run([sys.executable, "-c", CHILD, mode, *args, str(int(tune)), str(threads)], capture_output=True,
                          text=True, env=env)
    if done.returncode:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(name: str):
    """(torch module, example inputs) of a zoo or ``tests/archs.py`` model."""
    from tests.archs import ARCHS
    from tests.zoo import ZOO

    return ZOO[name]() if name in ZOO else ARCHS[name]()[:2]


def measure(name: str, work: Path, repeats: int, tune: bool, threads: int = 1) -> dict:
    from cuvil import api
    from cuvil.compiler.errors import UnsupportedModelError
    from cuvil.compiler.frontends.onnx import import_onnx
    from cuvil.compiler.frontends.torch import import_torch
    from tests.zoo import export_onnx

    module, example = build(name)
    proto = export_onnx(module, example)
    try:
        graph = import_torch(module, example)
    except UnsupportedModelError:  # the sweep's models the torch frontend refuses come in through their ONNX export
        graph = import_onnx(proto)
    keys = api.keygen(work / "keys", "bench")
    files = {"bundle": work / "model.cuvil", "pub": keys.public_path, "npz": work / "feeds.npz",
             "cache": work / "cache", "onnx": work / "model.onnx"}
    api.export(graph, files["bundle"], keys.private_path)
    np.savez(files["npz"], **{n: t.numpy() for n, t in zip(graph.inputs, example)})
    files["onnx"].write_bytes(proto.SerializeToString())
    cold = child("cold", files, tune, threads)
    warm = [child("warm", files, tune, threads) for _ in range(repeats)]
    if not all(w["hit"] for w in warm):
        raise RuntimeError("warm start missed the cache")
    for kept in files["cache"].iterdir():  # the CPU's facts and the compiler's fingerprint stay
        if kept.name.endswith((".cuvil-art", ".cuvil-hint", ".cuvil-tuning", ".cuvil-tuning-lock")):
            kept.unlink()
    again = child("cold", files, tune, threads)
    if again["hit"]:
        raise RuntimeError("the second cold compile hit the cache")
    ort = child("ort", files, tune, threads)
    return {"model": name, "cold": cold, "again": again, "warm_ms": float(np.median([w["start_ms"] for w in warm])),
            "ready_ms": float(np.median([w["ready_ms"] for w in warm])),
            "warm_cpu_ms": float(np.median([w["start_cpu_ms"] for w in warm])),
            "warm_rss_mib": max(w["peak_rss_mib"] for w in warm), "ort": ort, "warm_steps": warm_steps(warm)}


def warm_steps(warm: list[dict]) -> list[tuple[str, float, float]]:
    """Each step of the warm starts (``CompileStats.steps`` and the first inference): median wall and
    main-thread CPU ms over the processes."""
    names = [step[0] for step in warm[0]["steps"]]
    return [(n, float(np.median([w["steps"][i][1] for w in warm])), float(np.median([w["steps"][i][2] for w in warm])))
            for i, n in enumerate(names)]


def verdict(r: dict) -> str:
    goal = COLD_GOAL_S.get(r["model"], SWEEP_GOAL_S)
    fails = [f"cold > {goal:g} s"] if max(r["cold"]["start_ms"], r["again"]["start_ms"]) > goal * 1e3 else []
    fails += [f"warm > {WARM_GOAL_MS:g} ms"] if r["warm_ms"] > WARM_GOAL_MS else []
    peak = max(r["cold"]["peak_rss_mib"], r["again"]["peak_rss_mib"], r["warm_rss_mib"])
    fails += ["RSS > ORT"] if peak > r["ort"]["peak_rss_mib"] else []
    return "; ".join(fails) or "ok"


def main() -> None:
    from tests.archs import ARCHS
    from tests.hosts import describe_host

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18," + ",".join(ARCHS))
    ap.add_argument("--repeats", type=int, default=3, help="warm-start processes per model (median)")
    ap.add_argument("--no-tune", action="store_true", help="compile without on-device autotuning")
    ap.add_argument("--threads", type=int, default=1, help="threads the session (and ONNX Runtime) runs on")
    ap.add_argument("--steps", action="store_true", help="print each warm-start step's median wall / CPU ms")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(f"{describe_host()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}; "
          f"tuning {'off' if args.no_tune else 'on'}; {args.threads} thread(s)", flush=True)
    print(f"{'model':18s} {'cold s':>7s} {'cpu s':>6s} {'lower':>6s} {'llvm':>6s} {'tune':>5s} {'builds':>6s} "
          f"{'kern/node':>9s} "
          f"{'again s':>7s} {'warm ms':>7s} {'cpu ms':>6s} {'ready':>5s} {'ORT ms':>6s} | {'RSS MiB cold':>12s} {'helper':>6s} {'again':>5s} {'warm':>5s} "
          f"{'ORT':>5s} | verdict", flush=True)
    results = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="cuvil-cold-") as tmp:
            try:
                r = measure(name, Path(tmp), args.repeats, not args.no_tune, args.threads)
            except Exception as e:  # noqa: BLE001 — one row per model, the sweep goes on
                print(f"{name:18s} FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
                continue
        c, a = r["cold"], r["again"]
        print(f"{name:18s} {c['start_ms'] / 1e3:7.2f} {c['start_cpu_ms'] / 1e3:6.2f} {c['lower_ms'] / 1e3:6.2f} "
              f"{c['llvm_ms'] / 1e3:6.2f} {c['tune_ms'] / 1e3:5.2f} {c['builds']:>3d}/{a['builds']:<2d} "
              f"{c['kernels']:4d}/{c['nodes']:<4d} "
              f"{a['start_ms'] / 1e3:7.2f} {r['warm_ms']:7.1f} {r['warm_cpu_ms']:6.1f} {r['ready_ms']:5.1f} "
              f"{r['ort']['start_ms']:6.0f} | {c['peak_rss_mib']:12.0f} "
              f"{c['helper_rss_mib']:6.0f} {a['peak_rss_mib']:5.0f} {r['warm_rss_mib']:5.0f} {r['ort']['peak_rss_mib']:5.0f} "
              f"| {verdict(r)}", flush=True)
        if args.steps:
            print("  warm steps, median wall / main-thread CPU ms: " +
                  ", ".join(f"{n} {w:.2f} / {c:.2f}" for n, w, c in r["warm_steps"]), flush=True)
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
