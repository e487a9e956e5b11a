"""`cuvil demo`: the whole loop on a simulated fleet, end to end, in a few minutes.

1. Train a small, deliberately weak CNN (PyTorch) on half of scikit-learn's bundled digits, import it
   through Cuvil's torch frontend and sign it: v1.
2. Provision a simulated fleet (default 12 devices over 4 classes: the host's own x86 class natively,
   ARM classes emulated), each device holding a non-IID slice of the other half of the digits. The
   Raspberry Pi class has too little memory to train; it only evaluates.
3. In Flower's simulation engine: v1 evaluated; DP fine-tuning rounds (Opacus DP-SGD on each device
   that can train, charged to its privacy ledger, averaged by Flower's FedAvg); v2 signed with its
   lineage; a canary rollout (v2 on part of each class, A/B on those, promote or roll back per class);
   an evaluation of what each device runs afterwards.
4. Print the rounds, v2's lineage, the decisions, the true accuracy (only a simulation knows it)
   beside the private estimates, and ε spent per device; write the database and an HTML report.

The evaluation-only demos (two versions A/B, int8 against fp32) are in :mod:`.demo`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from . import api
from .coordinator import fleet
from .coordinator.aggregate import OVERALL
from .coordinator.progress import printable_event, rollout_line, wire_line
from .coordinator.report import round_aggregates, text_table
from .coordinator.store import ResultsStore
from .demo import (DemoResult, Echo, Progress, demo_workdir, finish_demo, plan_demo_fleet, train_cnn,
                   true_accuracy)


@dataclass(frozen=True)
class LoopResult(DemoResult):
    accuracy_b: float = float("nan")  # true accuracy of the fine-tuned version over the same examples
    estimate_se: float = float("nan")  # standard error of the fleet's private accuracy estimate


def build_v1(work: Path, echo: Echo, epochs: int = 2, width: int = 4):
    """Train (deliberately briefly), import and sign v1; returns (bundle path, keys)."""
    import torch

    x, y = fleet.digits("train")
    keys = api.keygen(work / "keys", "demo", force=True)
    echo(f"signing key {keys.fingerprint} (public key {keys.public_path}); it signs v1 and, as the "
         "coordinator's key, the fine-tuned v2")
    t0 = time.perf_counter()
    model = train_cnn(x, y, epochs, width)
    with torch.no_grad():
        train_acc = float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    graph = api.import_model(model, torch.zeros(1, 1, 8, 8))
    done = api.export(graph, work / "digits-cnn-v1.cuvil", keys.private_path, name="digits-cnn", version="1")
    echo(f"v1: CNN ({width}/{2 * width} channels, {epochs} epochs) trained on {len(x)} digits, train accuracy "
         f"{train_acc:.3f}; signed bundle {done.path.name} ({done.size} bytes) in {time.perf_counter() - t0:.1f}s")
    return done.path, keys


class LoopProgress(Progress):
    """The demo's progress lines, plus training rounds, signed versions and rollout decisions."""

    def __call__(self, event: str, **kw) -> None:
        t = f"[{time.perf_counter() - self.t0:6.1f}s]"
        if event == "round_end" and kw["outcome"].kind == "train":
            o = kw["outcome"]
            eps = max((r["metrics"]["dp_epsilon_spent"] for r in o.reports), default=0.0)
            self.echo(f"{t} round {o.number} [train] done in {o.seconds:.1f}s: {len(o.reports)} DP-SGD updates "
                      f"(largest ε spent so far {eps:.2f}), {o.bundle_bytes_sent} bytes of weights pushed, "
                      f"failures {o.failure_counts() or 'none'}")
        elif event == "version":
            self.echo(f"{t} signed {kw['model']}: FedAvg of {kw['updates']} updates"
                      + (f", written to {Path(kw['path']).name}" if kw["final"] else " (next round's weights)"))
        elif event == "wire":
            line = wire_line(kw)
            if line:
                self.echo(f"{t} {line}")
        elif event == "rollout":
            self.echo(f"{t} {rollout_line(printable_event(kw))}")
        else:
            super().__call__(event, **kw)


DP_SGD = {"train-sample-rate": 0.1, "train-noise-multiplier": 2.0, "train-steps": 20, "train-learning-rate": 1.0,
          "train-batch-size": 32, "train-update-clip": 5.0}  # docs/training.md: why these, and the ε they cost


def run_loop_demo(workdir: str | Path | None = None, echo: Echo = print, devices: int = 12, rounds: int = 1,
                  classes: tuple[str, ...] | None = None, train_rounds: int = 3, force: bool = False) -> DemoResult:
    with demo_workdir(workdir, force) as work:
        return _run_loop_demo(work, echo, devices, rounds, classes, train_rounds)


