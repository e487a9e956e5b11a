"""Reports from the results store: text for terminals (``cuvil results``), JSON for scripts, and a
self-contained HTML page (``cuvil report``: inline SVG charts, no script, nothing beside it).

Every string that reaches a terminal passes :func:`cuvil.compiler.printable.printable` (device ids,
CPU names and failure reasons come from devices); the JSON is ASCII with every control escaped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..compiler.atomic_file import atomic_write
from ..compiler.printable import printable
from . import formatting as fmt
from . import html_views
from . import results_view as rv
from .aggregate import OVERALL, ClassAggregate, aggregate_round
from .rollout_view import ROLLOUT_HEADERS, VERSION_HEADERS, as_records, rollout_rows, version_rows
from .store import ResultsStore

COLUMNS = ("class", "devices", "accuracy", "loss", "p50", "p90", "p99", "compile", "cache hits",
           "arena", "ε max", "failed", "timeout", "refused", "budget")


def class_rows(aggs: Mapping[str, ClassAggregate]) -> list[list[str]]:
    rows = []
    for name in sorted(aggs, key=lambda n: (n == OVERALL, n)):
        a = aggs[name]
        measured = a.latency_devices > 0
        rows.append([
            name, str(a.devices), fmt.estimate(a.accuracy, a.accuracy_se), fmt.estimate(a.loss, a.loss_se),
            fmt.histogram_ms(a.latency_p50_ms) if measured else ("emulated" if a.emulated_devices else "-"),
            fmt.histogram_ms(a.latency_p90_ms) if measured else "-", fmt.histogram_ms(a.latency_p99_ms) if measured else "-",
            fmt.duration_ms(a.compile_ms_median), str(a.cache_hits), fmt.byte_count(a.arena_bytes_max),
            fmt.number(a.epsilon_spent_max),
            *(str(a.failures.get(k, 0)) for k in ("failure", "timeout", "refused", "budget_exhausted")),
        ])
    return rows


def round_aggregates(store: ResultsStore, round_row: Mapping[str, Any]) -> dict[str, ClassAggregate]:
    return aggregate_round(store.reports(round_row["id"]), store.failures(round_row["id"]), rv.device_classes(store))


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns; every cell made printable (cells may hold device strings)."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def epsilon_by_device(store: ResultsStore, run_id: int) -> dict[tuple[str, str], float]:
    """(device, dataset) -> the largest ε spent that the device reported in this run."""
    return {(r.device_id, r.dataset): r.spent for r in rv.epsilon_rows(store, rv.run(store, run_id))
            if r.spent is not None}


EPSILON_COLUMNS = ("device", "dataset", "ε spent", "budget exhausted")


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + ln for ln in text.splitlines())


def _failure_counts(r: rv.RoundSummary) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in sorted(r.failures.items())) or "none"


def _run_lines(run: rv.RunSummary) -> list[str]:
    took = fmt.seconds(run.duration_s) if run.finished_at else "still running"
    lines = [printable(f"run {run.run_id}  status {run.status}  started {fmt.timestamp(run.started_at)}  "
                       f"finished {fmt.timestamp(run.finished_at)} ({took})  {len(run.rounds)} rounds"
                       + (f"  ({run.reason})" if run.reason else ""))]
    for r in run.rounds:
        took = fmt.seconds(r.duration_s) if r.finished_at else "running"
        lines.append(printable(
            f"  round {r.number} [{r.kind}] model {r.model} bundle {r.bundle_hash[:12]} dataset {r.dataset} "
            f"started {fmt.timestamp(r.started_at)} took {took} sampled {r.sampled} reports {r.reports} "
            f"failures {_failure_counts(r)} cache hits {r.cache_hits} bundle bytes sent {r.bundle_bytes_sent}"))
    return lines


def history_text(store: ResultsStore, run_id: int | None = None) -> str:
    """What ``cuvil results`` prints: every run (or one, in detail); a missing run is a StoreError."""
    if run_id is None:
        runs = rv.runs(store)
        return "\n".join(ln for run in runs for ln in _run_lines(run)) if runs else "no runs recorded"
    run = rv.run(store, run_id)
    parts = _run_lines(run)[:1]
    for detail, line in zip(rv.round_details(store, run), _run_lines(run)[1:]):
        parts += [line, _indent(text_table(COLUMNS, class_rows(detail.classes)))]
    verdicts = rv.ab_verdicts(store, run)
    if verdicts:
        parts.append("  A/B: B - A per class on the devices that reported both "
                     f"(distinguishable from the noise beyond {rv.Z_95} standard errors)")
        parts.append(_indent(text_table(("class", "round", "devices", "A", "B", "B - A", "verdict"), [
            [v.device_class, str(v.round_number), str(v.devices), f"{v.a:.3f}", f"{v.b:.3f}",
             f"{v.diff:+.3f} ± {v.se:.3f}", v.verdict] for v in verdicts])))
    for title, headers, rows in (("fine-tuned versions (lineage)", VERSION_HEADERS, version_rows(store, run_id)),
                                 ("rollout decisions per class", ROLLOUT_HEADERS, rollout_rows(store, run_id))):
        if rows:
            parts += [f"  {title}:", _indent(text_table(headers, rows))]
    fails = rv.failures(store, run)
    parts.append("  failures: " + ("none" if not fails else ""))
    if fails:
        parts.append(_indent(text_table(("round", "device", "class", "kind", "reason"), [
            [f"{f.round_number} {f.round_kind}", f.device_id, f.device_class, f.kind.replace("_", " "), f.reason]
            for f in fails])))
    budget, default = rv.epsilon_budget(run.config)
    parts.append(f"  privacy: ε spent per device (budget ε = {budget:g}"
                 f"{' (device default)' if default else ''} per dataset)")
    parts.append(_indent(text_table(EPSILON_COLUMNS, [
        [r.device_id, r.dataset, "budget spent" if r.spent is None else f"{r.spent:.3f}", "yes" if r.exhausted else ""]
        for r in rv.epsilon_rows(store, run)])))
    return "\n".join(parts)


def _record(obj: Any) -> Any:
    """Dataclasses as dicts, with derived fields and ISO timestamps beside the epoch seconds."""
    if dataclasses.is_dataclass(obj):
        out = {f.name: _record(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in ("duration_s", "distinguishable", "verdict"):
            if hasattr(type(obj), name):
                out[name] = getattr(obj, name)
        for key in [k for k in out if k.endswith("_at") or k in ("at", "last_seen", "first_seen")]:
            out[f"{key}_utc"] = fmt.iso_utc(out[key])
        return out
    if isinstance(obj, Mapping):
        return {str(k): _record(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_record(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def history_json(store: ResultsStore, run_id: int | None = None) -> str:
    """``cuvil results --json``: every run's summary, or one run with classes, A/B, failures and ε."""
    if run_id is None:
        return json.dumps({"runs": _record(rv.runs(store))}, indent=2)
    run = rv.run(store, run_id)
    detail = {"run": _record(run),
              "rounds": [{"round": r.summary.number, "kind": r.summary.kind, "classes": _record(r.classes)}
                         for r in rv.round_details(store, run)],
              "ab": _record(rv.ab_verdicts(store, run)), "failures": _record(rv.failures(store, run)),
              "epsilon": _record(rv.epsilon_rows(store, run)),
              "epsilon_budget": dict(zip(("epsilon", "device_default"), rv.epsilon_budget(run.config))),
              "latency_predicted_ms": rv.latency_predictions(store, run),
              "versions": as_records(VERSION_HEADERS, version_rows(store, run_id)),
              "rollouts": as_records(ROLLOUT_HEADERS, rollout_rows(store, run_id))}
    return json.dumps(detail, indent=2, allow_nan=False, default=str)


def write_html(store: ResultsStore, run_id: int, path: str | os.PathLike) -> Path:
    """One run as a self-contained page (a missing run is a StoreError), written whole or not at all: a full
    disk left a truncated report in place of the old one, and a FIFO named as the output blocked forever."""
    body = html_views.run_content(store, run_id)
    out = Path(path)
    with atomic_write(out) as f:
        f.write(html_views.document(f"Cuvil run {run_id}", body).encode("utf-8"))
    return out
