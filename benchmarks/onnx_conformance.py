"""ONNX's backend conformance suite through Cuvil (import, reference interpreter, native code on this host).

Runs every node case of the installed ``onnx`` (generated locally) and the model directories in its
wheel, prints the share of in-scope cases that pass, the outcomes, and the ops of failing cases, then
how many op/dtype variants of the passing cases ``ptxas`` accepts for the Jetson GPUs (``ptx_check``);
``--failures`` lists every failing case with its reason. The test suite runs the same harness
(``tests/conformance/test_onnx_conformance.py``).

    python benchmarks/onnx_conformance.py [--workers 2] [--sample N --seed S] [--only SUBSTRING]
        [--failures] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.onnx_cases import OUT_OF_SCOPE, load_cases, sample  # noqa: E402
from tests.conformance.onnx_suite import failing_ops, run_suite, summarize  # noqa: E402
from tests.conformance.ptx_check import check_ptx  # noqa: E402


def ptx_line(cases, results) -> tuple[str, list]:
    """The ops (with input dtypes) of the cases that pass natively, compiled for the Jetson GPUs and
    assembled by ptxas; the failing ones named."""
    if not shutil.which("ptxas"):
        return "PTX accepted: not checked (ptxas not installed)", []
    passed = {r.name for r in results if r.outcome == "pass"}
    outcomes = check_ptx([c for c in cases if c.name in passed])
    ok = [o for o in outcomes if not o.error]
    ops = {op for o in outcomes for op in o.key.split(" [")[0].split("+")}
    bad_ops = {op for o in outcomes if o.error for op in o.key.split(" [")[0].split("+")}
    for o in outcomes:
        if o.error:
            print(f"  PTX refused: {o.key} ({o.case}): {o.error}")
    return (f"PTX accepted: {len(ok)}/{len(outcomes)} op/dtype variants of passing cases "
            f"({len(ops - bad_ops)}/{len(ops)} ops in no refused variant)"), outcomes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=24)
    ap.add_argument("--sample", type=int, default=0, help="a seeded sample of N in-scope cases (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="cases whose name contains this")
    ap.add_argument("--failures", action="store_true", help="list every failing case")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cases = load_cases()
    t1 = time.perf_counter()
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    if args.sample:
        cases = sample(cases, args.sample, args.seed)
    results = run_suite(cases, workers=args.workers, chunk=args.chunk)
    t2 = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = summarize(cases, results)
    scopes = Counter(c.scope for c in cases if c.scope)
    print(f"{len(cases)} cases collected in {t1 - t0:.1f} s, run in {t2 - t1:.1f} s with {args.workers} workers "
          f"({usage.ru_utime + usage.ru_stime:.1f} s of CPU in them)")
    for key, n in sorted(scopes.items()):
        print(f"  out of scope, {key} ({n}): {OUT_OF_SCOPE[key]}")
    if args.failures:
        for r in results:
            if r.outcome != "pass":
                print(f"  {r.name}: {r.outcome}: {r.detail}")
    print("ops of failing cases:", ", ".join(f"{op} {n}" for op, n in failing_ops(results)))
    print(summary.line())
    t3 = time.perf_counter()
    ptx, outcomes = ptx_line(cases, results)
    print(f"{ptx} [{time.perf_counter() - t3:.1f} s]")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary.line(), "ptx": ptx,
                                         "results": [r.__dict__ for r in results],
                                         "ptx_results": [o.__dict__ for o in outcomes]}, indent=1, default=list))


if __name__ == "__main__":
    main()
