"""One federated DP fine-tuning round over N simulated devices (Flower's simulation engine, Ray).

    python benchmarks/training_round.py [--devices 100] [--cpus 2] [--rounds 1]

Every device is of the host's class (all can train) and holds a few hundred digits; the model is the
demo's small CNN (4/8 channels). One evaluation round comes first (the run's required one; not
measured), then ``--rounds`` training rounds with the demo's DP-SGD parameters. Printed per training
round: its wall time (from the results store: the first request out to the last update stored, FedAvg
and signing of the next weights after it), the updates it got, and the device side measured in Ray's
workers by a Flower mod around every train message: wall and CPU time per message (median, and the
slowest), and the coordinator process's CPU time over the round (the ServerApp, FedAvg, signing, and
Flower's simulation engine, which share that process). Each Ray worker imports torch and Opacus on its
first message, the inventory's (:func:`cuvil.coordinator.simulation.warm_training_mod`), not in the
round. Simulated devices keep their state on tmpfs by default: a real device's ledger writes go to its
own storage. The host's load average is printed at the start and the end: on a shared host, wall time
follows the load, CPU time much less.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuvil import api  # noqa: E402
from cuvil.coordinator.device_class import host_class  # noqa: E402
from cuvil.coordinator.simulation import run_fleet_simulation  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402
from tests.edge_runtime.training.helpers import cnn_graph  # noqa: E402

DP_SGD = {"train-sample-rate": 0.1, "train-noise-multiplier": 2.0, "train-steps": 20, "train-learning-rate": 1.0,
          "train-batch-size": 32}  # the demo's (sdk/demo.py)


class TrainClock:
    """A Flower mod in Ray's workers: wall and CPU time of every train message, appended to a file per process."""

    def __init__(self, out: Path):
        self.out = out

    def __call__(self, msg, context, call_next):
        if msg.metadata.message_type != "train":
            return call_next(msg, context)
        w, c = time.perf_counter(), time.process_time()
        reply = call_next(msg, context)
        with open(self.out / f"train-{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps({"wall": time.perf_counter() - w, "cpu": time.process_time() - c}) + "\n")
        return reply


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    """Run the benchmark in a fresh work directory (on tmpfs: 100 devices' state), removed afterwards."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=100)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--fleet-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cuvil-train-bench-", dir=args.fleet_dir))
    try:
        measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, work: Path) -> None:
    keys = api.keygen(work / "keys", "bench", force=True)
    bundle = api.export(cnn_graph(seed=3), work / "cnn-v1.cuvil", keys.private_path, name="cnn", version="1").path
    clock = work / "clock"
    clock.mkdir()
    rc = {"db-path": str(work / "r.db"), "bundle": str(bundle), "num-rounds": 1, "train-rounds": args.rounds,
          "signing-key": str(keys.private_path), "min-nodes": args.devices, "latency-runs": 1,
          "latency-warmup": 0, "round-timeout": 600.0, "inventory-timeout": 600.0, "node-wait": 300.0, **DP_SGD}
    load0 = os.getloadavg()[0]
    coordinator_cpu: dict[int, float] = {}

    def on_event(kind: str, **data) -> None:  # the coordinator process's CPU time per training round
        if data.get("round_kind") == "train" or (kind == "round_end" and data["outcome"].kind == "train"):
            number = data["number"] if kind == "round_start" else data["outcome"].number
            coordinator_cpu[number] = time.process_time() - coordinator_cpu.get(number, 0.0)

    t0 = time.perf_counter()
    run_fleet_simulation(args.devices, rc, work / "fleet", [keys.public_path], [host_class()], num_cpus=args.cpus,
                         shared_cache=True, client_mods=[TrainClock(clock)], on_event=on_event)
    total = time.perf_counter() - t0
    store = ResultsStore(work / "r.db")
    run = store.runs()[-1]
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs, {args.cpus} Ray workers; load average "
          f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{args.devices} simulated devices ({host_class()}), run {run['status']}, whole simulation {total:.0f}s")
    for r in store.rounds(run["id"]):
        if r["kind"] == "train":
            print(f"training round {r['number']}: {r['finished_at'] - r['started_at']:.1f}s wall, "
                  f"{len(store.updates(r['id']))} updates of {r['sampled']} asked; coordinator process "
                  f"{coordinator_cpu.get(r['number'], float('nan')):.1f} CPU-s")
    times = [json.loads(ln) for p in clock.glob("*.jsonl") for ln in p.read_text().splitlines()]
    if times:
        wall, cpu = sorted(t["wall"] for t in times), sorted(t["cpu"] for t in times)
        print(f"device side per train message ({len(times)}): wall median {statistics.median(wall):.2f}s, "
              f"max {wall[-1]:.2f}s; CPU median {statistics.median(cpu):.2f}s, max {cpu[-1]:.2f}s, "
              f"sum {sum(cpu):.1f}s")
    store.close()


if __name__ == "__main__":
    main()
