"""One federated evaluation round over N simulated devices (Flower's simulation engine, Ray): where its time goes.

    python benchmarks/fleet_scale.py [--devices 1000] [--cpus 2] [--max-in-flight K] [--classes host]

While it runs it prints the coordinator's progress with the time since start (a line at least every
5 s once the coordinator runs). Then:

- the round's wall time (provisioning, Ray's start-up and the inventory come before it);
- device work: the time Ray's workers spent inside the devices' ClientApp during the round, measured
  there by a Flower mod around every message, and its split (verification, compile from the class's
  shared cache, evaluation, release) from cProfile on one message in ``PROFILE_EVERY`` per worker;
- the coordinator's results-store writes during the round;
- the rest: Flower's messaging and scheduling (and the coordinator's own bookkeeping), i.e. the
  round's wall time less the device work spread over the workers and the store writes;
- the peak memory of every process involved (this one, Ray's and its workers) as proportional set
  size, so pages they share count once.

Simulated devices keep their state on tmpfs by default (``--fleet-dir``): a real device's ledger
writes go to its own storage, not into one queue of fsyncs on the simulating machine's disk.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuvil.coordinator import client_app, device  # noqa: E402
from cuvil.coordinator.device_class import host_class  # noqa: E402
from cuvil.coordinator.progress import ProgressLog  # noqa: E402
from cuvil.coordinator.simulation import run_fleet_simulation  # noqa: E402
from cuvil.edge_runtime import runner, session  # noqa: E402
from cuvil.edge_runtime.privacy import mechanism, outcomes, release  # noqa: E402
from tests.coordinator.fleet_helpers import make_bundle, make_keys  # noqa: E402

# Where a device's evaluate message goes: (module, function name) of the functions that do each part,
# closures included (runner's native ``latency``, its emulated ``run_each``). The whole message is the
# verify mod's time (the verification and the handler it calls). tests/benchmarks keeps these real.
MESSAGE = (client_app, "verify_bundle_mod")
STAGES = {
    "verification": ((device.DeviceState, "accept_bundle"),),
    "compile (shared cache)": ((runner, "prepare"),),
    "evaluation": ((device.DeviceState, "dataset"), (session, "run_each"), (runner, "run_each"),
                   (runner, "latency"), (outcomes, "outcomes")),
    "release (ledger, noise)": ((device.DeviceState, "ledger"), (release, "prepare"), (release, "release"),
                                (mechanism, "encode_sums")),
}
PROFILE_EVERY = 25


class DeviceClock:
    """A Flower mod (it runs in Ray's workers, a fresh copy per message): times every message (wall and
    CPU), profiles about one evaluate in ``PROFILE_EVERY`` by CPU time, and appends what it saw to files
    under ``out``, one set per process."""

    def __init__(self, out: Path):
        self.out = out

    def __call__(self, msg, context, call_next):
        kind = msg.metadata.message_type
        sampled = kind == "evaluate" and random.random() < 1 / PROFILE_EVERY
        profiler = cProfile.Profile(time.process_time) if sampled else None
        start, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        reply = call_next(msg, context)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(self.out / f"{os.getpid()}-{msg.metadata.message_id[:16]}.prof"))
        with open(self.out / f"{os.getpid()}.times", "a") as f:
            f.write(f"{kind} {time.time():.6f} {time.perf_counter() - start:.6f} {time.process_time() - cpu:.6f} "
                    f"{int(profiler is not None)}\n")
        return reply


def device_work(out: Path, since: float) -> tuple[int, float, float, dict[str, float]]:
    """Evaluate messages handled after ``since`` (wall clock): their count, median wall and mean CPU
    seconds per message (unprofiled ones), and the CPU split of the profiled ones."""
    rows = [line.split() for f in out.glob("*.times") for line in f.read_text().splitlines()]
    evals = [r for r in rows if r[0] == "evaluate" and float(r[1]) >= since]
    plain = [r for r in evals if r[4] == "0"]
    wall = statistics.median(float(r[2]) for r in plain) if plain else 0.0
    cpu = statistics.fmean(float(r[3]) for r in plain) if plain else 0.0
    profiles = sorted(out.glob("*.prof"))
    split = stage_split(pstats.Stats(*map(str, profiles)).stats) if profiles else {}
    return len(evals), wall, cpu, split


def stage_split(stats: dict) -> dict[str, float]:
    """Each stage's share of the profiled messages' time, from cProfile's statistics (keyed by
    (file, first line, function name), each value's fourth item the cumulative time)."""
    def cumulative(where, name: str) -> float:
        path = sys.modules[where.__module__].__file__ if isinstance(where, type) else where.__file__
        return sum(v[3] for (f, _, n), v in stats.items() if n == name and f == path)

    total = cumulative(*MESSAGE) or 1.0
    return {stage: sum(cumulative(*part) for part in parts) / total for stage, parts in STAGES.items()}


