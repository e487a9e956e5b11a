"""Reports from the results store: a per-class table for terminals and a self-contained HTML page.

Plots are rendered with matplotlib into inline PNGs, so the HTML file needs nothing beside it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .aggregate import OVERALL, ClassAggregate, aggregate_round
from .store import ResultsStore

COLUMNS = ("class", "devices", "accuracy", "loss", "p50 ms", "p90 ms", "p99 ms", "compile ms", "cache hits",
           "arena KiB", "ε max", "failed", "timeout", "refused", "budget")


def _fmt(value: float | None, se: float | None = None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} ± {se:.{digits}f}" if se is not None else text


def class_rows(aggs: Mapping[str, ClassAggregate]) -> list[list[str]]:
    rows = []
    for name in sorted(aggs, key=lambda n: (n == OVERALL, n)):
        a = aggs[name]
        latency_note = "" if a.latency_devices or not a.emulated_devices else " (emulated)"
        rows.append([
            name, str(a.devices), _fmt(a.accuracy, a.accuracy_se), _fmt(a.loss, a.loss_se),
            _fmt(a.latency_p50_ms) + latency_note, _fmt(a.latency_p90_ms), _fmt(a.latency_p99_ms),
            _fmt(a.compile_ms_median, digits=1), str(a.cache_hits),
            "-" if a.arena_bytes_max is None else f"{a.arena_bytes_max / 1024:.0f}",
            _fmt(a.epsilon_spent_max, digits=2),
            *(str(a.failures.get(k, 0)) for k in ("failure", "timeout", "refused", "budget_exhausted")),
        ])
    return rows


def round_aggregates(store: ResultsStore, round_row: Mapping[str, Any]) -> dict[str, ClassAggregate]:
    classes = {d["device_id"]: d["profile"] for d in store.devices()}
    return aggregate_round(store.reports(round_row["id"]), store.failures(round_row["id"]), classes)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def epsilon_by_device(store: ResultsStore, run_id: int) -> dict[tuple[str, str], float]:
    """(device, dataset) -> the largest ε spent that the device reported in this run."""
    out: dict[tuple[str, str], float] = {}
    for rnd in store.rounds(run_id):
        for rep in store.reports(rnd["id"]):
            key = (rep["device_id"], rnd["dataset"])
            out[key] = max(out.get(key, 0.0), float(rep["metrics"]["dp_epsilon_spent"]))
    return out


def _epsilon_rows(store: ResultsStore, run_id: int) -> list[list[str]]:
    """Every device that reported (its ε) or refused for budget in this run (it sends no ε then)."""
    spent: dict[tuple[str, str], str] = {k: f"{v:.3f}" for k, v in epsilon_by_device(store, run_id).items()}
    exhausted = {d: store.exhausted_devices(d) for d in {r["dataset"] for r in store.rounds(run_id)}}
    for rnd in store.rounds(run_id):
        for f in store.failures(rnd["id"]):
            if f["kind"] == "budget_exhausted":
                spent.setdefault((f["device_id"], rnd["dataset"]), "budget spent")
    return [[dev, ds, eps, "yes" if dev in exhausted.get(ds, ()) else ""] for (dev, ds), eps in sorted(spent.items())]


EPSILON_COLUMNS = ("device", "dataset", "ε spent", "budget exhausted")


def history_text(store: ResultsStore, run_id: int | None = None) -> str:
    """What ``cuvil results`` prints: every run (or one) with its rounds and per-class tables."""
    runs = [r for r in store.runs() if run_id is None or r["id"] == run_id]
    if not runs:
        return "no runs recorded" if run_id is None else f"no run {run_id}"
    parts = []
    for run in runs:
        parts.append(f"run {run['id']}  status {run['status']}")
        for rnd in store.rounds(run["id"]):
            parts.append(f"  round {rnd['number']} [{rnd['kind']}] model {rnd['model']} "
                         f"bundle {rnd['bundle_hash'][:12]} dataset {rnd['dataset']} "
                         f"sampled {rnd['sampled']} bundle bytes sent {rnd['bundle_bytes_sent']}")
            if run_id is not None:
                table = text_table(COLUMNS, class_rows(round_aggregates(store, rnd)))
                parts.append("\n".join("    " + ln for ln in table.splitlines()))
        if run_id is not None:
            parts.append("  privacy: ε spent per device")
            table = text_table(EPSILON_COLUMNS, _epsilon_rows(store, run["id"]))
            parts.append("\n".join("    " + ln for ln in table.splitlines()))
    return "\n".join(parts)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _plots(store: ResultsStore, rounds: Sequence[Mapping[str, Any]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..edge_runtime.latency import BUCKET_EDGES_MS

    out = []
    per_round = [(r, round_aggregates(store, r)) for r in rounds]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for cls in sorted({c for _, aggs in per_round for c in aggs}):
        pts = [(r["number"], a[cls]) for r, a in per_round if cls in a and a[cls].accuracy is not None]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1].accuracy for p in pts], yerr=[p[1].accuracy_se for p in pts],
                        marker="o", capsize=3, label=cls)
    ax.set(xlabel="round", ylabel="accuracy (noisy estimate)", title="Accuracy per device class and round")
    ax.legend(fontsize=7)
    out.append(_png(fig))
    if per_round:
        last_round, _ = per_round[-1]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        by_class: dict[str, list[int]] = {}
        for rep in store.reports(last_round["id"]):
            if not rep["metrics"]["latency_emulated"]:
                hist = rep["metrics"]["latency_hist"]
                acc = by_class.setdefault(rep["profile"], [0] * len(hist))
                by_class[rep["profile"]] = [a + h for a, h in zip(acc, hist)]
        for cls, hist in sorted(by_class.items()):
            ax.step(BUCKET_EDGES_MS, hist, where="pre", label=cls)
        ax.set(xscale="log", xlabel="latency (ms, bucket upper edge)", ylabel="runs",
               title=f"Latency distribution per class, round {last_round['number']} (native devices)")
        if by_class:
            ax.legend(fontsize=7)
        out.append(_png(fig))
    return out


def write_html(store: ResultsStore, run_id: int, path: str | os.PathLike) -> Path:
    runs = [r for r in store.runs() if r["id"] == run_id]
    if not runs:
        from .store import StoreError

        raise StoreError(f"no run {run_id} in {store.path}")
    rounds = store.rounds(run_id)
    body = [f"<h1>Cuvil run {run_id}</h1>", f"<p>status {html.escape(runs[0]['status'])}; "
            f"config <code>{html.escape(runs[0]['config'])}</code></p>",
            "<p>Accuracy and loss are estimates from differentially private noisy sums (± one standard error "
            "of the noise). Latency is from natively measured devices only; emulated devices are excluded.</p>"]
    body += _plots(store, rounds)
    for rnd in rounds:
        body.append(f"<h2>Round {rnd['number']} — {html.escape(rnd['kind'])}, model {html.escape(rnd['model'])}</h2>")
        body.append(f"<p>bundle {rnd['bundle_hash'][:16]}, dataset {html.escape(rnd['dataset'])}, "
                    f"sampled {rnd['sampled']}, bundle bytes sent {rnd['bundle_bytes_sent']}</p>")
        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                       for row in class_rows(round_aggregates(store, rnd)))
        body.append(f"<table><tr>{head}</tr>{rows}</table>")
    body.append("<h2>Privacy: ε spent per device</h2>")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in EPSILON_COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in _epsilon_rows(store, run_id))
    body.append(f"<table><tr>{head}</tr>{rows}</table>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>Cuvil run {run_id}</title>" \
           f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
