"""Black-box privacy audit of a device's evaluation release, by a malicious coordinator.

Two neighbouring devices hold the same data except one record. For each trial a coordinator plays
the whole attack of issue 14 against the real ClientApp of a device with a fresh ledger (NaN and
infinite budgets and noise, strings, huge numbers, retries after each refusal, changed parameters
on a charged release-id, repeats, then valid requests until the budget refuses), and keeps every
report it got. From many trials on each neighbour a Clopper-Pearson bound gives a lower bound on
the ε the coordinator can actually distinguish, to compare with the ε the ledger charged.

Part 1 audits one release with an adversarial neighbour (a NaN record against a softmax model)
through the real release path (ledger, fresh randomness) with many more runs.

    python benchmarks/privacy_audit.py --trials 300 --runs 4000

Prints one line per part: runs, releases served, ε lower bound (99.9 % two-sided intervals), ε
charged, and the CPU.
"""

from __future__ import annotations

import argparse
import math
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import beta

from cuvil import api
from cuvil.coordinator import messages
from cuvil.coordinator.client_app import make_client_app
from cuvil.coordinator.device import DeviceState
from cuvil.coordinator.fleet import device_data, host_class
from cuvil.coordinator.rounds import BundleRef
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.privacy import DEFAULT_PARAMS
from cuvil.edge_runtime.privacy.accounting import epsilon_spent
from cuvil.edge_runtime.privacy.ledger import PrivacyLedger
from cuvil.edge_runtime.privacy.mechanism import encode_sums
from cuvil.edge_runtime.privacy.outcomes import outcomes
from cuvil.edge_runtime.privacy.release import release_report
from cuvil.fleet_example import digits_mlp

CONF = 0.999
ATTACK = [  # (config changes, release-id) sent before and between valid requests
    ({"dp-epsilon": math.nan}, "a"), ({"dp-epsilon": "nan"}, "a"), ({"dp-sigma": math.inf}, "b"),
    ({"dp-sigma": "1e400"}, "b"), ({"dp-sigma": 1e152}, "b"), ({"dp-sigma": -10.0}, "b"), ({"dp-sigma": 5.0}, "b"),
]


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    a = (1 - CONF) / 2
    return (beta.ppf(a, k, n - k + 1) if k else 0.0, beta.ppf(1 - a, k + 1, n - k) if k < n else 1.0)


def epsilon_lower_bound(hits_d2: int, hits_d: int, n: int, delta: float) -> float:
    lo, _ = clopper_pearson(hits_d2, n)
    _, hi = clopper_pearson(hits_d, n)
    return max(0.0, math.log(max(lo - delta, 1e-12) / hi))


def part1_one_release(runs: int, root: Path) -> str:
    """One release, D vs D + a NaN record (softmax model): the true sums from the device's own
    outcome rule, the noise from the real release path (a fresh ledger per run, fresh randomness)."""
    gen = np.random.default_rng(0)
    probs = [p / p.sum() for p in gen.random((50, 10)) ** 4]
    labels = list(gen.integers(0, 10, 50))
    p = DEFAULT_PARAMS
    d = encode_sums(*outcomes(probs, labels), p)[0]
    d2 = encode_sums(*outcomes(probs + [np.full(10, np.nan)], labels + [3]), p)[0]
    keys = sorted(d)
    diff = np.array([d2[k] - d[k] for k in keys], float)
    u = diff / np.linalg.norm(diff)
    threshold = float(np.dot([d2[k] for k in keys], u)) + 0.5 * p.sigma * p.quantum
    hits = {}
    for name, (c, losses) in (("d2", outcomes(probs + [np.full(10, np.nan)], labels + [3])),
                              ("d", outcomes(probs, labels))):
        count = 0
        for i in range(runs):
            path = root / f"p1-{name}-{i}.db"
            led = PrivacyLedger.create(path)
            report, _ = release_report(led, "local", "r", c, losses, p)
            led.close()
            path.unlink()
            count += float(np.dot([report.sums[k] for k in keys], u)) >= threshold
        hits[name] = count
    charged = epsilon_spent([p.noise_multiplier(3)], p.delta)
    lb = epsilon_lower_bound(hits["d2"], hits["d"], runs, p.delta)
    return f"part 1 (one release, NaN-record neighbour): {runs} runs each, ε lower bound {lb:.2f}, charged {charged:.2f}"


