"""What one split layer's handoff to the worker pool costs here, hot (workers spinning, as between
back-to-back layers: what the tuner measures) and cold (after a pause longer than the spin, workers
asleep on their futex), for a few ``pool_spin`` settings. Medians of interleaved pairs: the pool
running one busy part per thread minus one part alone (``edge_runtime/pool_probe.py``).

    python benchmarks/thread_sync.py [--threads 2] [--spins 4096,256,0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuvil.edge_runtime.compile import resolve  # noqa: E402
from cuvil.edge_runtime.pool_probe import Probe  # noqa: E402
from tests.hosts import describe_host  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spins", default="4096,256,0")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    host = resolve("host")
    print(f"{describe_host()}; {args.threads} threads; load {os.getloadavg()[0]:.1f}")
    print(f"{'pool_spin':>10s} {'hot us (each repeat)':>28s} {'cold us (2 ms pause)':>28s}")
    for spin in (int(s) for s in args.spins.split(",")):
        target = dataclasses.replace(host, threads=args.threads, tuning=host.tuning.replace(pool_spin=spin))
        probe = Probe(target)
        try:
            hot = [probe.handoff_us() for _ in range(args.repeats)]
            cold = [probe.handoff_us(samples=50, cold_gap_s=0.002) for _ in range(args.repeats)]
        finally:
            probe.close()
        print(f"{spin:10d} {' '.join(f'{v:6.1f}' for v in hot):>28s} {' '.join(f'{v:6.1f}' for v in cold):>28s}")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
