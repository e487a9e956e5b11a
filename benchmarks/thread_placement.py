"""Where the cores sit decides whether a split model gains: the round trip of one cache line between
the session's two CPUs beside the model's time with and without its workers, window by window.

Why: on the 2-CPU Zen 4 build host a MobileNetV2 split over 2 threads ran 0.71 ms in most fresh
processes and 1.40-1.50 ms in about one in five, where its 1-thread code ran 1.15-1.30 ms in both;
both threads were busy the whole time and nothing was stolen. The cause is where the hypervisor runs
the two virtual CPUs: a cache line's round trip between them reads ~130 ns most of the time and
~350 ns for stretches of seconds (cores that share no last-level cache), and every split layer hands
its output to the other core through that path. Serial code and two independent programs do not
notice; a split model's 51 handoffs per inference do.

Each window: the round trip (a small C program, two threads pinned to the first two CPUs passing
one cache line back and forth, median of 0.1 s blocks), then the model's median run with its
workers, with them off (the same code on the calling thread), and as a session that watches itself
(``edge_runtime/worker_watch.py``, here every ``--watch-s`` seconds instead of the profile's 10: the
windows last about a second) chose, its trials' runs included. The split is the cost model's
with a handoff of ``--sync-us`` (default 1 us, what the tuner's probe reads on free cores here), and
no whole-model check, so the same split runs in every window. Needs a C compiler (``cc``); the round
trip is a diagnostic of the machine, not of Cuvil.

    python benchmarks/thread_placement.py [--model mobilenet_v2] [--seconds 60] [--threads 2] [--sync-us 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph, resolve  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

PINGPONG = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Atomic long line __attribute__((aligned(64)));
static atomic_int stop;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void *answer(void *cpu) {
    pin((int)(long)cpu);
    while (!atomic_load(&stop)) { long v = atomic_load(&line); if (v & 1) atomic_store(&line, v + 1); }
    return 0;
}
int main(int argc, char **argv) {  /* cpu_a cpu_b blocks: each block's mean round trip in ns */
    pthread_t t;
    pin(atoi(argv[1]));
    pthread_create(&t, 0, answer, (void *)(long)atoi(argv[2]));
    for (int b = 0; b < atoi(argv[3]); b++) {
        long n = 0; double t0 = now();
        while (now() - t0 < 0.1) { long v = atomic_load(&line); atomic_store(&line, v + 1); while (atomic_load(&line) == v + 1); n++; }
        printf("%.0f\n", (now() - t0) / n * 1e9);
    }
    atomic_store(&stop, 1); atomic_store(&line, 1); pthread_join(t, 0);
    return 0;
}
"""


def build_pingpong(folder: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise SystemExit("thread_placement.py needs a C compiler (cc) for its round-trip probe")
    src, exe = folder / "pingpong.c", folder / "pingpong"
    src.write_text(PINGPONG)
    subprocess.run([cc, "-O2", "-pthread", "-o", str(exe), str(src)], check=True)
    return exe


def round_trip_ns(exe: Path, cpus: tuple[int, int], blocks: int = 3) -> float:
    out = subprocess.run([str(exe), str(cpus[0]), str(cpus[1]), str(blocks)], capture_output=True, text=True,
                         check=True).stdout.split()
    return statistics.median(float(x) for x in out)


def median_ms(session, feeds: dict, n: int = 60) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2", choices=sorted(ZOO))
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sync-us", type=float, default=1.0, help="the handoff the cost model assumes, in microseconds")
    ap.add_argument("--watch-s", type=float, default=0.5, help="the watched session's re-timing interval")
    ap.add_argument("--far-ns", type=float, default=200.0, help="a round trip above this counts as 'far'")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or args.threads < 2:
        raise SystemExit("thread_placement.py needs two CPUs and --threads 2 or more")
    module, example = ZOO[args.model]()
    graph = import_torch(module, example)
    host = resolve("host")
    target = dataclasses.replace(host, tuning=host.tuning.replace(parallel_sync_us=args.sync_us))
    session = compile_graph(graph, target=target, threads=args.threads, use_cache=False, tune=False)
    watched = compile_graph(graph, target=dataclasses.replace(target, tuning=target.tuning.replace(
        worker_watch_s=args.watch_s)), threads=args.threads, use_cache=False, tune=False)
    feeds = {graph.inputs[0]: np.random.default_rng(0).standard_normal(example[0].shape).astype(np.float32)}
    print(f"{describe_host()}; {args.model}, {args.threads} threads, {session.lowered.split_nodes} layers split "
          f"(cost model, {args.sync_us:g} us handoff); CPUs {cpus[0]} and {cpus[1]}; load {os.getloadavg()[0]:.1f}")
    print(f"{'time':>8} {'round trip ns':>13} {'workers ms':>10} {'alone ms':>9} {'ratio':>6} {'watched ms':>10}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_pingpong(Path(tmp))
        end = time.time() + args.seconds
        while time.time() < end:
            trip = round_trip_ns(exe, (cpus[0], cpus[1]))
            session.set_workers(True)
            threaded = median_ms(session, feeds)
            session.set_workers(False)
            alone = median_ms(session, feeds, 30)
            watching = median_ms(watched, feeds)
            rows.append((trip, threaded, alone, watching))
            print(f"{time.strftime('%H:%M:%S'):>8} {trip:13.0f} {threaded:10.3f} {alone:9.3f} {threaded / alone:6.2f} "
                  f"{watching:10.3f}", flush=True)
    near = [r for r in rows if r[0] <= args.far_ns]
    for label, group in (("near", near), ("far", [r for r in rows if r not in near])):
        if group:
            print(f"{label} (round trip {'<=' if label == 'near' else '>'} {args.far_ns:g} ns): {len(group)} windows, "
                  f"median round trip {statistics.median(r[0] for r in group):.0f} ns, with workers / alone "
                  f"{statistics.median(r[1] / r[2] for r in group):.2f}, watched / alone "
                  f"{statistics.median(r[3] / r[2] for r in group):.2f}")


if __name__ == "__main__":
    main()
