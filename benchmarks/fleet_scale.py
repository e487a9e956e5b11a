"""One federated evaluation round over N simulated devices (Flower's simulation engine, Ray): where its time goes.

    python benchmarks/fleet_scale.py [--devices 1000] [--cpus 2] [--max-in-flight K]

While it runs it prints the coordinator's progress (a line at least every 5 s). Then:

- the round's wall time (the inventory before it and Ray's start-up are not part of it);
- device work per message, measured in this process on a sample of the same devices by calling the
  same ClientApp (under cProfile for the split: verification, compile from the class's shared cache,
  evaluation, release), and what it adds up to over the round's devices and Ray's workers;
- the coordinator's results-store writes during the round;
- the rest: Flower's messaging and scheduling (and the coordinator's own bookkeeping);
- the peak memory of every process involved (this one, Ray's and its workers), as proportional set
  size, so shared pages count once.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.device_class import host_class  # noqa: E402
from cuvil.coordinator.progress import ProgressLog  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402
from cuvil.coordinator.simulation import run_fleet_simulation  # noqa: E402
from tests.coordinator.fleet_helpers import make_bundle, make_keys  # noqa: E402

STAGES = {  # where a device's message goes, by the functions that do each part
    "verification": ("accept_bundle",),
    "compile (shared cache)": ("prepare",),
    "evaluation": ("run_many", "latency"),
    "release (ledger, noise)": ("release_report",),
}
SAMPLE = 20


class Memory(threading.Thread):
    """Peak summed proportional set size of this process and all its descendants, sampled twice a second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak = max(self.peak, sum(_pss(p) for p in [os.getpid(), *_descendants(os.getpid())]))


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except OSError:
                pass
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class Timeline:
    """Prints each progress line with the time since start, and remembers the longest silence."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.longest_gap, self.outcomes = 0.0, []
        self.log = ProgressLog(self._print)

    def _print(self, line: str) -> None:
        now = time.perf_counter()
        self.longest_gap = max(self.longest_gap, now - self.last)
        self.last = now
        print(f"[{now - self.t0:7.1f}s] {line}", flush=True)

    def __call__(self, event: str, **kw) -> None:
        if event == "round_end":
            self.outcomes.append(kw["outcome"])
        self.log(event, **kw)


def device_work(fleet_dir: Path, keys, bundle: Path, devices: int, classes: list[str]) -> tuple[float, dict[str, float]]:
    """Seconds per evaluate message in this process (the ClientApp as Ray runs it), and its split."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    ref = BundleRef.from_file(bundle)
    app = make_client_app({"sim-fleet-dir": str(fleet_dir), "sim-trusted-key": str(keys.public_path),
                           "sim-shared-cache": True, "sim-classes": ",".join(classes)})
    picks = list(range(min(SAMPLE, devices)))

    def ask(i: int, tag: str) -> None:
        cfg = {"bundle-hash": ref.content_hash, "dataset": "digits-local", "release-id": f"bench-{tag}-{i}",
               "round": 1, "latency-runs": 50, "latency-warmup": 5}
        ctx = Context(run_id=1, node_id=i + 1, node_config={"partition-id": i, "num-partitions": devices},
                      state=RecordDict(), run_config={})
        reply = app(Message(messages.evaluate_request(cfg, ref.data), i + 1, messages.EVALUATE), ctx)
        assert not reply.has_error(), reply.error.reason

    t = time.perf_counter()
    for i in picks:
        ask(i, "plain")
    per_message = (time.perf_counter() - t) / len(picks)
    profiler = cProfile.Profile()
    profiler.enable()
    for i in picks:
        ask(i, "profiled")
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    total = sum(v[3] for (f, _, name), v in stats.items()
                if name == "__call__" and f.endswith(os.path.join("clientapp", "client_app.py"))) or 1.0
    split = {stage: sum(v[3] for (f, _, name), v in stats.items() if name in names and f.startswith(str(REPO)))
             / total for stage, names in STAGES.items()}
    return per_message, split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--cpus", type=int, default=2, help="Ray workers (one simulated device each at a time)")
    ap.add_argument("--max-in-flight", type=int, default=None,
                    help="messages out at once (default: the simulation's own choice)")
    ap.add_argument("--classes", default="host",
                    help="device classes, comma-separated ('host': this machine's class; ARM classes run "
                         "under qemu, whose start-up then dominates each message)")
    ap.add_argument("--fleet-dir", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None,
                    help="where the simulated devices' state goes (default: tmpfs, as each real device has "
                         "its own storage and its ledger's fsyncs do not queue on one disk)")
    args = ap.parse_args()
    memory = Memory()
    memory.start()
    classes = [host_class() if c == "host" else c for c in args.classes.split(",")]
    with tempfile.TemporaryDirectory(prefix="cuvil-fleet-scale-", dir=args.fleet_dir) as tmp:
        root = Path(tmp)
        keys = make_keys(root)
        bundle = make_bundle(root, keys)
        rc = {"db-path": str(root / "r.db"), "bundle": str(bundle), "num-rounds": 1, "round-timeout": 3600.0,
              "inventory-timeout": 3600.0, "min-nodes": args.devices}
        if args.max_in_flight is not None:
            rc["max-in-flight"] = args.max_in_flight
        timeline = Timeline()
        t0 = time.perf_counter()
        run_fleet_simulation(args.devices, rc, root / "fleet", [keys.public_path], classes, on_event=timeline,
                             num_cpus=args.cpus, shared_cache=True)
        wall = time.perf_counter() - t0
        memory.stop.set()
        (outcome,) = timeline.outcomes
        per_message, split = device_work(root / "fleet", keys, bundle, args.devices, classes)
    device_s = per_message * args.devices / args.cpus
    flower_s = outcome.seconds - device_s - outcome.store_s
    print(f"\n{args.devices} devices on {args.cpus} Ray workers ({os.cpu_count()} CPUs here): "
          f"{len(outcome.reports)} reports, {len(outcome.failures)} failures")
    print(f"round: {outcome.seconds:.1f} s   (whole simulation {wall:.1f} s: Ray start-up, provisioning, inventory)")
    print(f"  device work        {device_s:7.1f} s  ({per_message * 1e3:.1f} ms per message, measured on "
          f"{min(SAMPLE, args.devices)} devices, x {args.devices} / {args.cpus} workers)")
    for stage, share in split.items():
        print(f"    {stage:<24}{device_s * share:7.1f} s  ({per_message * share * 1e3:.1f} ms per message)")
    print(f"  results store      {outcome.store_s:7.1f} s")
    print(f"  Flower messaging, scheduling and the coordinator's bookkeeping (the rest) {flower_s:.1f} s")
    print(f"peak memory, all processes (PSS): {memory.peak / 2**30:.2f} GiB; longest silence between progress "
          f"lines {timeline.longest_gap:.1f} s")


if __name__ == "__main__":
    main()