class Monitor(threading.Thread):
    """Samples this process and all its descendants every two seconds (reading every process's memory map
    costs CPU, which this process shares with the coordinator): peak summed proportional set size, and
    each process's CPU seconds so far (a busy machine stretches wall time, not CPU time)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stop = 0, threading.Event()
        self.own_cpu = 0.0  # CPU seconds this process spent sampling (it counts in this process's CPU)
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU seconds so far)
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            self.sample()

    def sample(self) -> None:
        began = time.thread_time()
        pids = [os.getpid(), *_descendants(os.getpid())]
        self.peak = max(self.peak, sum(_pss(p) for p in pids))
        with self.lock:
            for p in pids:
                used = _cpu_seconds(p)
                if used is not None:
                    self.cpu[p] = (_role(p), used)
            self.own_cpu += time.thread_time() - began

    def snapshot(self) -> dict[int, tuple[str, float]]:
        self.sample()
        with self.lock:
            return {**self.cpu, -1: ("sampling", self.own_cpu)}


def cpu_between(start: dict[int, tuple[str, float]], end: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role used between two snapshots (processes started in between count from zero)."""
    out: dict[str, float] = {}
    for pid, (role, used) in end.items():
        out[role] = out.get(role, 0.0) + used - start.get(pid, (role, 0.0))[1]
    return out


def _cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _role(pid: int) -> str:
    if pid == os.getpid():
        return "this process"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "ray"
    return "devices" if cmd.startswith(b"ray::") else "ray"


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
    """Prints each progress line with the time since start; remembers the longest silence once the
    coordinator runs, and when the round started."""

    def __init__(self, monitor: Monitor) -> None:
        self.t0 = time.perf_counter()
        self.last: float | None = None
        self.longest_gap, self.outcomes, self.round_started = 0.0, [], 0.0
        self.log = ProgressLog(self._print)
        self.monitor, self.cpu_at = monitor, {}

    def _print(self, line: str) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.longest_gap = max(self.longest_gap, now - self.last)
        print(f"[{now - self.t0:7.1f}s] {line}", flush=True)

    def __call__(self, event: str, **kw) -> None:
        if event == "run_start":
            self.last = time.perf_counter()
        if event == "round_start":
            self.round_started = time.time()
            self.cpu_at["start"] = self.monitor.snapshot()
        if event == "round_end":
            self.outcomes.append(kw["outcome"])
            self.cpu_at["end"] = self.monitor.snapshot()
        self.log(event, **kw)
        if self.last is not None:
            self.last = time.perf_counter()


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
                    help="where the simulated devices' state goes (default: tmpfs)")
    args = ap.parse_args()
    classes = [host_class() if c == "host" else c for c in args.classes.split(",")]
    monitor = Monitor()
    monitor.start()
    with tempfile.TemporaryDirectory(prefix="cuvil-fleet-scale-", dir=args.fleet_dir) as tmp:
        root = Path(tmp)
        (root / "clock").mkdir()
        keys = make_keys(root)
        bundle = make_bundle(root, keys)
        rc = {"db-path": str(root / "r.db"), "bundle": str(bundle), "num-rounds": 1, "round-timeout": 3600.0,
              "inventory-timeout": 3600.0, "min-nodes": args.devices}
        if args.max_in_flight is not None:
            rc["max-in-flight"] = args.max_in_flight
        timeline = Timeline(monitor)
        t0 = time.perf_counter()
        run_fleet_simulation(args.devices, rc, root / "fleet", [keys.public_path], classes, on_event=timeline,
                             num_cpus=args.cpus, shared_cache=True, client_mods=[DeviceClock(root / "clock")])
        wall = time.perf_counter() - t0
        monitor.stop.set()
        (outcome,) = timeline.outcomes
        count, wall_per_message, cpu_per_message, split = device_work(root / "clock", timeline.round_started)
    cpu = cpu_between(timeline.cpu_at["start"], timeline.cpu_at["end"])
    sampling = cpu.pop("sampling", 0.0)  # this benchmark's own, in this process: not the round's
    cpu["this process"] = cpu.get("this process", 0.0) - sampling
    total_cpu = sum(cpu.values())
    print(f"\n{args.devices} devices ({', '.join(classes)}) on {args.cpus} Ray workers, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}: {len(outcome.reports)} reports, {len(outcome.failures)} failures")
    print(f"round: {outcome.seconds:.1f} s wall   (whole simulation {wall:.1f} s: provisioning, Ray start-up, "
          "inventory)")
    print(f"CPU the round used: {total_cpu:.1f} s, so at least {total_cpu / args.cpus:.1f} s of wall time on "
          f"{args.cpus} otherwise idle cores; by where it went:")
    device_cpu = cpu.get("devices", 0.0)
    print(f"  devices (Ray workers)        {device_cpu:7.1f} s  ({cpu_per_message * 1e3:.1f} ms CPU per evaluate "
          f"message in the ClientApp; {wall_per_message * 1e3:.1f} ms wall, median, on this machine now)")
    for stage, share in split.items():
        print(f"    {stage:<26} {cpu_per_message * share * count:7.1f} s  ({cpu_per_message * share * 1e3:.1f} ms "
              "per message)")
    handler = cpu_per_message * count
    print(f"    {'other ClientApp work':<26} {handler * (1 - sum(split.values())):7.1f} s")
    print(f"    {'Ray and Flower in workers':<26} {device_cpu - handler:7.1f} s")
    driver = cpu.get("this process", 0.0)
    print(f"  this process                 {driver:7.1f} s  (of it, the coordinator's results-store writes "
          f"{outcome.store_s:.1f} s wall; the rest is Flower's simulation engine, Ray's dispatch and the "
          f"coordinator's bookkeeping; this benchmark's own sampling, {sampling:.1f} s more, left out)")
    print(f"  Ray's own processes          {cpu.get('ray', 0.0):7.1f} s")
    print(f"peak memory, all processes (PSS): {monitor.peak / 2**30:.2f} GiB; longest silence between progress "
          f"lines once the coordinator ran: {timeline.longest_gap:.1f} s")


if __name__ == "__main__":
    main()
