"""HTML of the results: a run, the list of runs, the fleet inventory, a device's history.

Shared by the static report (``cuvil report``: one run, self-contained) and the live dashboard
(``cuvil dashboard``), so both show the same tables and charts. Every string from the database is
escaped here (device ids, CPU names and failure reasons come from devices and are untrusted: markup
is escaped, and controls and bidi overrides are shown as escapes, as on a terminal); only
:class:`Safe` fragments built in this module pass through unescaped.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote

from ..compiler.printable import printable
from . import figures
from . import formatting as fmt
from . import results_view as rv
from .aggregate import OVERALL, ClassAggregate
from .rollout_view import ROLLOUT_HEADERS, VERSION_HEADERS, rollout_rows, version_rows
from .store import ResultsStore


class Safe(str):
    """HTML built here from escaped parts: inserted as is."""


def esc(value: object) -> Safe:
    """HTML-escaped, with controls and bidi overrides shown as escapes (as on a terminal)."""
    return value if isinstance(value, Safe) else Safe(html.escape(printable(value), quote=True))


def link(href: str, text: object) -> Safe:
    return Safe(f'<a href="{html.escape(href, quote=True)}">{esc(text)}</a>')


def device_link(device_id: str, base: str | None) -> Safe:
    return esc(device_id) if base is None else link(f"{base}device/{quote(device_id, safe='')}", device_id)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], ident: str = "", caption: str = "") -> Safe:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' id="{ident}"' if ident else ""
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return Safe(f"<table{attr}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def status_badge(status: str) -> Safe:
    return Safe(f'<span class="status status-{esc(status)}">{esc(status)}</span>')


STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}caption{text-align:left;color:#555;padding:2px 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f0f0f0}
td.reason{max-width:40em;word-break:break-word}
.status{padding:1px 6px;border-radius:3px;font-size:.85em;color:#fff;background:#777}
.status-running{background:#1f77b4}.status-finished{background:#2ca02c}.status-aborted,.status-failed{background:#d62728}
.note{color:#555;font-size:.9em}.verdict-yes{font-weight:bold}figure{margin:1em 0}nav{margin-bottom:1em}
#live{float:right;font-size:.85em;color:#555}#live.stale{color:#d62728}
"""


def document(title: str, body: str, script: str | None = None, version: str = "") -> str:
    tag = f'<script src="{esc(script)}" defer></script>' if script else ""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<link rel='icon' href='data:,'><style>{STYLE}</style>{tag}</head>"
            f"<body data-version='{esc(version)}'>{body}</body></html>")


# a run ---------------------------------------------------------------------------------------------
def _class_rows(classes: Mapping[str, ClassAggregate], predicted: Mapping[str, float]) -> list[list[object]]:
    rows = []
    for name in sorted(classes, key=lambda n: (n == OVERALL, n)):
        a = classes[name]
        measured = a.latency_devices > 0
        rows.append([
            name, a.devices, fmt.estimate(a.accuracy, a.accuracy_se), fmt.estimate(a.loss, a.loss_se),
            fmt.histogram_ms(a.latency_p50_ms) if measured else ("emulated" if a.emulated_devices else "-"),
            fmt.histogram_ms(a.latency_p99_ms) if measured else "-",
            f"{fmt.duration_ms(predicted[name])} (predicted)" if name in predicted else "-",
            fmt.duration_ms(a.compile_ms_median), a.cache_hits,
            fmt.byte_count(a.arena_bytes_max), fmt.number(a.epsilon_spent_max),
            ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in sorted(a.failures.items())) or "-"])
    return rows


CLASS_HEADERS = ("class", "devices", "accuracy", "loss", "latency p50", "latency p99", "predicted p50",
                 "compile (median)", "cache hits", "arena (max)", "ε spent (max)", "failures")


def _config_table(config: Mapping[str, object]) -> Safe:
    rows = [[k, json.dumps(v) if isinstance(v, (dict, list)) else v] for k, v in sorted(config.items())]
    return table(("key", "value"), rows, "config", "run configuration")


def rounds_table(run: rv.RunSummary) -> Safe:
    rows = [[r.number, r.kind, r.model, fmt.timestamp(r.started_at),
             fmt.seconds(r.duration_s) if r.finished_at else "running", r.sampled, r.reports,
             ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in sorted(r.failures.items())) or "-",
             r.cache_hits, fmt.byte_count(r.bundle_bytes_sent)] for r in run.rounds]
    return table(("round", "kind", "model", "started", "duration", "sampled", "reports", "failures",
                  "cache hits", "bundle bytes sent"), rows, "rounds")


