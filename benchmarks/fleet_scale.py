"""One federated evaluation round over N simulated devices (Flower's simulation engine, Ray).

Prints the round's wall time and the whole simulation's (Ray start-up and inventory included).

    python benchmarks/fleet_scale.py [--devices 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuvil.coordinator.simulation import run_fleet_simulation  # noqa: E402
from tests.coordinator.fleet_helpers import make_bundle, make_keys  # noqa: E402


class Rounds:
    def __init__(self) -> None:
        self.outcomes = []

    def __call__(self, event, **kw) -> None:
        if event == "round_end":
            self.outcomes.append(kw["outcome"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        keys = make_keys(root)
        bundle = make_bundle(root, keys)
        rc = {"db-path": str(root / "r.db"), "bundle": str(bundle), "num-rounds": 1, "round-timeout": 300.0,
              "inventory-timeout": 300.0, "min-nodes": args.devices, "poll-interval": 0.05}
        rounds = Rounds()
        t0 = time.perf_counter()
        run_fleet_simulation(args.devices, rc, root / "fleet", [keys.public_path], on_event=rounds, shared_cache=True)
        wall = time.perf_counter() - t0
    (outcome,) = rounds.outcomes
    print(f"{args.devices} devices: {len(outcome.reports)} reports, {len(outcome.failures)} failures; "
          f"round {outcome.seconds:.1f} s, whole simulation {wall:.1f} s (Ray start-up and inventory included)")


if __name__ == "__main__":
    main()