def _run_loop_demo(work: Path, echo: Echo, devices: int, rounds: int, classes: tuple[str, ...] | None,
                   train_rounds: int) -> DemoResult:
    t_start = time.perf_counter()
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.export and Ray chatter, not ours
    warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")  # Opacus' hooks on the first layer
    classes = classes or fleet.default_classes()
    echo(f"workdir {work}")
    b1, keys = build_v1(work, echo)
    pub = keys.public_path

    from .coordinator.simulation import run_fleet_simulation

    fleet_dir, db, plan = plan_demo_fleet(b1, work, devices, classes, echo)
    rc = {"db-path": str(db), "bundle": str(b1), "num-rounds": rounds, "round-timeout": 300.0,
          "inventory-timeout": 300.0, "min-nodes": devices, "node-wait": 120.0, "poll-interval": 0.05,
          "train-rounds": train_rounds, "signing-key": str(keys.private_path), "rollout": True,
          "canary-fraction": 0.5, **DP_SGD}
    run_fleet_simulation(devices, rc, fleet_dir, [pub], classes, on_event=LoopProgress(echo))

    store = ResultsStore(db)
    run_id = store.runs()[-1]["id"]
    rnds = store.rounds(run_id)
    first = [r for r in rnds if r["kind"] == "eval"][-1]
    aggs = round_aggregates(store, first)
    truth = true_accuracy(b1, pub, plan)
    echo(f"\nv1, round {first['number']}, per device class (private estimates ± 1 s.e.; true accuracy only a "
         "simulation knows):")
    echo(_truth_table(truth, aggs))

    versions = [v for v in store.versions() if v["run_id"] == run_id and v["path"]]
    b2 = Path(versions[-1]["path"]) if versions else b1
    if versions:
        v = versions[-1]
        echo(f"\nv{v['version']} signed ({b2.name}): lineage parent v1 {v['parent'][:12]}, {v['rounds']} DP-SGD "
             f"rounds, {v['devices']} devices, largest ε spent {v['epsilon']:.2f} (δ {v['delta']:g})")
    decisions = store.rollouts(run_id)
    if decisions:
        echo("\ncanary rollout, per class (A/B on the canaries; promote unless B is worse beyond the DP noise):")
        echo(text_table(("class", "canaries", "of", "B - A (private)", "upper bound", "decision", "devices switched",
                         "version unknown"),
                        [[r["device_class"], str(r["reported"]), str(r["class_devices"]),
                          "-" if r["diff"] is None else f"{r['diff']:+.3f} ± {r['se']:.3f}",
                          "-" if r["bound"] is None else f"{r['bound']:+.3f}", r["decision"], str(r["applied"]),
                          str(r["unknown"])]
                         for r in decisions]))
    finals = [r for r in rnds if r["kind"] == "active"]
    truth2 = true_accuracy(b2, pub, plan)
    active_truth = _active_truth(store, finals, plan, b1, b2, pub)
    for r in finals:
        echo(f"\nfleet-wide evaluation of what is active: {r['model']} on {r['sampled']} devices")
        echo(_truth_table(active_truth.get(r["model"], {}), round_aggregates(store, r)))
    gain = truth2[OVERALL][0] / truth2[OVERALL][1] - truth[OVERALL][0] / truth[OVERALL][1]
    se = aggs[OVERALL].accuracy_se if OVERALL in aggs else float("nan")
    echo(f"\ntrue accuracy over the fleet: v1 {truth[OVERALL][0] / truth[OVERALL][1]:.3f}, "
         f"fine-tuned {truth2[OVERALL][0] / truth2[OVERALL][1]:.3f} ({gain:+.3f}; the fleet's private estimate has "
         f"s.e. {se:.3f})")

    report = finish_demo(store, run_id, work, db, echo, t_start, "ε spent per device, evaluation and training together")
    total = truth[OVERALL]
    return LoopResult(work, b1, b2, total[0] / total[1], aggs[OVERALL].accuracy or float("nan"), db, report, run_id,
                      truth2[OVERALL][0] / truth2[OVERALL][1], se)


def _truth_table(truth: dict[str, tuple[int, int]], aggs) -> str:
    shown = [c for c in sorted(truth, key=lambda n: (n == OVERALL, n)) if c in aggs and aggs[c].accuracy is not None]
    return text_table(("class", "devices", "true", "private estimate", "examples"), [
        [c, str(aggs[c].devices), f"{truth[c][0] / truth[c][1]:.3f}",
         f"{aggs[c].accuracy:.3f} ± {aggs[c].accuracy_se:.3f}", str(truth[c][1])] for c in shown])


def _active_truth(store, finals, plan, b1: Path, b2: Path, pub: Path) -> dict[str, dict]:
    """Per final round (by model label): the true accuracy of that version on exactly the devices it ran on."""
    out, b2_hash = {}, api.load(b2, [pub]).content_hash
    for r in finals:
        asked = {q["device_id"] for q in store.requests(r["id"])}
        bundle = b2 if r["bundle_hash"] == b2_hash else b1
        out[r["model"]] = true_accuracy(bundle, pub, [d for d in plan if d.device_id in asked])
    return out
