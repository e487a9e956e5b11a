"""Cold compile time of each ONNX conformance case on this host: p50/p95/max and the slowest ten.

Why: the goal is a cold compile of a single-op case in <= 0.3 s (so the conformance suite, and a
user's small model, never waits on the compiler). Each in-scope case that imports and matches on the
reference interpreter (``--passing out.json`` from ``onnx_conformance.py``: only the cases that pass)
is compiled alone for the host with an empty cache (``compile_graph(use_cache=False, jobs=1)``, the
profile's defaults otherwise), in this one process, after one warm-up compile. Wall and CPU time are
both printed: on a loaded machine CPU time is the steadier figure; the host's load is printed too.

    python benchmarks/onnx_compile_times.py [--only SUBSTRING] [--passing out.json] [--json times.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.onnx_cases import load_cases  # noqa: E402
from tests.conformance.onnx_suite import check_reference, import_case  # noqa: E402

GOAL_S = 0.3


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def timed_compile(graph) -> tuple[float, float]:
    from cuvil.edge_runtime.compile import compile_graph

    w0, c0 = time.perf_counter(), time.process_time()
    compile_graph(graph, use_cache=False, jobs=1)
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="cases whose name contains this")
    ap.add_argument("--passing", type=Path, help="onnx_conformance.py --json output: time only its passing cases")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    passing = None
    if args.passing:
        passing = {r["name"] for r in json.loads(args.passing.read_text())["results"] if r["outcome"] == "pass"}
    cases = [c for c in load_cases() if c.scope is None and args.only in c.name and (passing is None or c.name in passing)]
    load0 = os.getloadavg()[0]
    times: list[tuple[float, float, str, int]] = []
    warm = False
    for case in cases:
        try:
            imported = import_case(case)
            if passing is None:
                with np.errstate(all="ignore"):
                    check_reference(case, imported)
            if not warm:
                timed_compile(imported.graph)
                warm = True
            wall, cpu = timed_compile(imported.graph)
        except Exception:  # noqa: BLE001,S112  (a case that fails is the conformance benchmark's business)
            continue
        times.append((wall, cpu, case.name, len(imported.graph.nodes)))
    if not times:
        print("no case compiled")
        return
    walls, cpus = np.array([t[0] for t in times]), np.array([t[1] for t in times])
    print(f"{cpu_name()}, {os.cpu_count()} CPUs, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"cold compile of {len(times)} cases (wall / CPU s): p50 {np.median(walls):.3f} / {np.median(cpus):.3f}, "
          f"p95 {np.percentile(walls, 95):.3f} / {np.percentile(cpus, 95):.3f}, max {walls.max():.3f} / {cpus.max():.3f}; "
          f"over {GOAL_S} s CPU: {int((cpus > GOAL_S).sum())}")
    print("slowest ten (CPU s, wall s, nodes):")
    for wall, cpu, name, nodes in sorted(times, key=lambda t: -t[1])[:10]:
        print(f"  {cpu:.3f}  {wall:.3f}  {nodes:4d}  {name}")
    if args.json:
        args.json.write_text(json.dumps([{"name": n, "wall_s": w, "cpu_s": c, "nodes": k} for w, c, n, k in times], indent=1))


if __name__ == "__main__":
    main()