def ab_section(verdicts: Sequence[rv.AbVerdict]) -> Safe:
    if not verdicts:
        return Safe("")
    rows = [[v.device_class, v.round_number, v.devices, f"{v.a:.3f}", f"{v.b:.3f}", f"{v.diff:+.3f} ± {v.se:.3f}",
             Safe(f'<span class="verdict-{"yes" if v.distinguishable else "no"}">{esc(v.verdict)}</span>')]
            for v in verdicts]
    first = verdicts[0]
    note = (f"A = {first.model_a}, B = {first.model_b}, on the devices that reported both. B − A is "
            f"distinguishable from the noise when it exceeds {rv.Z_95} standard errors (95%).")
    return Safe(f"<h2>A/B verdict per class</h2><p class='note'>{esc(note)}</p>"
                + table(("class", "round", "devices", "A accuracy", "B accuracy", "B − A", "verdict"), rows,
                        "ab-verdict"))


def failures_section(failures: Sequence[rv.Failure], base: str | None) -> Safe:
    if not failures:
        return Safe("<h2>Failures</h2><p class='note'>none</p>")
    rows = "".join(f"<tr><td>{f.round_number} {esc(f.round_kind)}</td><td>{device_link(f.device_id, base)}</td>"
                   f"<td>{esc(f.device_class)}</td><td>{esc(f.kind.replace('_', ' '))}</td>"
                   f"<td class='reason'>{esc(f.reason)}</td></tr>" for f in failures)
    return Safe("<h2>Failures</h2><table id='failures'><thead><tr><th>round</th><th>device</th><th>class</th>"
                f"<th>kind</th><th>reason</th></tr></thead><tbody>{rows}</tbody></table>")


def epsilon_section(rows: Sequence[rv.EpsilonRow], budget: tuple[float, bool], base: str | None) -> Safe:
    label = f"{budget[0]:g}" + (" (the devices' default)" if budget[1] else " (asked by this run)")
    body = "".join(f"<tr><td>{device_link(r.device_id, base)}</td><td>{esc(r.dataset)}</td>"
                   f"<td>{esc('budget spent' if r.spent is None else f'{r.spent:.3f}')}</td>"
                   f"<td>{'yes' if r.exhausted else ''}</td></tr>" for r in rows)
    return Safe(f"<h2>Privacy: ε spent per device</h2><p class='note'>budget ε = {esc(label)} per dataset</p>"
                "<table id='epsilon'><thead><tr><th>device</th><th>dataset</th><th>ε spent</th>"
                f"<th>budget exhausted</th></tr></thead><tbody>{body}</tbody></table>")


def _latency_chart(store: ResultsStore, details: Sequence[rv.RoundDetail],
                   predictions: Mapping[str, Mapping[str, float]]) -> str:
    """The last evaluation round's measured latency per class, above the predictions for its model."""
    from ..edge_runtime.latency import BUCKET_EDGES_MS

    evals = [d for d in details if d.summary.kind == "eval"] or list(details)
    if not evals:
        return ""
    last = evals[-1].summary
    hists: dict[str, list[int]] = {}
    for rep in store.reports(last.round_id):
        if not rep["metrics"]["latency_emulated"]:
            acc = hists.setdefault(rep["profile"], [0] * len(BUCKET_EDGES_MS))
            hists[rep["profile"]] = [a + h for a, h in zip(acc, rep["metrics"]["latency_hist"])]
    return figures.latency_figure(hists, BUCKET_EDGES_MS, predictions.get(last.model, {}),
                                  f"Measured latency, round {last.number} ({last.model}, natively measured devices)")


def run_content(store: ResultsStore, run_id: int, base: str | None = None) -> Safe:
    """Everything about one run; ``base`` is the dashboard's URL root for links (None: no links)."""
    run = rv.run(store, run_id)
    details = rv.round_details(store, run)
    predictions = rv.latency_predictions(store, run)
    elapsed = fmt.seconds(run.duration_s) if run.finished_at else "still running"
    parts = [f"<h1>Cuvil run {run.run_id} {status_badge(run.status)}</h1>",
             f"<p>started {esc(fmt.timestamp(run.started_at))}, finished {esc(fmt.timestamp(run.finished_at))} "
             f"({esc(elapsed)}); models {esc(', '.join(run.models) or '-')}"
             + (f"; {esc(run.reason)}" if run.reason else "") + "</p>",
             "<p class='note'>Accuracy and loss are estimates from differentially private noisy sums "
             "(± one standard error of the noise; an estimate may fall outside its possible range). Latency "
             "is measured on natively running devices only; emulated devices get a <em>predicted</em> latency "
             "from a cost model of their compiled code, shown apart and labelled.</p>",
             "<h2>Rounds</h2>", rounds_table(run), ab_section(rv.ab_verdicts(store, run))]
    for title, headers, rows, ident in (
            ("Fine-tuned versions", VERSION_HEADERS, version_rows(store, run_id), "versions"),
            ("Rollout decisions", ROLLOUT_HEADERS, rollout_rows(store, run_id), "rollouts")):
        if rows:
            parts += [f"<h2>{title}</h2>", table(headers, rows, ident)]
    charts = [figures.estimates_figure(details) if details else "",
              _latency_chart(store, details, predictions),
              figures.compile_figure(details)]
    parts += ["<h2>Charts</h2>"] + [f"<figure class='chart'>{c}</figure>" for c in charts if c]
    for d in details:
        r = d.summary
        parts.append(table(CLASS_HEADERS, _class_rows(d.classes, predictions.get(r.model, {})), f"round-{r.round_id}",
                           f"round {r.number} [{r.kind}] {r.model}, dataset {r.dataset}"))
    parts += [failures_section(rv.failures(store, run), base),
              epsilon_section(rv.epsilon_rows(store, run), rv.epsilon_budget(run.config), base),
              "<h2>Configuration</h2>", _config_table(run.config)]
    return Safe("".join(parts))