def attack(app, ctx, ref: BundleRef) -> list[int]:
    """Everything a malicious coordinator tries; returns the dp_correct of each distinct release it got."""
    got: dict[str, int] = {}

    def ask(rid: str, **cfg) -> None:
        config = {"bundle-hash": ref.content_hash, "dataset": "x", "release-id": rid, "round": 1,
                  "latency-runs": 1, "latency-warmup": 0, **cfg}
        reply = app(messages.Message(messages.evaluate_request(config, ref.data), 7, messages.EVALUATE), ctx)
        if not reply.has_error():
            got[rid] = int(messages.reply_payload(reply)["dp_correct"])

    for i in range(40):
        for cfg, rid in ATTACK:
            ask(f"{rid}{i}", **cfg)
        ask(f"b{i}")  # retry the id a refusal left behind, validly
        ask(f"b{i}", **{"dp-sigma": 20.0})  # then change its parameters
        ask(f"b{i}")  # and repeat it
        if len(got) <= i:  # the budget refused: one more NaN try, then stop
            ask(f"z{i}", **{"dp-epsilon": math.nan})
            break
    return list(got.values())


def ref_model(ref: BundleRef, keys):
    from cuvil.edge_runtime.loader import load_bytes
    from cuvil.edge_runtime.trust import TrustStore

    return load_bytes(ref.data, TrustStore.from_dir(keys.public_path.parent)).graph


def part2_attack(trials: int, root: Path) -> str:
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    keys = api.keygen(root / "keys", "author", force=True)
    bundle = root / "digits.cuvil"
    api.export(digits_mlp(0), bundle, keys.private_path, name="digits-mlp", version="1")
    ref = BundleRef.from_file(bundle)
    x, y = device_data(0, 4)
    session = compile_graph(ref_model(ref, keys), target="host", batch=1)
    correct, _ = outcomes([next(iter(session.run({"pixels": x[i:i + 1]}).values())) for i in range(len(x))], y)
    extra = int(np.flatnonzero(correct)[0])  # the neighbour's extra record is one the model gets right
    rest = np.delete(np.arange(len(x)), extra)
    app = make_client_app()
    devices = {}
    for name, idx in (("d", rest), ("d2", np.arange(len(x)))):
        state = DeviceState.provision(root / name, name, host_class(), [keys.public_path], data=(x[idx], y[idx]))
        shutil.copy(state.root / "privacy.db", root / f"{name}.pristine")
        devices[name] = state
    served, means = [], {}
    for name, state in devices.items():
        ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
        vals = []
        for _ in range(trials):
            shutil.copy(root / f"{name}.pristine", state.root / "privacy.db")
            got = attack(app, ctx, ref)
            served.append(len(got))
            vals.append(float(np.mean(got)) if got else -math.inf)
        means[name] = np.array(vals)
    p = DEFAULT_PARAMS
    # the test: is the mean dp_correct of the releases got above D2's true sum plus half a noise sd?
    threshold = p.quantum * int(correct.sum()) + 0.5 * p.sigma * p.quantum / math.sqrt(max(served))
    hits = {k: int(np.sum(v >= threshold)) for k, v in means.items()}
    ledger = PrivacyLedger.open(devices["d"].root / "privacy.db")
    charged = ledger.spent("local")
    ledger.close()
    lb = epsilon_lower_bound(hits["d2"], hits["d"], trials, p.delta)
    return (f"part 2 (whole attack through the ClientApp): {trials} trials each, releases served per trial "
            f"{min(served)}-{max(served)}, ε lower bound {lb:.2f}, charged {charged:.2f} (budget 3)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4000, help="part 1: runs per neighbour")
    ap.add_argument("--trials", type=int, default=300, help="part 2: attack trials per neighbour")
    args = ap.parse_args()
    print(f"cpu: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        print(part1_one_release(args.runs, root), f"[{time.perf_counter() - t:.0f} s]", flush=True)
        t = time.perf_counter()
        print(part2_attack(args.trials, root), f"[{time.perf_counter() - t:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
