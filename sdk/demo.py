"""`cuvil demo`: federated evaluation of a small CNN on a simulated fleet, end to end, in a few minutes.

1. Train a small CNN (PyTorch) on half of scikit-learn's bundled digits; a second, longer-trained
   version is the A/B candidate (with ``int8``: the first version quantized to int8 is). Import both through Cuvil's torch frontend, sign them into bundles.
2. Provision a simulated fleet (default 12 devices over 4 classes: the host's own x86 class natively,
   ARM classes emulated), each device holding a non-IID slice of the other half of the digits.
3. Run federated evaluation in Flower's simulation engine: inventory, two evaluation rounds (the
   second finds the bundle held and the compiled code cached), then an A/B round.
4. Print per-class tables, the A/B comparison (with ``int8``: per class the accuracy cost, latency
   and bundle-size gain of the int8 version), the true accuracy beside the private estimate (only
   a simulation knows both) and ε spent per device; write the results database and an HTML report.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import api
from .compiler.printable import printable
from .coordinator import fleet
from .coordinator.aggregate import OVERALL
from .coordinator.report import COLUMNS, class_rows, epsilon_by_device, round_aggregates, text_table, write_html
from .coordinator.store import ResultsStore

Echo = Callable[[str], None]


@dataclass(frozen=True)
class DemoResult:
    workdir: Path
    bundle: Path
    bundle_b: Path
    accuracy: float  # true accuracy of version 1 over the fleet's evaluation examples
    estimate: float  # the private (noisy) estimate of the same, from the last evaluation round
    db: Path
    report: Path
    run_id: int


def train_cnn(x: np.ndarray, y: np.ndarray, epochs: int, width: int = 8, seed: int = 0):
    """A 2-conv CNN for [N, 1, 8, 8] digits that ends in softmax; a few seconds on 2 cores."""
    try:
        import torch
        from torch import nn
    except ModuleNotFoundError as e:
        raise api.CuvilError("the demo trains its model with PyTorch (pip install 'cuvil[torch]')") from e
    torch.manual_seed(seed)
    torch.set_num_threads(2)

    class DigitsCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, width, 3, padding=1)
            self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
            self.fc = nn.Linear(2 * width * 2 * 2, 10)

        def logits(self, t):
            t = torch.max_pool2d(torch.relu(self.conv1(t)), 2)
            t = torch.max_pool2d(torch.relu(self.conv2(t)), 2)
            return self.fc(torch.flatten(t, 1))

        def forward(self, t):
            return torch.softmax(self.logits(t), dim=-1)

    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model.logits(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval()


def build_models(work: Path, echo: Echo, int8: bool = False) -> tuple[Path, Path, Path]:
    """Train, import and sign both versions; returns (bundle v1, bundle v2 or v1-int8, public key)."""
    import torch

    x, y = fleet.digits("train")
    keys = api.keygen(work / "keys", "demo", force=True)
    echo(f"signing key {keys.fingerprint} (public key {keys.public_path})")
    paths = []
    for version, epochs, width in (("1", 4, 4),) + (() if int8 else (("2", 10, 8),)):
        t0 = time.perf_counter()
        model = train_cnn(x, y, epochs, width)
        with torch.no_grad():
            train_acc = float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
        graph = api.import_model(model, torch.zeros(1, 1, 8, 8))
        done = api.export(graph, work / f"digits-cnn-v{version}.cuvil", keys.private_path, name="digits-cnn",
                          version=version)
        echo(f"v{version}: CNN ({width}/{2 * width} channels, {epochs} epochs) trained on {len(x)} digits, "
             f"train accuracy {train_acc:.3f}; signed bundle {done.path.name} ({done.size} bytes) "
             f"in {time.perf_counter() - t0:.1f}s")
        paths.append(done.path)
        if int8:
            paths.append(_int8_version(graph, x, work, keys.private_path, done.size, echo))
    return paths[0], paths[1], keys.public_path


def _int8_version(graph, x: np.ndarray, work: Path, key: Path, fp32_size: int, echo: Echo) -> Path:
    """The graph quantized (calibrated on 256 training digits) and signed in integer form."""
    t0 = time.perf_counter()
    done = api.quantize(graph, {graph.inputs[0]: x[:256]})
    out = api.export(api.integer_form(done.graph), work / "digits-cnn-v1-int8.cuvil", key, name="digits-cnn",
                     version="1-int8")
    echo(f"v1-int8: v1 quantized (per-channel int8 weights, u8 activations), top-1 agreement with v1 on the "
         f"calibration digits {done.report.top1_agreement:.3f}; signed bundle {out.path.name} ({out.size} bytes, "
         f"{out.size / fp32_size:.2f}x v1) in {time.perf_counter() - t0:.1f}s")
    return out.path


def int8_gain(store: ResultsStore, ab: dict, cmp: dict, sizes: tuple[int, int], hashes: tuple[str, str],
              true_diff: dict[str, float]) -> str:
    """Per device class: accuracy cost (B - A), latency A -> B (p50 measured on native devices, else the
    cost model's prediction), bundle-size ratio; which classes can take the int8 version B."""
    aggs = [round_aggregates(store, ab[k]) for k in ("ab:A", "ab:B")]
    pred = [{p["profile"]: p["predicted_ms"] for p in store.latency_predictions(h)} for h in hashes]

    def latency(i: int, c: str) -> tuple[float | None, str]:
        a = aggs[i].get(c)
        if a is not None and a.latency_p50_ms is not None:
            return a.latency_p50_ms, "measured"
        return pred[i].get(c), "predicted"

    rows = []
    for c, v in cmp.items():
        (la, how), (lb, _) = latency(0, c), latency(1, c)
        lat = f"{la:.3g} -> {lb:.3g} ms ({la / lb:.2f}x faster, {how})" if la and lb else "-"
        rows.append([c, f"{v['diff']:+.3f} ± {v['se']:.3f}", f"{true_diff[c]:+.3f}" if c in true_diff else "-", lat,
                     f"{sizes[1] / sizes[0]:.2f}x"])
    return text_table(("class", "accuracy B - A", "true B - A", "latency A -> B", "bundle B/A"), rows)


def true_accuracy(bundle: Path, public_key: Path, devices: list[fleet.SimDevice]) -> dict[str, tuple[int, int]]:
    """Per class (and overall): (correct, examples) of the bundle on the devices' evaluation examples."""
    from .coordinator.device import DeviceState
    from .edge_runtime.compile import compile_graph

    model = api.load(bundle, [public_key])
    session = compile_graph(model.graph, "host", 1, cache_dir=bundle.parent / "host-cache",
                            content_hash=model.content_hash)
    (name,) = model.graph.inputs[:1]
    shape = session.lowered.inputs[0].shape
    out: dict[str, list[int]] = {}
    for dev in devices:
        x, y = DeviceState.open(_fleet_dir(bundle) / dev.device_id).dataset()
        x, y = x[:512], y[:512]  # what a device evaluates: at most max_examples
        hits = sum(int(next(iter(session.run({name: x[i].reshape(shape)}).values())).argmax() == y[i])
                   for i in range(len(y)))
        for key in (dev.profile, OVERALL):
            acc = out.setdefault(key, [0, 0])
            acc[0] += hits
            acc[1] += len(y)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _fleet_dir(bundle: Path) -> Path:
    return bundle.parent / "fleet"


def plan_demo_fleet(b1: Path, work: Path, devices: int, classes, echo: Echo):
    """Where a demo's fleet and database live and which device holds which slice; says so to the user."""
    plan = fleet.plan_fleet(devices, classes)
    names = ", ".join(c if i == 0 else f"{c} (emulated)" for i, c in enumerate(classes))
    echo(f"fleet: {devices} simulated devices over {len(classes)} classes ({names}); "
         "each device holds a non-IID slice of the held-out digits")
    return _fleet_dir(b1), work / "results.db", plan


def finish_demo(store: ResultsStore, run_id: int, work: Path, db: Path, echo: Echo, t_start: float,
                eps_label: str) -> Path:
    """The closing lines every demo prints: ε per device, the report, where the results are; closes the store."""
    eps = epsilon_by_device(store, run_id)
    echo(f"\n{eps_label} (budget ε = 3 per dataset): " +
         printable(", ".join(f"{d} {e:.2f}" for (d, _), e in sorted(eps.items()))))
    report = write_html(store, run_id, work / "report.html")
    store.close()
    echo(f"\nresults in {db} (run {run_id}): cuvil results --db {db} --run {run_id}")
    echo(f"HTML report: {report}")
    echo(f"demo finished in {time.perf_counter() - t_start:.0f}s")
    return report


class Progress:
    """One line per round plus a live count of replies (redrawn in place on a terminal)."""

    def __init__(self, echo: Echo):
        self.echo, self.tty, self.t0 = echo, sys.stdout.isatty(), time.perf_counter()

    def __call__(self, event: str, **kw) -> None:
        t = f"[{time.perf_counter() - self.t0:6.1f}s]"
        if event == "inventory":
            self.echo(f"{t} inventory: {kw['devices']} devices answered, {kw['silent']} silent")
        elif event == "round_start":
            self.echo(f"{t} round {kw['number']} [{kw['round_kind']}] {kw['model']}: {kw['sampled']} devices "
                      f"sampled, bundle pushed to {kw['push']}")
        elif event == "reply" and self.tty:
            sys.stdout.write(f"\r      replies {kw['done']}/{kw['of']}  (last: {printable(kw['device'])})   ")
            sys.stdout.flush()
        elif event == "round_end":
            o = kw["outcome"]
            if self.tty:
                sys.stdout.write("\r" + " " * 72 + "\r")
            hits = sum(r["metrics"]["cache_hit"] for r in o.reports)
            self.echo(f"{t} round {o.number} [{o.kind}] done in {o.seconds:.1f}s: {len(o.reports)} reports, "
                      f"{hits} compile-cache hits, {o.bundle_bytes_sent} bundle bytes sent, "
                      f"failures {o.failure_counts() or 'none'}")


@contextlib.contextmanager
def demo_workdir(workdir: str | Path | None, force: bool) -> Iterator[Path]:
    """The user's ``workdir`` (new or empty unless ``force``), or a new temporary directory, removed when
    the demo is interrupted: the user never chose it, and it held a half-made fleet. A finished demo's
    temporary directory stays (its results are printed as in it); a user's directory always does."""
    if workdir is not None:
        yield api.output_dir(workdir, force)
        return
    work = Path(tempfile.mkdtemp(prefix="cuvil-demo-"))
    try:
        yield work
    except KeyboardInterrupt:
        shutil.rmtree(work, ignore_errors=True)
        raise


def run_demo(workdir: str | Path | None = None, echo: Echo = print, devices: int = 12, rounds: int = 2,
             classes: tuple[str, ...] | None = None, int8: bool = False, force: bool = False) -> DemoResult:
    with demo_workdir(workdir, force) as work:
        return _run_demo(work, echo, devices, rounds, classes, int8)


def _run_demo(work: Path, echo: Echo, devices: int, rounds: int, classes: tuple[str, ...] | None,
              int8: bool) -> DemoResult:
    t_start = time.perf_counter()
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.export and Ray chatter, not ours
    classes = classes or fleet.default_classes()
    echo(f"workdir {work}")
    b1, b2, pub = build_models(work, echo, int8)

    from .coordinator.simulation import run_fleet_simulation

    fleet_dir, db, plan = plan_demo_fleet(b1, work, devices, classes, echo)
    rc = {"db-path": str(db), "bundle": str(b1), "bundle-b": str(b2), "num-rounds": rounds, "round-timeout": 300.0,
          "inventory-timeout": 300.0, "min-nodes": devices, "node-wait": 120.0, "poll-interval": 0.05}
    run_fleet_simulation(devices, rc, fleet_dir, [pub], classes, on_event=Progress(echo))

    store = ResultsStore(db)
    run_id = store.runs()[-1]["id"]
    rnds = store.rounds(run_id)
    last_eval = [r for r in rnds if r["kind"] == "eval"][-1]
    aggs = round_aggregates(store, last_eval)
    echo(f"\nround {last_eval['number']} per device class (accuracy and loss: private estimates ± 1 s.e.):")
    echo(text_table(COLUMNS, class_rows(aggs)))

    truth = true_accuracy(b1, pub, plan)
    echo("\ntrue accuracy beside the private estimate (only a simulation knows both):")
    shown = [c for c in sorted(truth, key=lambda n: (n == OVERALL, n)) if c in aggs and aggs[c].accuracy is not None]
    rows = [[c, f"{truth[c][0] / truth[c][1]:.3f}", f"{aggs[c].accuracy:.3f} ± {aggs[c].accuracy_se:.3f}",
             str(truth[c][1])] for c in shown]
    echo(text_table(("class", "true", "private estimate", "examples"), rows))

    ab = {r["kind"]: r for r in rnds if r["kind"].startswith("ab:")}
    if len(ab) == 2:
        from .coordinator.aggregate import compare

        def reps(r):
            return store.reports(r["id"])

        cmp = compare(reps(ab["ab:A"]), reps(ab["ab:B"]))
        truth_b = true_accuracy(b2, pub, plan)
        echo(f"\nA/B on the same devices: A = {ab['ab:A']['model']}, B = {ab['ab:B']['model']}")
        echo(text_table(("class", "devices", "A (private)", "B (private)", "B - A", "true B - A"), [
            [c, str(v["devices"]), f"{v['a']:.3f}", f"{v['b']:.3f}", f"{v['diff']:+.3f} ± {v['se']:.3f}",
             f"{truth_b[c][0] / truth_b[c][1] - truth[c][0] / truth[c][1]:+.3f}" if c in truth else "-"]
            for c, v in cmp.items()]))
        if int8:
            hashes = tuple(api.load(b, [pub]).content_hash for b in (b1, b2))
            true_diff = {c: truth_b[c][0] / truth_b[c][1] - truth[c][0] / truth[c][1] for c in truth}
            echo("\nint8 (B) against fp32 (A) per device class:")
            echo(int8_gain(store, ab, cmp, (b1.stat().st_size, b2.stat().st_size), hashes, true_diff))

    report = finish_demo(store, run_id, work, db, echo, t_start, "ε spent per device")
    total = truth[OVERALL]
    return DemoResult(work, b1, b2, total[0] / total[1], aggs[OVERALL].accuracy or float("nan"), db, report, run_id)