# the fleet -----------------------------------------------------------------------------------------
def runs_table(runs: Sequence[rv.RunSummary], base: str) -> Safe:
    body = "".join(
        f"<tr><td>{link(f'{base}run/{r.run_id}', f'run {r.run_id}')}</td><td>{status_badge(r.status)}</td>"
        f"<td>{esc(fmt.timestamp(r.started_at))}</td>"
        f"<td>{esc(fmt.seconds(r.duration_s) if r.finished_at else 'running')}</td><td>{len(r.rounds)}</td>"
        f"<td>{esc(', '.join(r.models) or '-')}</td><td>{sum(x.reports for x in r.rounds)}</td>"
        f"<td>{sum(x.failed for x in r.rounds)}</td></tr>" for r in reversed(runs))
    return Safe("<table id='runs'><thead><tr><th>run</th><th>status</th><th>started</th><th>duration</th>"
                "<th>rounds</th><th>models</th><th>reports</th><th>failures</th></tr></thead>"
                f"<tbody>{body}</tbody></table>")


def inventory_table(rows: Sequence[rv.InventoryRow], base: str | None, budget: float) -> Safe:
    def eps(r: rv.InventoryRow) -> str:
        if r.budget_exhausted:
            return f"budget spent (of {budget:g})"
        return "-" if r.epsilon_spent is None else f"{r.epsilon_spent:.2f} of {budget:g}"

    body = "".join(
        f"<tr><td>{device_link(r.device_id, base)}</td><td>{esc(r.device_class)}</td><td>{esc(r.cpu)}</td>"
        f"<td>{esc(r.isa)}</td><td>{esc(r.threads or '-')}</td><td>{esc(r.runtime_version)}</td>"
        f"<td>{'emulated' if r.emulated else 'native'}</td><td>{esc(', '.join(r.bundles_held) or '-')}</td>"
        f"<td>{esc(fmt.timestamp(r.last_seen))}</td><td>{esc(eps(r))}</td></tr>" for r in rows)
    return Safe("<table id='inventory'><thead><tr><th>device</th><th>class</th><th>CPU</th><th>ISA</th>"
                "<th>threads</th><th>runtime</th><th>runs as</th><th>bundles held</th><th>last seen</th>"
                f"<th>ε spent (default budget)</th></tr></thead><tbody>{body}</tbody></table>")


def overview_content(store: ResultsStore, base: str) -> Safe:
    runs = rv.runs(store)
    budget, _ = rv.epsilon_budget({})
    return Safe(f"<h1>Cuvil fleet</h1><h2>Runs</h2>{runs_table(runs, base) if runs else '<p>no runs yet</p>'}"
                f"<h2>Fleet inventory</h2>{inventory_table(rv.inventory(store), base, budget)}"
                "<p class='note'>Bundles held: what the device listed at its last inventory, by model (the models "
                "it reported on, where it listed none). ε spent: the most recent total the device reported for "
                "its dataset.</p>")


def device_content(store: ResultsStore, device_id: str, base: str) -> Safe:
    events = rv.device_history(store, device_id)
    row = next(r for r in rv.inventory(store) if r.device_id == device_id)
    budget, _ = rv.epsilon_budget({})
    body = "".join(
        f"<tr><td>{link(f'{base}run/{e.run_id}', f'run {e.run_id}')}</td><td>{e.round_number} {esc(e.round_kind)}</td>"
        f"<td>{esc(e.model)}</td><td>{esc(fmt.timestamp(e.at))}</td><td>{esc(e.outcome.replace('_', ' '))}</td>"
        f"<td>{esc('emulated' if e.latency_emulated else fmt.duration_ms(e.latency_p50_ms))}</td>"
        f"<td>{esc(fmt.duration_ms(e.compile_ms))}</td>"
        f"<td>{esc('-' if e.cache_hit is None else 'hit' if e.cache_hit else 'miss')}</td>"
        f"<td>{esc(fmt.number(e.epsilon_spent))}</td><td class='reason'>{esc(e.reason)}</td></tr>" for e in events)
    return Safe(f"<h1>Device {esc(device_id)}</h1>{inventory_table([row], None, budget)}<h2>History</h2>"
                "<table id='history'><thead><tr><th>run</th><th>round</th><th>model</th><th>at</th><th>outcome</th>"
                "<th>latency p50</th><th>compile</th><th>compile cache</th><th>ε spent after</th><th>reason</th>"
                f"</tr></thead><tbody>{body}</tbody></table>")
