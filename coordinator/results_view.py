"""What the results database says, as small records: runs, rounds, failures, A/B verdicts, ε, the fleet.

Read-only over a :class:`.store.ResultsStore` (open it with ``open_read_only`` to be sure). The text
of ``cuvil results``, its ``--json``, the HTML report and the dashboard are all views of these
records, so they agree. Columns the store gained later (threads, ISA, bundles held, run states) are
read when present and derived or left out when not.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .aggregate import OVERALL, ClassAggregate, aggregate_round, compare
from .formatting import reason as clean_reason
from .formatting import vector_isa
from .store import ResultsStore, StoreError

Z_95 = 1.96  # B - A is distinguishable from the noise when |B - A| > Z_95 standard errors


@dataclass(frozen=True)
class RoundSummary:
    round_id: int
    number: int
    kind: str
    model: str
    bundle_hash: str
    dataset: str
    started_at: float
    finished_at: float | None
    sampled: int
    reports: int
    failures: Mapping[str, int]
    bundle_bytes_sent: int
    cache_hits: int

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


@dataclass(frozen=True)
class RunSummary:
    run_id: int
    status: str
    started_at: float
    finished_at: float | None
    config: Mapping[str, Any]
    rounds: tuple[RoundSummary, ...]
    reason: str = ""  # why a run was aborted, or that a finished one evaluated nothing

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.model for r in self.rounds))


@dataclass(frozen=True)
class Failure:
    round_number: int
    round_kind: str
    device_id: str
    device_class: str
    kind: str
    reason: str
    recorded_at: float


@dataclass(frozen=True)
class AbVerdict:
    """B - A of one class on the devices that reported both, with its standard error."""

    round_number: int
    device_class: str
    devices: int
    model_a: str
    model_b: str
    a: float
    b: float
    diff: float
    se: float

    @property
    def distinguishable(self) -> bool:
        return self.se > 0 and abs(self.diff) > Z_95 * self.se

    @property
    def verdict(self) -> str:
        if not self.distinguishable:
            return "not distinguishable from the noise"
        return "B better" if self.diff > 0 else "B worse"


@dataclass(frozen=True)
class EpsilonRow:
    device_id: str
    dataset: str
    spent: float | None  # None: the device refused for budget and sent no ε this run
    exhausted: bool


@dataclass(frozen=True)
class InventoryRow:
    device_id: str
    device_class: str
    cpu: str
    isa: str
    threads: int | None
    runtime_version: str
    emulated: bool
    bundles_held: tuple[str, ...]
    first_seen: float
    last_seen: float
    epsilon_spent: float | None
    budget_exhausted: bool


@dataclass(frozen=True)
class DeviceEvent:
    """One round a device took part in: its report, or its failure and why."""

    run_id: int
    round_number: int
    round_kind: str
    model: str
    at: float
    outcome: str  # "report" or a failure kind
    reason: str = ""
    latency_p50_ms: float | None = None
    latency_emulated: bool = False
    compile_ms: float | None = None
    cache_hit: bool | None = None
    epsilon_spent: float | None = None


@dataclass(frozen=True)
class RoundDetail:
    summary: RoundSummary
    classes: Mapping[str, ClassAggregate] = field(default_factory=dict)


# runs and rounds ------------------------------------------------------------------------------------
def _round_summary(store: ResultsStore, row: Mapping[str, Any]) -> RoundSummary:
    reps = store.reports(row["id"])
    kinds: dict[str, int] = {}
    for f in store.failures(row["id"]):
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    return RoundSummary(row["id"], row["number"], row["kind"], row["model"], row["bundle_hash"], row["dataset"],
                        row["started_at"], row["finished_at"], row["sampled"], len(reps), kinds,
                        row["bundle_bytes_sent"], sum(int(r["metrics"]["cache_hit"]) for r in reps))


def _config(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"config": text}
    return value if isinstance(value, dict) else {"config": value}


def runs(store: ResultsStore) -> list[RunSummary]:
    return [_run_summary(store, r) for r in store.runs()]


def _run_summary(store: ResultsStore, row: Mapping[str, Any]) -> RunSummary:
    rounds = tuple(_round_summary(store, r) for r in store.rounds(row["id"]))
    return RunSummary(row["id"], row["status"], row["started_at"], row["finished_at"], _config(row["config"]), rounds,
                      str(row.get("reason") or ""))


def run(store: ResultsStore, run_id: int) -> RunSummary:
    """One run; a run the database does not hold is a :class:`StoreError` (the CLI exits non-zero)."""
    for row in store.runs():
        if row["id"] == run_id:
            return _run_summary(store, row)
    raise StoreError(f"no run {run_id} in {store.path}")


def device_classes(store: ResultsStore) -> dict[str, str]:
    return {d["device_id"]: d["profile"] for d in store.devices()}


def round_details(store: ResultsStore, summary: RunSummary) -> list[RoundDetail]:
    classes = device_classes(store)
    return [RoundDetail(r, aggregate_round(store.reports(r.round_id), store.failures(r.round_id), classes))
            for r in summary.rounds]


# failures, A/B, privacy -----------------------------------------------------------------------------
def failures(store: ResultsStore, summary: RunSummary) -> list[Failure]:
    classes = device_classes(store)
    return [Failure(r.number, r.kind, f["device_id"], classes.get(f["device_id"], "unknown"), f["kind"],
                    clean_reason(f["reason"]), f["recorded_at"])
            for r in summary.rounds for f in store.failures(r.round_id)]


def ab_verdicts(store: ResultsStore, summary: RunSummary) -> list[AbVerdict]:
    """Per A/B round, per class and overall: B - A on the devices that reported both versions, as the
    coordinator stored it (``comparisons``); computed from the stored reports only for an A/B round whose
    coordinator died before storing its verdict."""
    out = [AbVerdict(c["number"], c["device_class"], c["devices"], c["model_a"], c["model_b"], c["a"], c["b"],
                     c["diff"], c["se"]) for c in store.comparisons(summary.run_id)]
    stored = {v.round_number for v in out}
    by_number: dict[int, dict[str, RoundSummary]] = {}
    for r in summary.rounds:
        if r.kind in ("ab:A", "ab:B") and r.number not in stored:
            by_number.setdefault(r.number, {})[r.kind] = r
    for number, pair in sorted(by_number.items()):
        if len(pair) != 2 or pair["ab:B"].finished_at is None:
            continue
        a, b = pair["ab:A"], pair["ab:B"]
        for cls, v in compare(store.reports(a.round_id), store.reports(b.round_id)).items():
            out.append(AbVerdict(number, cls, v["devices"], a.model, b.model, v["a"], v["b"], v["diff"], v["se"]))
    return sorted(out, key=lambda v: (v.round_number, v.device_class == OVERALL, v.device_class))


def epsilon_rows(store: ResultsStore, summary: RunSummary) -> list[EpsilonRow]:
    """Every device that reported or trained (the most ε it reported) or refused for budget in this run."""
    spent: dict[tuple[str, str], float | None] = {}
    for r in summary.rounds:
        for rep in store.reports(r.round_id):
            key = (rep["device_id"], r.dataset)
            spent[key] = max(spent.get(key) or 0.0, float(rep["metrics"]["dp_epsilon_spent"]))
        for up in store.updates(r.round_id):  # training rounds charge the same ledger and budget
            key = (up["device_id"], r.dataset)
            spent[key] = max(spent.get(key) or 0.0, float(up["epsilon_spent"]))
        for f in store.failures(r.round_id):
            if f["kind"] == "budget_exhausted":
                spent.setdefault((f["device_id"], r.dataset), None)
    exhausted = {ds: store.exhausted_devices(ds) for ds in {r.dataset for r in summary.rounds}}
    return [EpsilonRow(dev, ds, eps, dev in exhausted.get(ds, ())) for (dev, ds), eps in sorted(spent.items())]


def epsilon_budget(config: Mapping[str, Any]) -> tuple[float, bool]:
    """(ε budget, whether it is the devices' default): the run's ``dp-epsilon`` when it asked for one."""
    from ..edge_runtime.privacy.ledger import PrivacyFloors

    asked = config.get("dp-epsilon") or config.get("dp_epsilon") or 0
    try:
        asked = float(asked)
    except (TypeError, ValueError):
        asked = 0.0
    return (asked, False) if asked > 0 and math.isfinite(asked) else (PrivacyFloors().epsilon, True)


# the fleet ------------------------------------------------------------------------------------------
def _history_rows(store: ResultsStore, device_id: str | None = None) -> list[tuple[dict, dict, str, dict]]:
    """(run, round, outcome, row) for every report and failure, oldest first (one device or all)."""
    out = []
    for run_row in store.runs():
        for rnd in store.rounds(run_row["id"]):
            for rep in store.reports(rnd["id"]):
                if device_id is None or rep["device_id"] == device_id:
                    out.append((run_row, rnd, "report", rep))
            for f in store.failures(rnd["id"]):
                if device_id is None or f["device_id"] == device_id:
                    out.append((run_row, rnd, f["kind"], f))
    return sorted(out, key=lambda t: t[3].get("received_at") or t[3].get("recorded_at") or 0.0)


def inventory(store: ResultsStore) -> list[InventoryRow]:
    held: dict[str, dict[str, None]] = {}
    eps: dict[str, float] = {}
    exhausted: set[str] = set()
    for _, rnd, outcome, row in _history_rows(store):
        dev = row["device_id"]
        if outcome == "report":
            held.setdefault(dev, {})[rnd["model"]] = None
            eps[dev] = float(row["metrics"]["dp_epsilon_spent"])
        elif outcome == "budget_exhausted":
            exhausted.add(dev)
    rows = []
    labels = store.bundle_labels()
    for d in store.devices():
        listed = d.get("held_bundles") or []  # content hashes the device listed at its last inventory
        bundles = tuple(labels.get(h, h[:12]) for h in listed) or tuple(held.get(d["device_id"], ()))
        threads = d.get("threads")
        rows.append(InventoryRow(d["device_id"], d["profile"], d["cpu"], d.get("isa") or vector_isa(d["features"]),
                                 int(threads) if threads else None, d["runtime_version"], bool(d["emulated"]),
                                 bundles, d["first_seen"], d["last_seen"], eps.get(d["device_id"]),
                                 d["device_id"] in exhausted))
    return rows


def device_history(store: ResultsStore, device_id: str) -> list[DeviceEvent]:
    """Every round this device took part in, oldest first; an unknown device is a :class:`StoreError`."""
    if device_id not in device_classes(store):
        raise StoreError(f"no device {device_id!r} in {store.path}")
    events = []
    for run_row, rnd, outcome, row in _history_rows(store, device_id):
        base = dict(run_id=run_row["id"], round_number=rnd["number"], round_kind=rnd["kind"], model=rnd["model"])
        if outcome == "report":
            m = row["metrics"]
            events.append(DeviceEvent(**base, at=row["received_at"], outcome="report",
                                      latency_p50_ms=float(m["latency_p50_ms"]),
                                      latency_emulated=bool(m["latency_emulated"]), compile_ms=float(m["compile_ms"]),
                                      cache_hit=bool(m["cache_hit"]), epsilon_spent=float(m["dp_epsilon_spent"])))
        else:
            events.append(DeviceEvent(**base, at=row["recorded_at"], outcome=outcome,
                                      reason=clean_reason(row["reason"])))
    return events


def latency_predictions(store: ResultsStore, summary: RunSummary) -> dict[str, dict[str, float]]:
    """model label -> device class -> predicted ms (a cost model's figure, never a measurement)."""
    out: dict[str, dict[str, float]] = {}
    for r in summary.rounds:
        for p in store.latency_predictions(r.bundle_hash):
            out.setdefault(r.model, {})[p["profile"]] = float(p["predicted_ms"])
    return out


def classes_of(details: Sequence[RoundDetail]) -> list[str]:
    """Device classes in these rounds, sorted, with the overall row last."""
    names = {c for d in details for c in d.classes}
    return sorted(names - {OVERALL}) + ([OVERALL] if OVERALL in names else [])
